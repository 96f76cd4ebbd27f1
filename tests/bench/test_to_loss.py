"""`gpt2-tui bench --to-loss X`: each rung trains from the same seed to a val loss, the rungs
are ranked by the training time they took, the optimizer and schedule rungs (+ Muon, + WSD)
climb on top of the speed ladder's, and the whole run stays within its budget (micro, CPU)."""

from __future__ import annotations

import time

import pytest

from bench import to_loss
from gpt2_tui import main

SKIP = ["preload", "vectorized", "amp", "compile", "flash", "fused", "chunked_loss"]  # short: baseline, + Muon, + WSD


@pytest.mark.slow
def test_bench_to_loss_ranks_the_rungs_within_its_budget(tmp_path, capsys) -> None:
    from harness import bigram_tokens, write_gpt2tui

    data = write_gpt2tui(tmp_path / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)
    out = tmp_path / "to-loss"
    began = time.monotonic()
    code = main(["bench", "--preset", "micro", "--to-loss", "4.1", "--data", str(data), "--device", "cpu",
                 "--steps", "30", "--budget", "60", "--out", str(out), *(a for s in SKIP for a in ("--skip", s))])  # fmt: skip
    took = time.monotonic() - began
    printed = capsys.readouterr().out
    assert code == 0
    assert took < 60 * 1.5, took  # the budget, give or take the last eval and save
    result = to_loss.ToLossResult.model_validate_json((out / "to_loss.json").read_text())
    by = {r.name: r for r in result.rungs}
    assert by["muon"].changes["optim.optimizer"] == "muon" and by["wsd"].changes["optim.schedule"] == "wsd"
    assert by["wsd"].changes["optim.optimizer"] == "muon"  # cumulative: + WSD on top of + Muon
    assert "--skip" in (by["compile"].reason or "") and "CUDA" in (by["tf32"].reason or "")
    reached = sorted((r for r in result.rungs if r.status == "reached"), key=lambda r: r.rank or 0)
    assert len(reached) >= 2, [(r.name, r.status, r.reason) for r in result.rungs]
    assert [r.rank for r in reached] == list(range(1, len(reached) + 1))
    times = [r.train_time_s for r in reached]
    assert times == sorted(times) and reached[0].vs_fastest == 1.0
    for r in reached:  # its eval reached the target; tokens are its steps' tokens
        assert r.val_loss is not None and r.val_loss <= 4.1 and r.tokens == r.step * result.tokens_per_step
    assert printed.splitlines()[-1].startswith("wrote ") and "rank" in printed


def test_to_loss_refuses_another_tool_and_the_speed_ladder_a_loss_rung(tmp_path, tiny_dataset, capsys) -> None:
    from harness import cli_fails

    cli_fails(capsys, ["bench", "--to-loss", "4", "--plain", "--device", "cpu"], "--to-loss", "--plain")
    cli_fails(capsys, ["bench", "--skip", "muon", "--data", str(tiny_dataset), "--device", "cpu", "--out",
                       str(tmp_path / "x")], "unknown rung 'muon'")  # fmt: skip
