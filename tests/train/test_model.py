"""The model's switches change speed and memory, never the function it computes."""

import math

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.train.model import GPT


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


def _padded_twin() -> tuple[GPT, GPT]:
    """(unpadded model, padded model with the same real rows; padded rows keep their init)."""
    torch.manual_seed(0)
    a = GPT(_cfg(pad_vocab=False))
    b = GPT(_cfg(pad_vocab=True))
    sd_b = b.state_dict()
    for k, v in a.state_dict().items():
        if v.shape != sd_b[k].shape:
            sd_b[k][: v.shape[0]] = v
        else:
            sd_b[k] = v
    b.load_state_dict(sd_b)
    return a, b


def _hidden(m: GPT, x: torch.Tensor) -> torch.Tensor:
    """ln_f's output at every position: what the lm_head sees."""
    seen = []
    handle = m.transformer.ln_f.register_forward_hook(lambda mod, i, o: seen.append(o.detach()))
    m(x, x)
    handle.remove()
    return seen[0]


def test_vocab_padding_pads_to_64_and_the_loss_normalizer_is_the_only_difference():
    """The loss runs on the padded logits (no slice, no copy): padded ids are never targets,
    so the only difference from the real-vocab loss is the normalizer, which also sums the
    padded columns: loss_padded - loss_real = mean over rows of (lse(all Vp) - lse(real V)).
    At init the logits are near-uniform, so that is about log(Vp / V) = log(128/101) = 0.237."""
    assert _cfg(pad_vocab=True).padded_vocab_size == 128 and _cfg(pad_vocab=False).padded_vocab_size == 101
    assert ModelConfig(vocab_size=50257).padded_vocab_size == 50304
    a, b = _padded_twin()
    x, y = _batch()
    logits_a, la = a(x, y, return_logits=True)
    logits_b, lb = b(x, y, return_logits=True)
    assert logits_b.shape[-1] == 128 and logits_a.shape[-1] == 101  # training: the padded logits as they come
    torch.testing.assert_close(logits_b[..., :101], logits_a, rtol=1e-5, atol=1e-6)
    full = _hidden(b, x) @ b.lm_head.weight.detach().T
    expected = (full.logsumexp(-1) - full[..., :101].logsumexp(-1)).mean()
    torch.testing.assert_close(lb - la, expected, rtol=1e-4, atol=1e-5)
    assert 0 < (lb - la).item() and abs((lb - la).item() - math.log(128 / 101)) < 0.05
    # the old sliced path gave exactly the unpadded model's loss
    torch.testing.assert_close(F.cross_entropy(logits_b[..., :101].reshape(-1, 101), y.view(-1)), la)
    lb.backward()
    assert b.transformer.wte.weight.grad[101:].abs().sum() > 0  # the softmax pushes the padding down


def test_training_on_padded_logits_drives_the_padded_logits_down():
    """Twenty SGD steps on the padded loss: the padded columns' logits fall relative to the
    real ones, and the real-vocab loss (what sampling sees) falls too."""
    _, m = _padded_twin()
    x, y = _batch()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with torch.no_grad():
        before = _hidden(m, x) @ m.lm_head.weight.T
    for _ in range(20):
        opt.zero_grad()
        m(x, y)[1].backward()
        opt.step()
    with torch.no_grad():
        after = _hidden(m, x) @ m.lm_head.weight.T

    def real_loss(z):
        return F.cross_entropy(z[..., :101].reshape(-1, 101), y.view(-1))

    def gap(z):
        return (z[..., 101:].mean() - z[..., :101].mean()).item()

    assert gap(after) < gap(before) - 0.5, (gap(before), gap(after))
    assert real_loss(after) < real_loss(before)


def test_padded_ids_are_never_predicted_nor_sampled():
    """Padded rows of the tied weight made to dominate every softmax: the training logits
    show the padding would win, yet inference logits stop at the real vocab and no sampled
    id is padded, at any temperature or top-k."""
    torch.manual_seed(0)
    m = GPT(_cfg(vocab_size=70)).eval()  # padded to 128
    with torch.no_grad():
        m.transformer.ln_f.weight.zero_()
        m.transformer.ln_f.bias.fill_(1.0)  # every hidden state = ones
        m.lm_head.weight[70:] = 100.0  # padded logits 100 * 64; real ones ~ N(0, 0.16)
    x = torch.zeros(4, 8, dtype=torch.long)
    with torch.no_grad():
        full, _ = m(x, x)
        assert (full.argmax(-1) >= 70).all()  # the forcing works: padding would win
        last, _ = m(x)
    assert last.shape[-1] == 70 and last.argmax(-1).max() < 70
    g = torch.Generator().manual_seed(0)
    for temperature, top_k in [(1.0, None), (5.0, None), (1e-3, 1), (2.0, 200)]:
        out = m.generate(torch.zeros(4, 1, dtype=torch.long), 20, temperature, top_k, generator=g)
        assert out.max() < 70, (temperature, top_k)


def test_chunked_loss_gives_the_plain_loss_and_gradients():
    """loss = "chunked" (lm_head + CE over row chunks) vs "plain", same weights, fp32:
    loss within rtol 1e-5 / atol 1e-6, every parameter gradient (tied wte included) within
    rtol 1e-4 / atol 1e-6; no logits are returned in training."""
    a, b = _twin(_cfg(), _cfg(loss="chunked"))
    x, y = _batch()
    logits, la = a(x, y, return_logits=True)
    none, lb = b(x, y, return_logits=True)
    assert logits is not None and none is None
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-6)
    la.backward()
    lb.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # eval: the chunked loss under no_grad; generation unchanged
        torch.testing.assert_close(b(x, y)[1], a(x, y)[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b(x)[0], a(x)[0])


def test_chunked_loss_under_bf16_autocast_is_close_to_plain():
    a, b = _twin(_cfg(), _cfg(loss="chunked"))
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        la, lb = a(x, y)[1], b(x, y)[1]
    assert la.dtype == lb.dtype == torch.float32
    torch.testing.assert_close(lb, la, rtol=1e-2, atol=1e-2)


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


def test_training_forward_returns_no_logits_to_hold_through_backward():
    """In training the (B, T, V) logits are the largest tensor of the step (1.6 GiB for gpt2 at
    B16 T1024 in bf16): returned, the caller's `_, loss = model(x, y)` kept them alive through
    backward. In eval mode they come back (comparisons, export checks)."""
    from engine.config import resolve
    from engine.train.model import GPT

    model = GPT(resolve("micro", None, {"model.vocab_size": 64}).model)
    x = torch.randint(0, 64, (2, 16))
    logits, loss = model.train()(x, x)
    assert logits is None and loss is not None
    logits, _ = model.eval()(x, x)
    assert logits is not None and logits.shape[:2] == (2, 16)
