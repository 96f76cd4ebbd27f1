"""Issue 24: GPT-2 weights in the Hugging Face layout <-> our model, offline.

A tiny GPT2LMHeadModel with random weights (transformers' save_pretrained) stands in for
what the Hub would give; the round trips are checked against transformers itself.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from engine.prep import hf
from engine.inspect.export import export_run
from engine.config import ModelConfig
from engine.errors import UserError
from engine.train.model import GPT
from harness import python_c


@pytest.fixture(scope="module")
def transformers():
    """transformers (and safetensors), imported when a test here runs, not at collection."""
    pytest.importorskip("safetensors")
    return pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _needs_transformers(transformers) -> None:
    """Every test here skips where transformers is missing."""

VOCAB = 100  # padded to 128 by pad_vocab: the padding path is exercised
SHAPE = dict(n_layer=2, n_head=2, n_embd=32, n_positions=48, vocab_size=VOCAB, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, transformers) -> Path:
    """A random tiny GPT-2 saved the way the Hub's are: config.json + model.safetensors."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPE))
    with torch.no_grad():  # HF initializes biases and LayerNorms to 0/1: make them all count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    model.save_pretrained(out)
    assert (out / "model.safetensors").is_file()
    return out


@pytest.fixture(scope="module")
def hf_model(hf_dir: Path, transformers):
    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()


def _our_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """All positions' logits over the real vocab (the targets path returns the padded ones)."""
    logits, _ = model(idx, idx)
    return logits[..., : model.vocab_size]


def _ids(n: int = 2, t: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pad_vocab", [True, False])
def test_init_from_dir_gives_transformers_logits(hf_dir: Path, hf_model, pad_vocab: bool) -> None:
    pre = hf.init_from(hf_dir, ModelConfig(pad_vocab=pad_vocab, attention="manual"))
    assert (pre.model.n_layer, pre.model.n_head, pre.model.n_embd, pre.model.block_size) == (2, 2, 32, 48)
    assert pre.model.vocab_size == VOCAB and pre.model.padded_vocab_size == (128 if pad_vocab else VOCAB)
    ours = GPT(pre.model).eval()
    hf.load_into(ours, pre.state)
    assert ours.lm_head.weight is ours.transformer.wte.weight  # still tied
    idx = _ids()
    with torch.no_grad():
        want = hf_model(idx).logits
        got = _our_logits(ours, idx)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        # padded rows hold the mean embedding, so each padded logit is the mean logit and
        # (Jensen) the padding adds at most pad/V to the softmax mass: loss + log1p(pad/V) at
        # most (GPT-2: 47/50257, +0.00094); zero rows would add far more on GPT-2's negative logits
        _, loss = ours(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
        want_loss = hf_model(idx, labels=idx).loss
    pad = pre.model.padded_vocab_size - VOCAB
    assert -1e-5 <= loss.item() - want_loss.item() <= math.log1p(pad / VOCAB) + 1e-5


def test_flash_attention_agrees_too(hf_dir: Path, hf_model) -> None:
    pre = hf.init_from(hf_dir, ModelConfig(attention="flash"))
    ours = GPT(pre.model).eval()
    hf.load_into(ours, pre.state)
    idx = _ids(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(_our_logits(ours, idx), hf_model(idx).logits, rtol=0, atol=1e-5)


def test_original_upload_layout_loads(hf_dir: Path, hf_model, tmp_path: Path) -> None:
    """The Hub's gpt2 files name keys without `transformer.` and keep the attn.bias mask buffer."""
    from safetensors.torch import load_file, save_file

    raw = load_file(str(hf_dir / "model.safetensors"))
    old = {k.removeprefix("transformer."): v for k, v in raw.items()}
    old["h.0.attn.bias"] = torch.ones(1, 1, 48, 48).tril()
    d = tmp_path / "old"
    d.mkdir()
    save_file(old, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text((hf_dir / "config.json").read_text())
    pre = hf.init_from(d)
    ours = GPT(pre.model).eval()
    hf.load_into(ours, pre.state)
    idx = _ids(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(_our_logits(ours, idx), hf_model(idx).logits, rtol=0, atol=1e-5)


def test_conflicting_shape_flag_is_refused(hf_dir: Path) -> None:
    with pytest.raises(UserError, match=r"^--n-layer 6 conflicts with .*n_layer 2; drop --n-layer") as e:
        hf.init_from(hf_dir, explicit={"n_layer": 6})
    assert "\n" not in str(e.value)
    hf.init_from(hf_dir, explicit={"n_layer": 2})  # the same value is no conflict


def test_bad_sources_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither a model name nor a directory"):
        hf.resolve("gpt3")
    with pytest.raises(UserError, match="no config.json"):
        hf.resolve(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(UserError, match="not gpt2"):
        hf.init_from(tmp_path)


def test_hub_name_from_the_cache_offline(hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpt2` resolves through huggingface_hub's cache with HF_HUB_OFFLINE: a cache laid out
    as the hub lays it (refs/main -> snapshots/COMMIT) is what a past download leaves."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the Hugging Face cache .* HF_HUB_OFFLINE is set") as e:
        hf.resolve("gpt2", cache_dir=tmp_path)
    assert "\n" not in str(e.value)
    repo = tmp_path / "models--openai-community--gpt2"
    commit = "0" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name in ("config.json", "model.safetensors"):
        (snap / name).write_bytes((hf_dir / name).read_bytes())
    got = hf.resolve("gpt2", cache_dir=tmp_path)
    assert got == snap
    assert hf.init_from("gpt2", cache_dir=tmp_path).model.n_layer == 2


@pytest.mark.slow
def test_missing_network_is_one_line(tmp_path: Path) -> None:
    """No HF_HUB_OFFLINE, no network (an endpoint on a closed loopback port): one line with the fix."""
    env = os.environ | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "HF_HUB_ETAG_TIMEOUT": "2"}
    env.pop("HF_HUB_OFFLINE", None)
    code = "from engine.prep import hf\nfrom engine.errors import UserError\ntry:\n    hf.resolve('gpt2')\nexcept UserError as e:\n    print(e)\n"
    done = python_c(code, env=env)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("cannot download gpt2 from the Hugging Face Hub (no network?")
    assert "run once with network" in lines[0]


# ------------------------------------------------------------------ export


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """A real tiny run: prepared text with our BPE, a few steps, checkpoints in its run dir."""
    return _train(tmp_path_factory)


@pytest.fixture(scope="module")
def trained_muon(tmp_path_factory: pytest.TempPathFactory):
    """The same run trained with optim.optimizer = muon (Muon for the blocks' matrices)."""
    return _train(tmp_path_factory, optimizer="muon")


def _train(tmp_path_factory: pytest.TempPathFactory, **optim):
    from engine.prep.prepare import prepare_report
    from engine.run.owner import start

    from engine.config import build

    tmp = tmp_path_factory.mktemp("run")
    docs = tmp / "docs"
    docs.mkdir()
    for i in range(12):
        (docs / f"d{i}.txt").write_text(f"Document {i}: the quick brown fox jumps over the lazy dog. " * 20)
    data = prepare_report([docs], tmp / "data", vocab_size=300, progress=False).info
    config = build({
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
        "data": {"path": str(data.path)},
        "speed": {"device": "cpu"},
        "train": {"batch_size": 4, "max_steps": 6, "eval_interval": 3, "ckpt_interval": 3, "eval_batches": 1,
                  "sample_tokens": 0},
        "optim": {"warmup_steps": 1, **optim},
    })
    run = tmp / "run"
    start(config, run).run()
    return run


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_logits(trained: Path, tmp_path: Path, transformers) -> None:
    _export_matches_transformers(trained, tmp_path, transformers)


@pytest.mark.slow
def test_export_of_a_muon_trained_run_loads_in_transformers_with_our_logits(trained_muon: Path, tmp_path: Path,
                                                                           transformers) -> None:
    from engine import rundir

    assert rundir.load_config(trained_muon).optim.optimizer == "muon"
    _export_matches_transformers(trained_muon, tmp_path, transformers)


def _export_matches_transformers(trained: Path, tmp_path: Path, transformers) -> None:
    from engine.inspect.sample import load_model

    out = export_run(trained, tmp_path / "hf-out")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left
    loaded = load_model(trained)
    ours = loaded.model.eval()
    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert theirs.config.vocab_size == 300 and theirs.lm_head.weight.shape[0] == 300
    idx = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, _our_logits(ours, idx), rtol=0, atol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "the quick brown fox jumps over the lazy dog."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    gen = theirs.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
    assert gen.shape == (1, len(ids) + 5)
    # and back: the exported directory is an --init-from source with the same weights
    pre = hf.init_from(out, ModelConfig(pad_vocab=True))
    back = GPT(pre.model).eval()
    hf.load_into(back, pre.state)
    with torch.no_grad():
        torch.testing.assert_close(_our_logits(back, idx), _our_logits(ours, idx), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_export_refusals_write_nothing(trained: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="is not empty; pass a new or empty directory"):
        export_run(trained, full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    state = {"transformer.wte.weight": torch.zeros(4, 2)}
    with pytest.raises(UserError, match=r"bias = false \(--no-bias\)"):
        hf.export(state, ModelConfig(bias=False, vocab_size=4, n_embd=2, n_head=1), tmp_path / "nb")
    assert not (tmp_path / "nb").exists()
    with pytest.raises(UserError, match="--from 99: no such checkpoint"):
        export_run(trained, tmp_path / "x", which="99")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


@pytest.mark.slow
def test_export_from_a_named_checkpoint(trained: Path, tmp_path: Path) -> None:
    out = export_run(trained, tmp_path / "empty-ok", which="3")
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_hf_module_imports_no_optional_package() -> None:
    code = (
        "import sys, engine.prep.hf, engine.train.model, engine.train.trainer\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('safetensors','huggingface_hub','transformers','datasets','tensorboard','wandb')]\n"
        "print(bad)\n"
    )
    done = python_c(code)
    assert done.stdout.strip() == "[]", done.stderr
