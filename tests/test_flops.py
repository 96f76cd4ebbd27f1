"""MFU is true or unknown, never a guess."""

from engine.config import ModelConfig
from engine.flops import flops_per_token, mfu, peak_flops


def test_flops_per_token_formula():
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    assert flops_per_token(cfg, 124_439_808, 1024) == 6 * 124_439_808 + 12 * 12 * 12 * 64 * 1024


def test_peak_table_knows_real_devices_and_not_others():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "tf32") == 156e12
    assert peak_flops("NVIDIA H200", "bf16") == 989e12
    assert peak_flops("NVIDIA GeForce RTX 4090", "bf16") == 165.2e12
    assert peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("NVIDIA L40S", "bf16") == 362e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 there
    assert peak_flops("Some Future GPU", "bf16") is None
    assert mfu(1000.0, 10**9, None) is None
    assert abs(mfu(500_000.0, 10**9, 1e15) - 0.5) < 1e-12
