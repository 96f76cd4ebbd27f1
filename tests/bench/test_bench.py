"""The speed ladder, the plain-loop comparison and the over-time mode, at a tiny size.

Structure, not timing: which rungs run or are skipped here and why, the cumulative config
each rung really trained with, that the figures are consistent with the recorded step
times, and that the tables land on disk. No timed assertions; no torch.compile here.
"""

import json
import statistics

import pytest
from harness import random_tokens, write_gpt2tui

from engine import device, rundir
from bench import ladder as bench
from bench import plain as bench_plain
from bench.timeline import settle_point
from gpt2_tui import main
from engine.config import read_toml, resolve
from engine.events import read_events
from engine.run.owner import start


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """One tiny ladder (micro, vocab 100 so padding has work to do), shared by the tests below."""
    root = tmp_path_factory.mktemp("ladder")
    data = write_gpt2tui(root / "v100", random_tokens(20_000, 100, 1), random_tokens(4_000, 100, 2), 100)
    out = root / "out"
    seen = []
    cfg = bench.BenchConfig(preset="micro", data=str(data), device="cpu", vocab_size=100, steps=2, warmup=1,
                            skip=["compile"])  # fmt: skip
    result = bench.run_ladder(cfg, out, on_rung=seen.append, command="test")
    return result, out, seen


@pytest.mark.slow
def test_ladder_runs_every_rung_this_device_can_and_says_why_not_for_the_rest(ladder):
    result, out, seen = ladder
    assert [r.name for r in result.rungs] == bench.RUNG_NAMES
    assert [r.name for r in seen] == bench.RUNG_NAMES  # reported as they landed
    by = {r.name: r for r in result.rungs}
    assert by["tf32"].status == "skipped" and "CUDA" in by["tf32"].reason
    assert by["compile"].status == "skipped" and "--skip" in by["compile"].reason
    amp = device.cpu_native("bf16")  # the AMP rung runs where bf16 is native; either side is forced by --cpu-native
    ran = ["baseline", "preload", "vectorized", *(["amp"] if amp else []), "flash", "pad_vocab", "fused", "chunked_loss"]
    assert [r.name for r in result.rungs if r.status == "ran"] == ran
    if amp:
        assert by["amp"].precision == "bf16"
    else:
        assert by["amp"].status == "skipped" and "no native bf16" in by["amp"].reason
    assert by["fused"].notes == [  # fused AdamW did apply; the data switches wait for a GPU
        "pinned memory needs CUDA", "the prefetch thread needs an accelerator: on CPU it takes cores from the math",
    ]
    assert result.device == "cpu" and result.n_params and result.tokens_per_step == 4 * 32


@pytest.mark.slow
def test_each_rung_trained_with_the_switches_below_it_plus_its_own(ladder):
    result, out, _ = ladder
    configs = {p.name.split("-", 1)[1]: read_toml(p / rundir.CONFIG) for p in out.iterdir() if p.is_dir()}
    assert sorted(configs) == sorted(r.name for r in result.rungs if r.status == "ran")
    base = configs["baseline"]
    speed = (base["speed"]["precision"], base["speed"]["compile"], base["model"]["attention"])
    assert speed == ("fp32", False, "manual")
    assert (base["data"]["preload"], base["data"]["vectorized"], base["data"]["prefetch"]) == (False, False, False)
    assert (base["model"]["pad_vocab"], base["optim"]["fused"], base["model"]["vocab_size"]) == (False, False, 100)
    half = "bf16" if device.cpu_native("bf16") else "fp32"  # an emulated AMP rung is skipped: fp32 above it
    if half == "bf16":
        amp = configs["amp"]
        assert amp["data"]["preload"] and amp["data"]["vectorized"] and amp["speed"]["precision"] == "bf16"
        assert amp["model"]["attention"] == "manual" and not amp["model"]["pad_vocab"]
    top = configs["fused"]
    assert top["model"]["attention"] == "flash" and top["model"]["pad_vocab"] and top["optim"]["fused"]
    assert not top["data"]["prefetch"]  # not applied on CPU: the ladder's note says why
    assert top["speed"]["precision"] == half and not top["speed"]["compile"]
    assert base["model"]["loss"] == top["model"]["loss"] == "plain"
    chunked = configs["chunked_loss"]
    assert chunked["model"]["loss"] == "chunked" and chunked["optim"]["fused"] and chunked["model"]["pad_vocab"]


@pytest.mark.slow
def test_figures_follow_from_the_recorded_step_times(ladder):
    result, out, _ = ladder
    ran = [r for r in result.rungs if r.status == "ran"]
    base = ran[0].median_step_s
    for prev, r in zip([None, *ran], ran):
        events, _ = read_events(next(out.glob(f"*-{r.name}")) / rundir.EVENTS)
        steps = [e for e in events if e.event == "step"]
        assert len(steps) == result.warmup + result.steps
        assert r.step_times_s == [e.step_time_s for e in steps]
        assert r.median_step_s == statistics.median(r.step_times_s[result.warmup :])
        assert r.tokens_per_s == pytest.approx(result.tokens_per_step / r.median_step_s)
        assert r.mfu is None  # CPU is not in the peak table: unknown, never a guess
        assert r.speedup_vs_baseline == pytest.approx(base / r.median_step_s)
        assert r.speedup_vs_prev == pytest.approx(1.0 if prev is None else prev.median_step_s / r.median_step_s)
        assert r.startup_s >= r.first_step_s > 0
        assert not list(out.glob(f"*-{r.name}/checkpoints/*.pt"))  # bench runs save nothing


@pytest.mark.slow
def test_tables_are_written_as_markdown_and_json(ladder, capsys):
    result, out, _ = ladder
    assert bench.LadderResult.model_validate_json((out / "ladder.json").read_text()) == result
    md = (out / "ladder.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(bench.LADDER)
    assert "skipped: TF32 needs a CUDA GPU" in md and "torch 2." in md and "load average" in md
    text = bench.to_text(result)
    assert all(r.label in text for r in result.rungs)


@pytest.mark.slow
def test_bench_command_prints_the_ladder(tmp_path, tiny_dataset, capsys):
    out = tmp_path / "b"
    code = main(["bench", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cpu", "--vocab-size", "64",
                 "--steps", "1", "--warmup", "1", "--skip", "compile", "--skip", "amp", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    assert "+ padded vocab" in printed and "vocab 64 is already a multiple of 64" in printed
    data = json.loads((out / "ladder.json").read_text())
    assert data["command"].startswith("gpt2-tui bench --preset micro")
    assert [r["status"] for r in data["rungs"]].count("ran") == 6  # baseline, preload, vectorized, flash, fused, chunked_loss


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--preset", "nope"], ["unknown preset", "nope"]),
        (["--steps", "0"], ["--steps", "at least 1"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--data", "/no/such/dir"], ["/no/such/dir"]),
        (["--block-size", "999"], ["block size 999"]),
        (["--config", "/no/such.toml"], ["/no/such.toml"]),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tiny_dataset, capsys, argv, words):
    data = [] if "--data" in argv or "--config" in argv else ["--data", str(tiny_dataset)]
    preset = [] if "--preset" in argv or "--config" in argv else ["--preset", "micro"]
    code = main(["bench", *preset, *data, *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_bench_never_overwrites_an_earlier_result(tmp_path, tiny_dataset, capsys, file_tree):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ladder.json").write_text("{}")
    before = file_tree(out)
    code = main(["bench", "--preset", "micro", "--data", str(tiny_dataset), "--out", str(out)])
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert file_tree(out) == before


@pytest.mark.slow
def test_reference_loop_trains_our_shape_on_our_data(tmp_path, tiny_dataset):
    """The independent reference gets our model's shape (same parameter count, padded vocab
    included) and our token file: its first loss matches ours to within init noise
    (both near ln(Vp): independent inits, different batches)."""
    import math

    from bench import reference

    run = start(resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu",
                                            "speed.precision": "fp32", "train.max_steps": 2,
                                            "optim.warmup_steps": 0}), tmp_path / "ours")  # fmt: skip
    config, ds = run.config, run.dataset
    run.run()
    trainer = run.segment
    ours = [e.loss for e in read_events(tmp_path / "ours" / rundir.EVENTS)[0] if e.event == "step"]
    shape = bench_plain.reference_shape(config)
    assert shape.vocab_size == config.model.padded_vocab_size and shape.block_size == config.seq_len
    if config.seq_len == config.model.block_size:
        assert sum(p.numel() for p in reference.GPT(shape).parameters()) == trainer.parts.n_params
    tokens = bench_plain.reference_tokens(ds)
    assert len(tokens) == min(len(ds.train), bench_plain.REFERENCE_TOKENS)
    losses: list[float] = []
    times = bench_plain.reference_loop(config, ds, 2, losses)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert abs(losses[0] - math.log(shape.vocab_size)) < 0.1 and abs(losses[0] - ours[0]) < 0.1


@pytest.mark.slow
def test_plain_comparison_writes_its_table(tmp_path, tiny_dataset, capsys):
    out = tmp_path / "plain"
    code = main(["bench", "--plain", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cpu",
                 "--steps", "2", "--warmup", "1", "--rounds", "2", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    result = bench_plain.PlainResult.model_validate_json((out / "plain.json").read_text())
    assert set(result.ms) == {"ours", "reference"} and all(v > 0 for v in result.ms.values())
    assert all(len(v) == 2 for v in result.per_round_ms.values())
    md = (out / "plain.md").read_text()
    assert "| independent reference loop" in md and "| gpt2-tui Trainer" in md and "x reference" in md
    assert result.per_round_ms.keys() == {"ours", "reference"}


def test_settle_point_finds_where_the_warm_up_ends():
    times = [40.0, 3.0, 1.3, 1.0, 1.05, 0.98, 1.02, 1.0, 0.99, 1.01]
    settled, index = settle_point(times)
    assert settled == pytest.approx(1.0) and index == 3
    assert settle_point([1.0, 1.0, 1.0]) == (1.0, 0)


@pytest.mark.slow
def test_config_mode_times_one_config_over_time(tmp_path, tiny_dataset, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text(resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu"}).to_toml())
    out = tmp_path / "t"
    assert main(["bench", "--config", str(toml), "--steps", "4", "--out", str(out)]) == 0
    data = json.loads((out / "timeline.json").read_text())
    assert len(data["step_times_s"]) == 4 and data["settled_step_s"] > 0
    first_step = next(e for e in read_events(out / "run" / rundir.EVENTS)[0] if e.event == "step")
    assert data["step_times_s"][0] == first_step.step_time_s
    assert "| 4 |" in (out / "timeline.md").read_text()


@pytest.mark.slow
def test_benchmark_screen_opens_from_the_app_and_draws_the_ladder(tmp_path, tiny_dataset):
    import asyncio

    from tui.app import GPT2App
    from tui.screens.benchmark import BenchmarkScreen

    cfg = bench.BenchConfig(preset="micro", data=str(tiny_dataset), device="cpu", vocab_size=100, steps=1,
                            warmup=1, skip=["preload", "vectorized", "amp", "compile", "flash",
                                                     "chunked_loss"])  # fmt: skip

    async def go() -> None:
        app = GPT2App(resolve("micro", overrides={"data.path": str(tiny_dataset)}))
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause()
            await pilot.press("f8")  # registered in the app's EXTRA_SCREENS
            await pilot.pause()
            assert isinstance(app.screen, BenchmarkScreen)
            await pilot.press("escape")
            await pilot.pause()
            screen = BenchmarkScreen(cfg, out=tmp_path / "ladder")
            app.push_screen(screen)
            await pilot.pause()
            await pilot.press("r")
            loop = asyncio.get_running_loop()
            end = loop.time() + 180  # a bounded poll on the screen's own state, not a timing
            while screen.running or screen._drawn != len(bench.LADDER):
                assert loop.time() < end, "the ladder did not finish"
                await pilot.pause(0.1)
            assert screen.error is None
            table = screen.query_one("#bench-table")
            assert table.row_count == len(bench.LADDER)
            statuses = [r.status for r in screen.rungs]
            assert statuses.count("ran") == 3 and "done" in screen.status_line()
            saved = bench.LadderResult.model_validate_json((tmp_path / "ladder" / "ladder.json").read_text())
            assert [r.status for r in saved.rungs] == statuses

    asyncio.run(go())


@pytest.mark.slow
def test_best_sweeps_batch_and_compile_mode_and_marks_the_fastest(tmp_path, tiny_dataset, capsys):
    out = tmp_path / "best"
    code = main(["bench", "--best", "--preset", "micro", "--data", str(tiny_dataset), "--device", "cpu",
                 "--vocab-size", "64", "--batch-sizes", "2,4", "--compile-modes", "eager", "--steps", "2",
                 "--warmup", "1", "--log-interval", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    from bench.best import BestResult

    result = BestResult.model_validate_json((out / "best.json").read_text())
    tried = [(c.batch_size, c.compile_mode, c.status) for c in result.candidates]
    assert tried == [(2, "eager", "ran"), (4, "eager", "ran")]
    best = max(result.candidates, key=lambda c: c.tokens_per_s)
    assert result.best == best and "**best**" in (out / "best.md").read_text()
    config = read_toml(next(out.glob("*-b4-eager")) / rundir.CONFIG)
    assert config["model"]["attention"] == "flash" and config["data"]["prefetch"] and config["train"]["batch_size"] == 4


def test_best_rejects_an_unknown_compile_mode(tmp_path, tiny_dataset, capsys):
    code = main(["bench", "--best", "--preset", "micro", "--data", str(tiny_dataset), "--compile-modes", "fastest",
                 "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "unknown compile mode 'fastest'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_stop_request_ends_the_ladder_at_a_step_boundary(tmp_path, tiny_dataset):
    import threading

    stop = threading.Event()
    cfg = bench.BenchConfig(preset="micro", data=str(tiny_dataset), device="cpu", vocab_size=64, steps=50, warmup=1)
    result = bench.run_ladder(cfg, tmp_path / "out", stop=stop, on_step=lambda rung, e: stop.set())
    assert result.rungs[0].status == "skipped" and result.rungs[0].reason == "stopped during this rung"
    assert {r.reason for r in result.rungs[1:]} == {"stopped before this rung"}
    steps = [e for e in read_events(tmp_path / "out" / "0-baseline" / rundir.EVENTS)[0] if e.event == "step"]
    assert len(steps) < 50


def test_a_ladder_stopped_before_any_rung_leaves_no_directory(tmp_path, tiny_dataset):
    """Issue 22 item 10: F8 then stop at once left an empty runs/bench-... behind."""
    import threading

    stop = threading.Event()
    stop.set()
    cfg = bench.BenchConfig(preset="micro", data=str(tiny_dataset), device="cpu", vocab_size=64, steps=1, warmup=1)
    result = bench.run_ladder(cfg, tmp_path / "out", stop=stop)
    assert {r.reason for r in result.rungs} == {"stopped before this rung"}
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("native", ["none", "bf16"])
def test_the_amp_rung_runs_where_bf16_is_native_and_is_skipped_with_the_reason_where_it_is_emulated(monkeypatch, native):
    import torch

    monkeypatch.setenv(device.CPU_NATIVE_ENV, native)  # each side, whatever this CPU is
    value, reason = bench.applicable("speed.precision", "amp", torch.device("cpu"), 64)
    assert value == "bf16"
    if native == "bf16":
        assert reason is None
    else:
        assert reason is not None and "no native bf16" in reason and "emulates" in reason
