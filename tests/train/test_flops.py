"""MFU is true or unknown, never a guess."""

from engine.config import ModelConfig
from engine.train.flops import flops_per_token, mfu, peak_flops


def test_flops_per_token_formula():
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    assert flops_per_token(cfg, 124_439_808, 1024) == 6 * 124_439_808 + 12 * 12 * 12 * 64 * 1024


def test_mfu_matches_the_published_h100_anchor():
    """design.md: GPT-2 124M at T=1024 on an H100 SXM (989 TFLOP/s bf16 dense): 45% MFU is
    about 520K tok/s. Our table and formula must give that, whatever the table holds."""
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    per_token = flops_per_token(cfg, cfg.n_params(), 1024)
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak is not None
    assert abs(mfu(520_000.0, per_token, peak) - 0.45) < 0.01
    a100 = peak_flops("NVIDIA A100-SXM4-40GB", "bf16")
    assert a100 is not None and abs(a100 / 312e12 - 1) < 0.01  # design.md: A100 312 TFLOP/s


def test_unknown_devices_and_precisions_are_unknown_not_guessed():
    assert peak_flops("Some Future GPU", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 there
    assert peak_flops("NVIDIA H100 PCIe", "bf16") != peak_flops("NVIDIA H100 80GB HBM3", "bf16")  # two parts
    assert mfu(1000.0, 10**9, None) is None


def test_peak_table_knows_h800_a10_and_a10g_apart_from_their_neighbours():
    """NVIDIA's datasheets (H800 = H100's figures; A10) and the A10G's published spec: dense peaks."""
    T = 1e12
    assert peak_flops("NVIDIA H800", "bf16") == 989 * T and peak_flops("NVIDIA H800", "tf32") == 494 * T
    assert peak_flops("NVIDIA H800 PCIe", "bf16") == 756 * T
    assert peak_flops("NVIDIA A10", "bf16") == 125 * T and peak_flops("NVIDIA A10", "tf32") == 62.5 * T
    assert peak_flops("NVIDIA A10", "fp32") == 31.2 * T
    assert peak_flops("NVIDIA A10G", "fp16") == 70 * T and peak_flops("NVIDIA A10G", "tf32") == 35 * T
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312 * T  # A10's pattern leaves the A100 alone
