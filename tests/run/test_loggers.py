"""Issue 24: `--log tensorboard|wandb|csv` sinks on a real tiny run, read back with each
tool's own reader; a missing extra is one line; unasked extras are never imported."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import events as ev
from engine.run import loggers
from engine.errors import UserError
from harness import ROOT, python_c


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run with all three loggers; W&B offline through its own env vars."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from harness import write_gpt2tui, random_tokens

    from engine.config import build
    from engine.run.owner import start

    tmp = tmp_path_factory.mktemp("log")
    data = write_gpt2tui(tmp / "data", random_tokens(4000, 64), random_tokens(800, 64, seed=1), vocab_size=64)
    config = build({
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        "data": {"path": str(data)},
        "speed": {"device": "cpu"},
        "train": {"batch_size": 2, "max_steps": 6, "eval_interval": 3, "ckpt_interval": 100, "eval_batches": 1,
                  "sample_tokens": 0},
        "optim": {"warmup_steps": 1},
    })
    mp = pytest.MonkeyPatch()
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb"), "WANDB_SILENT": "true",
                       "WANDB_CONSOLE": "off"}.items():
        mp.setenv(key, value)
    run_dir = tmp / "run"
    try:
        sinks = loggers.make_sinks(["tensorboard", "wandb", "csv", "csv"], run_dir)
        assert len(sinks) == 3 and not run_dir.exists()  # nothing written before the run starts
        start(config, run_dir, sinks=sinks).run()
    finally:
        mp.undo()
    return run_dir


def _events(run_dir: Path) -> list:
    got, problems = ev.read_events(run_dir / "events.jsonl")
    assert not problems
    return got


@pytest.mark.slow
def test_tensorboard_reads_back_the_scalars(run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / loggers.TB_DIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    steps = [e for e in _events(run) if isinstance(e, ev.Step)]
    evals = [e for e in _events(run) if isinstance(e, ev.Eval)]
    assert len(steps) == 6 and len(evals) >= 2
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "speed/step_time_s", "speed/tokens_per_s", "val/loss"} <= set(tags)
    loss = acc.Scalars("train/loss")
    assert [s.step for s in loss] == [e.step for e in steps]
    np.testing.assert_allclose([s.value for s in loss], [e.loss for e in steps], rtol=1e-6)
    np.testing.assert_allclose([s.value for s in acc.Scalars("train/lr")], [e.lr for e in steps], rtol=1e-6)
    assert [(s.step, round(s.value, 5)) for s in acc.Scalars("val/loss")] == [(e.step, round(e.val_loss, 5)) for e in evals]
    texts = acc.Tags()["tensors"]  # add_text is stored as a tensor summary
    assert any(t.startswith("config") for t in texts) and any(t.startswith("segments") for t in texts)


@pytest.mark.slow
def test_wandb_offline_writes_its_run_files(run: Path) -> None:
    wandb_dir = run.parent / "wandb" / "wandb"
    runs = list(wandb_dir.glob("offline-run-*"))
    assert len(runs) == 1, list(wandb_dir.iterdir()) if wandb_dir.exists() else "no wandb dir"
    files = list(runs[0].glob("run-*.wandb"))
    assert files and files[0].stat().st_size > 0


@pytest.mark.slow
def test_csv_rows_match_the_events(run: Path) -> None:
    rows = list(csv.DictReader(open(run / loggers.CSV_FILE, encoding="utf-8")))
    steps = [e for e in _events(run) if isinstance(e, ev.Step)]
    got = [(int(r["step"]), float(r["loss"])) for r in rows if r["event"] == "step"]
    assert got == [(e.step, e.loss) for e in steps]
    assert [r["event"] for r in rows][0] == "segment" and rows[-1]["event"] == "run_finished"
    assert [float(r["val_loss"]) for r in rows if r["event"] == "eval"] == [
        e.val_loss for e in _events(run) if isinstance(e, ev.Eval)
    ]


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_missing_extra_is_one_line(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # what an environment without the extra gives
    with pytest.raises(UserError) as err:
        loggers.make_sinks(["csv", name], tmp_path / "run")
    assert str(err.value) == f"--log {name} needs the {name} package; pip install gpt2-tui[{name}]"
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--log mlflow: unknown logger; choose from tensorboard, wandb, csv$"):
        loggers.check(["mlflow"])


@pytest.mark.slow
def test_unasked_extras_are_never_imported(tmp_path: Path) -> None:
    """A run logging to CSV only (and importing every new module) pulls in none of the extras."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engine.run import loggers\nfrom engine.prep import hf, hub as prepare_hub\nfrom engine import events as ev\n"
        f"s = loggers.make_sinks(['csv'], Path({str(tmp_path)!r}))[0]\n"
        "s.emit(ev.Eval(step=1, val_loss=2.0)); s.close()\n"
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('tensorboard','wandb','datasets','transformers','safetensors','huggingface_hub','tensorboardX')])\n"
    )
    done = python_c(code, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert (tmp_path / loggers.CSV_FILE).read_text().splitlines()[1].startswith(tuple("0123456789"))



@pytest.mark.slow
def test_wandb_online_without_a_key_is_refused_before_a_byte_is_written(tmp_path, tiny_dataset, monkeypatch) -> None:
    """`--log wandb` with no API key crashed in wandb.init, mid-set-up: a traceback, exit 1 and a
    half-made run directory (found by the random-argv property test). Now one line, exit 2."""
    pytest.importorskip("wandb")
    from harness import refusal_problems, run_cli

    argv = ["train", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cpu", "--max-steps", "1",
            "--out", str(tmp_path / "run"), "--log", "wandb"]  # fmt: skip
    netrc = tmp_path / "netrc"
    res = run_cli(argv, tmp_path, tmp_path / "cache", NETRC=str(netrc), WANDB_MODE="", WANDB_API_KEY="")
    assert not refusal_problems(res) and "wandb login" in res.err, res
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(UserError, match="no W&B API key"):
        loggers.check(["wandb"])
    netrc.write_text("machine api.wandb.ai\n  login user\n  password x\n")  # what `wandb login` writes
    assert loggers.check(["wandb"]) == ["wandb"]
    monkeypatch.setenv("WANDB_MODE", "offline")
    netrc.unlink()
    assert loggers.check(["wandb"]) == ["wandb"]  # offline needs no key
