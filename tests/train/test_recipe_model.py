"""Issue 40's model-side recipe switches (engine/train/model.py), each on the real model: it changes
what it claims (a parameter, a norm, a mask, a bound), a run with all of them resumes bit-exact and
samples, FLOPs count what is multiplied, and GPT-2's doors (export --hf, --init-from) refuse them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from engine.config import ModelConfig
from engine.cli import as_flags
from engine.prep import hf
from engine.train.flops import flops_per_token
from engine.train.model import GPT, rotary
from harness import MICRO, cli_fails, losses, model_switches, stopped_at, trained

V = 61  # padded to 64
ALL = {k.split(".")[1]: v for k, v in model_switches().items()}  # every recipe switch the config declares, on
ONE_EACH = [{k: v} for k, v in ALL.items()]


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(**(dict(n_layer=4, n_head=2, n_embd=32, block_size=32, vocab_size=V) | kw))


def _ids(B: int = 2, T: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def _logits(model: GPT, x: torch.Tensor) -> torch.Tensor:
    return model(x, x, return_logits=True)[0]


def test_each_switch_has_the_parameters_it_claims_and_the_closed_form_counts_them():
    for kw in [{}, *ONE_EACH, ALL]:
        cfg = _cfg(**kw)
        model = GPT(cfg)
        assert model.num_params() == cfg.n_params(), kw
    base, C, Vp = GPT(_cfg()), 32, 64
    keys = lambda m: set(m.state_dict())  # noqa: E731
    rotary_model = GPT(_cfg(positions="rotary"))
    assert "transformer.wpe.weight" in keys(base) and "transformer.wpe.weight" not in keys(rotary_model)
    assert base.num_params() - rotary_model.num_params() == 32 * C
    untied = GPT(_cfg(tie_head=False))
    assert base.lm_head.weight is base.transformer.wte.weight
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()
    assert untied.num_params() - base.num_params() == Vp * C
    ve = GPT(_cfg(value_embeds=True))
    assert ve.state_dict()["transformer.ve.weight"].shape == (Vp, C)
    assert [b.attn.ve_gate is not None for b in ve.transformer.h] == [True, False, False, True]  # first and last
    assert GPT(_cfg(unet_skips=True)).skip_weights.shape == (2,)
    vres = GPT(_cfg(value_residual=True))
    assert [b.attn.v_mix is not None for b in vres.transformer.h] == [False, True, True, True]


@pytest.mark.parametrize("switch,neutral", [("value_embeds", ("ve_gate", 0.0)), ("value_residual", ("v_mix", 1.0)),
                                            ("unet_skips", ("skip_weights", 0.0))], ids=str)  # fmt: skip
def test_a_learned_mix_at_its_neutral_value_is_the_plain_model(switch: str, neutral: tuple[str, float]):
    """The switch acts only through its learned scalars: at the value that turns it off the logits
    are GPT-2's to the bit; at its initial value they are not."""
    torch.manual_seed(0)
    plain = GPT(_cfg())
    model = GPT(_cfg(**{switch: True}))
    missing = model.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing and all(neutral[0] in k or k == "transformer.ve.weight" for k in missing)
    x = _ids()
    with torch.no_grad():
        assert not torch.equal(_logits(model, x), _logits(plain, x))
        for name, p in model.named_parameters():
            if neutral[0] in name:
                p.fill_(neutral[1])
        torch.testing.assert_close(_logits(model, x), _logits(plain, x), rtol=0, atol=0)


def test_relu2_feeds_the_projection_squared_relus():
    inputs: list[torch.Tensor] = []
    for mlp in ("gelu", "relu2"):
        model = GPT(_cfg(mlp=mlp))
        block = model.transformer.h[0].mlp
        hook = block.c_proj.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach()))
        fc = block.c_fc.register_forward_hook(lambda m, args, out: inputs.append(out.detach()))
        model(_ids(), _ids())
        hook.remove(), fc.remove()
    gelu_in, (relu_fc, relu_in) = inputs[1], inputs[-2:]
    assert gelu_in.min() < 0  # GELU lets negatives through
    assert relu_in.min() >= 0 and torch.equal(relu_in, F.relu(relu_fc).square())


class _SdpaInputs(TorchFunctionMode):
    """Records q and k as attention receives them (the real call runs unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.qk: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.qk.append((args[0].detach(), args[1].detach()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_qk_norm_gives_attention_unit_rms_q_and_k_per_head(positions: str):
    """Rotary rotates pairs after the norm: norms are kept, so the RMS is still 1."""
    for qk_norm in (False, True):
        seen = _SdpaInputs()
        with seen:
            GPT(_cfg(qk_norm=qk_norm, positions=positions))(_ids(), _ids())
        assert len(seen.qk) == 4
        rms = torch.stack([t.pow(2).mean(-1).sqrt() for qk in seen.qk for t in qk])  # (8, B, H, T): per head
        unit = torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
        assert unit == qk_norm, rms.mean()


def test_rotary_scores_depend_on_the_offset_only_and_positions_matter_without_a_table():
    model = GPT(_cfg(positions="rotary"))
    cos, sin = model.rope(16, torch.device("cpu"))
    q, k = torch.randn(16), torch.randn(16)
    at = lambda t, pos: rotary(t.expand(1, 16, 1, 16).clone(), (cos, sin))[0, pos, 0]  # noqa: E731
    torch.testing.assert_close(at(q, 5) @ at(k, 3), at(q, 12) @ at(k, 10))  # both 2 apart
    assert not torch.allclose(at(q, 5) @ at(k, 3), at(q, 5) @ at(k, 1))
    x = _ids(1)
    swapped = x.clone()
    swapped[0, [3, 7]] = x[0, [7, 3]]
    with torch.no_grad():  # no position table, yet the order of the context changes the last logits
        assert not torch.allclose(_logits(model, x)[0, -1], _logits(model, swapped)[0, -1])


def test_zero_init_proj_starts_the_projections_and_an_untied_head_at_zero():
    model = GPT(_cfg(zero_init_proj=True, tie_head=False))
    projections = [m.c_proj.weight for b in model.transformer.h for m in (b.attn, b.mlp)]
    assert all(not w.any() for w in projections) and not model.lm_head.weight.any()
    assert model.transformer.wte.weight.std() > 0.01 and model.transformer.h[0].attn.c_attn.weight.any()
    _, loss = model(_ids(), _ids())
    assert loss.item() == pytest.approx(math.log(64), abs=1e-6)  # uniform over the padded vocab
    tied = GPT(_cfg(zero_init_proj=True))
    assert tied.lm_head.weight.std() > 0.01  # the tied head is wte, never zeroed
    assert GPT(_cfg()).transformer.h[0].mlp.c_proj.weight.any()


@pytest.mark.parametrize("loss", ["plain", "chunked"])
def test_logit_softcap_bounds_the_logits_and_both_losses_agree(loss: str):
    torch.manual_seed(0)
    capped, raw = GPT(_cfg(logit_softcap=5.0)), GPT(_cfg())
    with torch.no_grad():
        capped.transformer.wte.weight.mul_(30)  # logits far beyond the cap
    raw.load_state_dict(capped.state_dict())
    x = _ids()
    with torch.no_grad():
        assert _logits(raw, x).abs().max() > 20
        z = _logits(capped, x)
        assert z.abs().max() < 5 and torch.allclose(z, 5 * torch.tanh(_logits(raw, x) / 5))
        assert capped.eval()(x)[0].abs().max() < 5  # generation's logits too
    capped.train()
    chunked = GPT(_cfg(logit_softcap=5.0, loss=loss))
    chunked.load_state_dict(capped.state_dict())
    a, b = capped(x, x)[1], chunked(x, x)[1]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    a.backward(), b.backward()
    for (name, pa), pb in zip(capped.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("attention", ["flash", "manual"])
def test_attn_window_hides_every_token_farther_back_than_the_window(attention: str):
    """One layer, window 4: position 20 sees 16..20. A change at 15 leaves its output alone, one at 16
    does not; flash (SDPA with the banded mask) and manual agree."""
    torch.manual_seed(0)
    model = GPT(_cfg(n_layer=1, attn_window=4, attention=attention)).eval()
    x = _ids(1)
    with torch.no_grad():
        base = _logits(model, x)[0, 20]
        for pos, seen in ((15, False), (16, True), (10, False)):
            y = x.clone()
            y[0, pos] = (x[0, pos] + 1) % V
            assert torch.equal(_logits(model, y)[0, 20], base) != seen, pos
        whole = GPT(_cfg(n_layer=1, attention=attention)).eval()
        whole.load_state_dict(model.state_dict())
        y = x.clone()
        y[0, 15] = (x[0, 15] + 1) % V
        assert not torch.equal(_logits(whole, y)[0, 20], _logits(whole, x)[0, 20])  # no window: it sees 15
        other = GPT(_cfg(n_layer=1, attn_window=4, attention="manual" if attention == "flash" else "flash")).eval()
        other.load_state_dict(model.state_dict())
        torch.testing.assert_close(_logits(other, x), _logits(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_run_with_every_switch_resumes_bit_exact_and_samples(tmp_path, tiny_dataset, capsys):
    """Stop at step 4, resume to 8 == 8 straight; then the run samples and refuses GPT-2's export."""
    from engine.inspect.sample import load_model

    common = {f"model.{k}": v for k, v in ALL.items()} | {"train.max_steps": 8, "train.eval_interval": 4,
                                                          "train.ckpt_interval": 100, "model.dropout": 0.1}  # fmt: skip
    straight = trained(tmp_path / "straight", tiny_dataset, **common)
    stopped_at(tmp_path / "split", tiny_dataset, 4, **common)
    both = trained(tmp_path / "split", resume=True)
    assert len(losses(both)) == 8 and losses(both) == losses(straight)
    val = lambda evs: [(e.step, e.val_loss) for e in evs if e.event == "eval"]  # noqa: E731
    assert val(both) == val(straight)
    loaded = load_model(tmp_path / "split")
    assert loaded.config.model.value_embeds and "transformer.wpe.weight" not in loaded.model.state_dict()
    out = loaded.model.generate(_ids(1, 4) % 64, 40, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 44) and int(out.max()) < 64  # past the 32-token context: the window slides
    cli_fails(capsys, ["export", str(tmp_path / "split"), "--hf", str(tmp_path / "hf")],
              "no transformers GPT-2 equivalent", "--mlp relu2", "recipe switch")  # fmt: skip
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kw", ONE_EACH, ids=lambda kw: next(iter(kw)))
def test_sampling_works_with_each_switch(kw):
    """A few AdamW steps, then generation past the context (the window slides) over the real vocab."""
    torch.manual_seed(0)
    model = GPT(_cfg(**kw))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        x = _ids(seed=step)
        model(x, torch.roll(x, -1, 1))[1].backward()
        opt.step(), opt.zero_grad()
    model.eval()
    out = model.generate(_ids(1, 3), 40, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 43) and int(out.max()) < V


def _counted_against_the_model(cfg: ModelConfig) -> GPT:
    """The model `cfg` builds (on the meta device: shapes, no memory), with what the closed-form
    parameter count, the estimator and the FLOP count say of it checked against what it holds."""
    from engine.config import resolve
    from engine.train import memory

    with torch.device("meta"):
        model = GPT(cfg)
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == cfg.n_params()
    run = resolve(None, None, {f"model.{k}": v for k, v in cfg.model_dump(exclude={"init_from"}).items()}
                  | {"speed.device": "cpu"})  # fmt: skip
    shape = memory._shape(run)
    assert memory._param_tensors(shape) == len(params)
    built_in = {id(p) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm))
                for p in m.parameters()}  # fmt: skip
    scalars = sum(p.numel() for p in params if id(p) not in built_in and p.dim() == 1)  # the recipe's mixes
    assert memory._n_scalars(shape) == scalars
    head = model.lm_head.weight
    wpe = model.transformer["wpe"].weight if "wpe" in model.transformer else None  # in GPT-2's 6N
    lookups = sum(m.weight.numel() for m in model.modules()
                  if isinstance(m, torch.nn.Embedding) and m.weight is not head and m.weight is not wpe)  # fmt: skip
    T, D = cfg.block_size, cfg.n_embd // cfg.n_head
    keys = T if cfg.attn_window is None else min(T, cfg.attn_window + 1)
    assert flops_per_token(cfg, cfg.n_params(), T) == 6 * (cfg.n_params() - lookups) + 12 * cfg.n_layer * cfg.n_head * D * keys
    return model


@pytest.mark.parametrize("n_layer", [1, 2, 3, 4])
@pytest.mark.parametrize("kw", [{}, *ONE_EACH, ALL], ids=str)
def test_the_counts_and_the_estimator_see_every_switch_the_config_declares(kw, n_layer):
    """For every recipe switch ModelConfig declares (the table is read from it) at even and odd
    depths: the parameter count, the estimator's tensors and scalars and the FLOP count's lookup
    tables are the model's own. A switch one of them forgot fails here."""
    _counted_against_the_model(_cfg(n_layer=n_layer, **kw))


def test_a_switch_declared_once_is_seen_by_the_model_the_counts_the_estimator_and_the_tables(monkeypatch):
    """Planted: value embeddings on every layer (later modded-nanogpt records spread them) changed in
    their one declaration, ModelConfig.value_embed_layers. The model builds a gate in every layer and
    the counts, the estimator's saved activations and the switch tables follow, with no other edit."""
    from pydantic import Field, create_model

    from bench.memory_measure import measure_saved
    from engine.config import RECIPE, resolve
    from engine.train.memory import estimate

    everywhere = property(lambda self: frozenset(range(self.n_layer)) if self.value_embeds else frozenset())
    monkeypatch.setattr(ModelConfig, "value_embed_layers", everywhere)
    model = _counted_against_the_model(_cfg(value_embeds=True))
    assert [b.attn.ve_gate is not None for b in model.transformer.h] == [True] * 4
    run = resolve(None, None, {"model.n_layer": 3, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
                               "model.vocab_size": V, "model.value_embeds": True, "speed.device": "cpu",
                               "speed.precision": "fp32", "train.batch_size": 2})  # fmt: skip
    est, saved = estimate(run), measure_saved(run)
    assert abs(est.activation_bytes / saved.activations - 1) <= 0.10, (est.activation_bytes, saved.activations)
    planted = create_model("Planted", __base__=ModelConfig, value_embeds_everywhere=(bool, Field(False, json_schema_extra={"form": RECIPE})))
    assert model_switches(planted) == model_switches() | {"model.value_embeds_everywhere": True}  # in every table


def test_flops_count_the_matrices_a_token_meets():
    """An untied head is the matmul the tied wte stood for, a value-embed table a lookup: neither adds
    FLOPs; a window scores window + 1 keys a query (tests/train/test_flops.py's formula otherwise)."""
    base = _cfg()
    plain = flops_per_token(base, base.n_params(), 32)
    assert plain == 6 * base.n_params() + 12 * 4 * 2 * 16 * 32
    for kw in ({"tie_head": False}, {"value_embeds": True}, {"tie_head": False, "value_embeds": True}):
        cfg = _cfg(**kw)  # only lookups added (value_embeds adds its gates' 2 scalars: 12 FLOPs)
        assert cfg.n_params() > base.n_params() and flops_per_token(cfg, cfg.n_params(), 32) == plain + 6 * cfg.learned_scalars
    windowed = _cfg(attn_window=7)
    assert flops_per_token(windowed, windowed.n_params(), 32) == 6 * base.n_params() + 12 * 4 * 2 * 16 * 8
    assert flops_per_token(windowed, windowed.n_params(), 6) == flops_per_token(base, base.n_params(), 6)


# each switch export refuses (all but zero_init_proj, which is only where training starts), as flags
FLAGS = [as_flags({f"model.{k}": v}) for k, v in ALL.items() if hf.export_problem(_cfg(**{k: v}))]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: f[0])
def test_init_from_gpt2_refuses_each_switch_gpt2_cannot_compute(tmp_path, capsys, flags):
    """Before any download (no network here): one line naming the switch, nothing written."""
    out = tmp_path / "run"
    err = cli_fails(capsys, ["train", *MICRO, "--init-from", "gpt2", *flags, "--out", str(out)],
                    "--init-from gpt2", " ".join(flags), "recipe switch")  # fmt: skip
    assert ("drop " + flags[0]) in err or "pass --" in err
    assert not out.exists()


def test_export_refuses_each_switch_and_keeps_the_init_only_one():
    for kw in ONE_EACH:
        problem = hf.export_problem(_cfg(**kw))
        if kw == {"zero_init_proj": True}:
            assert problem is None  # where training started, not what the model computes
        else:
            assert problem is not None and "recipe switch" in problem and next(iter(kw)).replace("_", "-") in problem


def test_fp8_head_is_refused_everywhere_with_the_reason(tmp_path, capsys):
    cli_fails(capsys, ["train", *MICRO, "--fp8-head", "--out", str(tmp_path / "r")],
              "fp8_head is not built yet", "Hopper", "--no-fp8-head")  # fmt: skip
    assert not (tmp_path / "r").exists()
