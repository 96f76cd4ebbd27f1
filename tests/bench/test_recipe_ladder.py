"""`gpt2-tui bench --recipe-ladder` (issue 40): the speedrun's tricks (bench/rungs.py RECIPE), each
naming a real recipe setting; the GPT-2 baseline sets the target, each trick is added in turn, then
each left out of the full recipe, over paired seeds, ranked by median training time to the target,
within the budget, with what the device or the preflight refuses skipped and saying why (micro, CPU)."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from bench import recipe_ladder, rungs
from bench.names import LOSS_RUNG_NAMES, RECIPE_NAMES, RUNG_NAMES
from engine.inspect.compare import RECIPE_SETTINGS
from engine.settings import all_settings, switches
from gpt2_tui import main
from harness import accepts

SETTINGS = {s.dotted for s in all_settings()}


@pytest.mark.parametrize("trick", rungs.RECIPE, ids=lambda r: r.name)
def test_every_trick_names_a_recipe_setting_with_a_value_it_takes(trick: rungs.Rung) -> None:
    """A trick whose setting does not exist (yet), or that compare would not show as a recipe, fails here."""
    assert trick.changes and trick.label and trick.why
    for dotted, value in trick.changes.items():
        assert dotted in SETTINGS, f"trick {trick.name}: {dotted} is no setting"
        assert dotted in RECIPE_SETTINGS, f"trick {trick.name}: {dotted} is not a recipe setting (compare's recipe column)"
        assert dotted not in switches(), f"trick {trick.name}: {dotted} is a speed switch, not a recipe"
        here = value.at(steps=300, context=256) if isinstance(value, rungs.Share) else value
        assert accepts(dotted, here), f"trick {trick.name}: {dotted} does not take {here!r}"
        assert here != RECIPE_SETTINGS[dotted], f"trick {trick.name}: {dotted}={here!r} is GPT-2's own value"


def test_trick_names_are_unique_and_the_loss_rungs_come_first() -> None:
    assert RECIPE_NAMES[: len(LOSS_RUNG_NAMES)] == LOSS_RUNG_NAMES  # + Muon, + WSD: issue 39's, first
    assert len(set(RECIPE_NAMES)) == len(RECIPE_NAMES) and not set(RECIPE_NAMES) & set(RUNG_NAMES)
    assert rungs.Share("steps", 0.17).at(300, 64) == 51 and rungs.Share("context", 0.5).at(10, 1) == 1  # at least 1


def test_a_row_runs_only_where_its_seeds_fit_what_is_left() -> None:
    assert recipe_ladder.budget_fit(100.0, 3, 10.0) == 3
    assert recipe_ladder.budget_fit(29.0, 3, 10.0) == 0


ON = ("muon", "wsd", "fp8_head", "align_docs")  # two that train, two this CPU and these data refuse


def _skips(on: tuple[str, ...]) -> list[str]:
    return [a for n in RECIPE_NAMES if n not in on for a in ("--skip", n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    from harness import bigram_tokens, write_gpt2tui

    root = tmp_path_factory.mktemp("recipe")  # learnable; no end-of-text id, so no documents to align
    return write_gpt2tui(root / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)


@pytest.mark.slow
def test_the_recipe_ladder_adds_each_trick_then_leaves_each_out_over_paired_seeds(data, tmp_path, capsys) -> None:
    out = tmp_path / "ladder"
    began = time.monotonic()
    code = main(["bench", "--to-loss", "--recipe-ladder", "--preset", "micro", "--data", str(data), "--device", "cpu",
                 "--steps", "30", "--seeds", "2", "--budget", "240", "--out", str(out), *_skips(ON)])  # fmt: skip
    took = time.monotonic() - began
    printed = capsys.readouterr().out
    assert code == 0
    assert took < 240 * 1.2, took
    result = recipe_ladder.RecipeLadderResult.model_validate_json((out / "recipe_ladder.json").read_text())
    rows = {r.name: r for r in result.rows}
    assert [r.name for r in result.rows if r.reason != recipe_ladder.BY_FLAG] == [
        "baseline", "+muon", "+wsd", "+align_docs", "+fp8_head", "-muon", "-wsd"]  # fmt: skip
    # the baseline is GPT-2 whatever the preset says; the ladder is cumulative; leave-one-out from the full recipe
    assert rows["baseline"].changes == {} and rows["+muon"].changes == {"optim.optimizer": "muon"}
    assert rows["+wsd"].changes == {"optim.optimizer": "muon", "optim.schedule": "wsd"}
    assert rows["-muon"].changes == {"optim.schedule": "wsd"} and rows["-muon"].tricks == ["wsd"]
    assert rows["-wsd"].same_as == "+muon" and rows["-wsd"].runs == rows["+muon"].runs  # the same settings: its runs
    # refused here, with the reason, and left out of the rows after it
    for name, word in (("+fp8_head", "fp8"), ("+align_docs", "end-of-text")):
        assert rows[name].status == "skipped" and word in (rows[name].reason or "").lower(), rows[name].reason
    assert all("fp8_head" not in r.tricks and "align_docs" not in r.tricks for r in result.rows)
    # paired seeds; the target is the baseline's worst final val loss, which each of its seeds reached
    ran = [r for r in result.rows if r.status == "ran"]
    assert {r.name for r in ran} == {"baseline", "+muon", "+wsd", "-muon", "-wsd"}
    assert all([s.seed for s in r.runs] == result.seeds == [1337, 1338] for r in ran)
    base = rows["baseline"]
    assert result.target == max(s.final_val_loss for s in base.runs)  # type: ignore[type-var]
    assert all(s.steps_trained == 30 and s.status == "reached" for s in base.runs)
    for r in ran:  # the median over the seeds (never reached: never), the spread, each reach a real eval
        times = [s.train_time_s if s.status == "reached" else float("inf") for s in r.runs]
        assert r.time_s == (statistics.median(times) if r.reached == 2 else None)
        assert r.reached == sum(s.status == "reached" for s in r.runs) and r.contention is not None
        for s in r.runs:
            if s.status == "reached":
                hit = next(e for e in s.evals if e.step == s.step)
                assert hit.val_loss <= result.target and s.tokens == s.step * result.tokens_per_step  # type: ignore[operator]
                assert all(e.val_loss > result.target for e in s.evals if 0 < e.step < s.step)  # type: ignore[operator]
    assert base.vs_baseline == 1.0
    timed = sorted((r for r in ran if r.time_s is not None and r.same_as is None), key=lambda r: r.time_s)  # type: ignore[arg-type,return-value]
    assert [r.rank for r in timed] == list(range(1, len(timed) + 1))
    # printed and written: the table, its columns, the rows left out by --skip in one line
    header = next(x for x in printed.splitlines() if x.lstrip().startswith("rank"))
    for col in ("steps", "time to target s", "vs baseline", "trick gain", "spread s", "reached"):
        assert col in header
    assert "left out by --skip: rotary, relu2" in printed and "+ rotary" not in printed
    assert printed.splitlines()[-1].startswith("wrote ")
    md = (out / "recipe_ladder.md").read_text()
    assert "| rank | row |" in md and "--recipe-ladder" in md
    assert json.loads((out / "recipe_ladder.json").read_text())["target_from"] == "the baseline's worst final val loss"
    assert (out / "00-baseline" / "seed-1337" / "events.jsonl").is_file()  # each run a run dir: `compare` reads it


@pytest.mark.slow
def test_a_trick_whose_row_never_reaches_the_target_leaves_the_recipe(data, tmp_path, capsys) -> None:
    """A trick that reached the target from no seed is left out of the rows after it and of the
    full recipe (else every leave-one-out row carries it, and none reaches either: the table
    told nothing). A target no run reaches drops each trick in turn."""
    out = tmp_path / "never"
    assert main(["bench", "--to-loss", "0.01", "--recipe-ladder", "--preset", "micro", "--data", str(data), "--device",
                 "cpu", "--steps", "10", "--seeds", "1", "--out", str(out), *_skips(("muon", "wsd"))]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    result = recipe_ladder.RecipeLadderResult.model_validate_json((out / "recipe_ladder.json").read_text())
    rows = {r.name: r for r in result.rows}
    assert rows["+muon"].status == "ran" and rows["+muon"].reached == 0
    assert rows["+wsd"].changes == {"optim.schedule": "wsd"} and rows["+wsd"].tricks == ["wsd"]  # muon left out
    assert rows["+wsd"].status == "ran" and rows["+wsd"].reached == 0
    for name in ("-muon", "-wsd"):
        assert rows[name].status == "skipped" and "is not in the full recipe" in (rows[name].reason or ""), rows[name]
    assert sum("left out of the rows after it" in n for n in result.notes) == 2
    assert "+ Muon: never reached the target: left out of the rows after it" in printed


@pytest.mark.slow
def test_a_budget_the_baseline_cannot_fit_stops_and_says_so(data, tmp_path, capsys) -> None:
    out = tmp_path / "tight"
    assert main(["bench", "--recipe-ladder", "--preset", "micro", "--data", str(data), "--device", "cpu", "--steps",
                 "100000", "--budget", "2", "--out", str(out), *_skips(("muon",))]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    result = recipe_ladder.RecipeLadderResult.model_validate_json((out / "recipe_ladder.json").read_text())
    assert result.notes and result.notes[0].startswith("stopped: the baseline's 3 seeds need about")
    assert "raise --budget, or lower --steps or --seeds" in printed
    assert len(result.rows[0].runs) == 1 and all(r.status == "skipped" for r in result.rows)


def test_the_recipe_ladders_flags_refuse_in_one_line(data, tmp_path, capsys) -> None:
    from harness import cli_fails

    cli_fails(capsys, ["bench", "--to-loss", "--device", "cpu"], "--to-loss needs a val loss", "--recipe-ladder")
    cli_fails(capsys, ["bench", "--seeds", "3", "--to-loss", "4", "--device", "cpu"], "--seeds", "--recipe-ladder")
    cli_fails(capsys, ["bench", "--recipe-ladder", "--seeds", "0", "--device", "cpu"], "--seeds must be at least 1")
    cli_fails(capsys, ["bench", "--recipe-ladder", "--plain", "--device", "cpu"], "--plain")
    cli_fails(capsys, ["bench", "--recipe-ladder", "--skip", "compile", "--data", str(data), "--device", "cpu",
                       "--out", str(tmp_path / "x")], "'compile' is none of them")  # fmt: skip
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # a baseline seed starts before the budget stops it
@pytest.mark.parametrize("accum", [1, 2])
def test_a_batch_ramp_the_geometry_cannot_run_is_a_line_with_its_fix_not_a_row(data, tmp_path, capsys, accum) -> None:
    """Issue 47: at the shipped presets' grad accum 1 the ramp has no micro-batches to leave out, and
    every recipe ladder listed a `+ batch ramp` row that could never run."""
    out = tmp_path / "ramp"
    assert main(["bench", "--recipe-ladder", "--preset", "micro", "--data", str(data), "--device", "cpu", "--steps",
                 "100000", "--budget", "2", "--grad-accum", str(accum), "--out", str(out),
                 *_skips(("batch_ramp",))]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    result = recipe_ladder.RecipeLadderResult.model_validate_json((out / "recipe_ladder.json").read_text())
    ramp = next(r for r in result.rows if r.name == "+batch_ramp")
    if accum == 1:
        assert ramp.reason and ramp.reason.startswith(recipe_ladder.BY_GEOMETRY) and recipe_ladder.left_out(ramp)
        assert "batch_ramp not at this batch geometry: train: batch ramp" in printed
        assert "pass --grad-accum 2 or more" in printed and "+ batch ramp" not in printed
    else:  # it can run: a row (cut here by the budget, as every row is)
        assert not recipe_ladder.left_out(ramp) and "+ batch ramp" in printed
