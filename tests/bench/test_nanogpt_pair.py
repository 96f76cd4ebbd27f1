"""`bench --plain --nanogpt DIR`: nanoGPT's own train.py (the copy in tests/bench/nanogpt, as
published) timed beside our Trainer at our shape, in the same paired rounds (issue 37 item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import nanogpt
from bench.reference import ReferenceShape
from engine.errors import UserError
from gpt2_tui import main
from harness import refusal_problems, run_cli

CHECKOUT = Path(__file__).parent / "nanogpt"


@pytest.mark.slow
def test_nanogpts_train_py_trains_at_the_shape_given_and_its_own_times_come_back() -> None:
    tokens = np.random.default_rng(0).integers(0, 60, size=4000).astype(np.uint16)
    shape = ReferenceShape(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch_size=4)
    times = nanogpt.step_times(CHECKOUT, tokens, tokens[:1000], shape, 4, lr=1e-3)
    assert len(times) == 4 and all(t > 0 for t in times)


@pytest.mark.slow  # three loops at micro's shape, one round (~20 s on 2 cores)
def test_the_pair_prints_ours_over_nanogpts_per_round(tmp_path: Path, tiny_dataset: Path, capsys) -> None:
    out = tmp_path / "pair"
    code = main(["bench", "--plain", "--nanogpt", str(CHECKOUT), "--preset", "micro", "--device", "cpu",
                 "--data", str(tiny_dataset), "--steps", "3", "--warmup", "1", "--rounds", "2", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    result = json.loads((out / "plain.json").read_text())
    assert set(result["ms"]) == {"ours", "reference", "nanogpt"} and len(result["per_round_ms"]["nanogpt"]) == 2
    row = next(line for line in printed.splitlines() if line.startswith("| nanoGPT's own train.py"))
    assert "| 1.000x |" in row  # nanoGPT against itself
    ratios = [r["ours"] / r["nanogpt"] for r in [{k: v[i] for k, v in result["per_round_ms"].items()} for i in (0, 1)]]
    assert "ours / nanoGPT per round: " + ", ".join(f"{p:.3f}x" for p in ratios) in printed


@pytest.mark.slow
def test_a_directory_without_nanogpt_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('not nanoGPT')\n")
    with pytest.raises(UserError, match="no model.py, configurator.py there"):
        nanogpt.check_checkout(tmp_path)
    res = run_cli(["bench", "--plain", "--nanogpt", str(tmp_path), "--preset", "micro", "--device", "cpu",
                   "--out", str(tmp_path / "out")], tmp_path, tmp_path / "cache")  # fmt: skip
    assert not refusal_problems(res) and "karpathy/nanoGPT" in res.err, res
    assert not (tmp_path / "out").exists()
    res = run_cli(["bench", "--nanogpt", str(CHECKOUT), "--preset", "micro"], tmp_path, tmp_path / "cache")
    assert not refusal_problems(res) and "add --plain" in res.err, res
