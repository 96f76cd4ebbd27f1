"""Small things a new user meets first: a mistyped flag gets its closest match, presets come
smallest first, `estimate` shows the preset's own size and what the dataset's vocab makes of it,
losses read in 4 significant digits, and a segment row's best val is that segment's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import events as ev
from engine.config import RunConfig, preset_names
from engine.inspect import compare
from engine.run.segments import changed, segments_of, switches
from gpt2_tui import main


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_mistyped_flag_gets_the_closest_one(capsys) -> None:
    assert "--batchsize 4; did you mean --batch-size?" in _usage_error(capsys, ["train", "--batchsize", "4"])
    assert "did you mean --device?" in _usage_error(capsys, ["estimate", "--devise", "cpu"])
    assert "did you mean" not in _usage_error(capsys, ["train", "--zzzzzz", "4"])


def test_presets_are_listed_smallest_first() -> None:
    assert preset_names() == ["micro", "speedrun", "nano", "mini", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]


def test_estimate_shows_the_presets_own_size_and_the_datasets_vocab(capsys) -> None:
    assert main(["estimate", "--preset", "gpt2"]) in (0, 1)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("124.5M params (vocab 50257; 92.1M with this dataset's 8192-token vocab), "), first
    assert main(["estimate", "--preset", "gpt2", "--vocab-size", "50257"]) in (0, 1)
    assert capsys.readouterr().out.startswith("124.5M params (vocab 50257), ")


@pytest.mark.slow
def test_losses_are_printed_in_four_significant_digits(tmp_path: Path, tiny_dataset: Path, capsys) -> None:
    assert main(["train", "--preset", "micro", "--device", "cpu", "--data", str(tiny_dataset), "--max-steps", "2",
                 "--eval-interval", "2", "--sample-tokens", "0", "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    said = capsys.readouterr()
    text = said.out + said.err
    losses = re.findall(r"loss (\d+\.\d+)", text)
    assert len(losses) >= 3, text  # two steps, one eval, the run's best
    assert all(len(x.replace(".", "").lstrip("0")) <= 4 for x in losses), losses


def test_a_segment_row_shows_its_own_best_val_loss() -> None:
    base = RunConfig().model_dump(mode="json")
    sw = switches(base)
    off = dict(sw, **{"data.prefetch": False})
    started = ev.RunStarted(time=0.0, config=base, n_params=1, device="cpu", device_name="x", precision="fp32",
                            start_step=0, flops_per_token=1000, peak_flops=None)  # fmt: skip

    def step(s: int) -> ev.Step:
        return ev.Step(step=s, loss=3.0, lr=1e-3, grad_norm=1.0, step_time_s=0.1, tokens_per_s=1280.0, mfu=None,
                       mem_bytes=None, tokens=128 * s)  # fmt: skip

    log = [started, ev.Segment(step=0, switches=sw, changed={}, reason="start"), *map(step, range(1, 4)),
           ev.Eval(step=3, val_loss=2.0),
           ev.Segment(step=3, switches=off, changed=changed(sw, off), reason="toggle"), *map(step, range(4, 7)),
           ev.Eval(step=6, val_loss=2.5)]  # fmt: skip
    a, b = segments_of(log)
    assert (a.best_val_loss, b.best_val_loss) == (2.0, 2.5)
    rows = compare.rows([("run", [a, b], 2.0)])
    assert [r.best_val_loss for r in rows] == [2.0, 2.5]
    assert [compare.cells(r)[compare.COLUMNS.index("best val")] for r in rows] == ["2", "2.5"]
