"""The model's switches change speed and memory, never the function it computes."""

import torch

from engine.config import ModelConfig
from engine.model import GPT


def _cfg(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=101, dropout=0.0)
    return ModelConfig(**(base | kw))


def _batch(vocab=101, B=3, T=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (B, T), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _twin(cfg_a: ModelConfig, cfg_b: ModelConfig) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    a = GPT(cfg_a)
    b = GPT(cfg_b)
    b.load_state_dict(a.state_dict())
    return a, b


def test_flash_and_manual_attention_agree():
    a, b = _twin(_cfg(attention="flash"), _cfg(attention="manual"))
    x, y = _batch()
    la, lb = a(x, y)[1], b(x, y)[1]
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
    la.backward()
    lb.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_gradient_checkpointing_gives_the_same_gradients():
    a, b = _twin(_cfg(), _cfg(grad_checkpointing=True))
    x, y = _batch()
    la, lb = a(x, y)[1], b(x, y)[1]
    assert torch.equal(la, lb)
    la.backward()
    lb.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_gradient_checkpointing_with_dropout_replays_the_same_masks():
    a, b = _twin(_cfg(dropout=0.2), _cfg(dropout=0.2, grad_checkpointing=True))
    x, y = _batch()
    torch.manual_seed(5)
    la = a(x, y)[1]
    la.backward()
    torch.manual_seed(5)
    lb = b(x, y)[1]
    lb.backward()
    assert torch.equal(la, lb)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_vocab_padding_pads_to_64_and_leaves_the_loss_unchanged():
    padded, plain = _cfg(pad_vocab=True), _cfg(pad_vocab=False)
    assert padded.padded_vocab_size == 128 and plain.padded_vocab_size == 101
    assert ModelConfig(vocab_size=50257).padded_vocab_size == 50304
    torch.manual_seed(0)
    a = GPT(plain)
    b = GPT(padded)
    sd = a.state_dict()
    sd_b = b.state_dict()
    for k, v in sd.items():  # copy the real rows; padded rows keep random (nonzero) values
        if v.shape != sd_b[k].shape:
            sd_b[k][: v.shape[0]] = v
        else:
            sd_b[k] = v
    b.load_state_dict(sd_b)
    x, y = _batch()
    logits_a, la = a(x, y)
    logits_b, lb = b(x, y)
    assert logits_b.shape[-1] == 101  # padded columns never leave the model
    torch.testing.assert_close(la, lb)
    lb.backward()
    assert b.transformer.wte.weight.grad[101:].abs().sum() == 0  # padding gets no gradient


def test_padded_ids_are_never_sampled():
    torch.manual_seed(0)
    m = GPT(_cfg(vocab_size=70)).eval()  # padded to 128
    with torch.no_grad():
        m.lm_head.weight[70:] = 100.0  # padding rows would win every softmax if they were there
    out = m.generate(torch.zeros(4, 1, dtype=torch.long), 40, temperature=1.0, top_k=None)
    assert out.max() < 70


def test_bf16_autocast_loss_is_close_to_fp32():
    torch.manual_seed(0)
    m = GPT(_cfg())
    x, y = _batch()
    l32 = m(x, y)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        l16 = m(x, y)[1]
    assert l16.dtype == torch.float32  # the cross-entropy runs in fp32 either way
    assert abs(l16.item() - l32.item()) < 0.02 * l32.item()


def test_bias_switch_and_tied_embeddings():
    m = GPT(_cfg(bias=False))
    assert m.lm_head.weight is m.transformer.wte.weight
    assert not any(n.endswith(".bias") for n, _ in m.named_parameters())
    assert m.num_params() == sum(p.numel() for p in set(m.parameters()))


def test_residual_projections_use_scaled_init():
    torch.manual_seed(0)
    m = GPT(_cfg(n_layer=8, n_embd=256, n_head=4))
    std_proj = m.transformer.h[0].mlp.c_proj.weight.std().item()
    std_fc = m.transformer.h[0].mlp.c_fc.weight.std().item()
    assert abs(std_fc - 0.02) < 0.002
    assert abs(std_proj - 0.02 / 4) < 0.001  # 0.02 / sqrt(2 * 8)
