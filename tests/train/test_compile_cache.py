"""torch.compile's caches kept in the gpt2-tui cache, and the cold vs warm first step.

One test compiles (about a minute on 2 cores): `bench --config --compile-cache both` on
micro. Structure, not timing: both runs are reported, the cold run filled the directory,
and the warm run compiled nothing new (the files it found are all there is afterwards).
"""

import json
import os

import pytest
import torch._functorch.config as aot_config
import torch._inductor.config as inductor_config

from engine.train import compile_cache
from engine.config import resolve
from bench import ladder, run as bench, timeline
from bench.common import BenchOptions, FirstStep


@pytest.fixture
def inductor_env(monkeypatch):
    """enable() sets TORCHINDUCTOR_CACHE_DIR for the process: put it back after the test."""
    monkeypatch.setenv(compile_cache.ENV, "/nonexistent/before-the-test")


def test_enable_keeps_the_caches_under_the_gpt2_tui_cache_and_switches_them_on(tmp_path, monkeypatch, inductor_env):
    monkeypatch.setenv("GPT2_TUI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(aot_config, "enable_autograd_cache", False)
    path = compile_cache.enable()
    assert path == tmp_path / "cache" / "torch-compile" and path.is_dir()
    assert os.environ[compile_cache.ENV] == str(path)
    assert inductor_config.fx_graph_cache and aot_config.enable_autograd_cache
    assert compile_cache.enable(tmp_path / "other") == tmp_path / "other" / "torch-compile"


def test_redirect_wins_inside_and_is_undone_after(tmp_path, monkeypatch, inductor_env):
    monkeypatch.setenv("GPT2_TUI_CACHE", str(tmp_path / "cache"))
    with compile_cache.redirect(tmp_path / "bench") as where:
        assert compile_cache.enable() == where == tmp_path / "bench"
    assert os.environ[compile_cache.ENV] == "/nonexistent/before-the-test"
    assert compile_cache.enable() == tmp_path / "cache" / "torch-compile"


def test_compile_cache_needs_a_compiled_config_and_a_tool_that_times_it(tmp_path, tiny_dataset, capsys):
    from engine.cli import guarded

    toml = tmp_path / "run.toml"
    toml.write_text(resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu"}).to_toml())
    for opts, words in [
        (BenchOptions(config=toml, compile_cache="both", out=tmp_path / "t"), "leaves off"),
        (BenchOptions(best=True, compile_cache="cold", out=tmp_path / "t"), "not --plain or --best"),
    ]:
        assert guarded(lambda: bench.run(opts)) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "t").exists()


def test_the_ladder_shows_a_compiled_rungs_cold_and_warm_first_step():
    firsts = [FirstStep(cache="cold", steps=3, first_step_s=41.5, startup_s=42.0, cache_files=50),
              FirstStep(cache="warm", steps=1, first_step_s=1.25, startup_s=1.5, cache_files=50)]  # fmt: skip
    rung = ladder.RungResult(name="compile", label="+ torch.compile", status="ran", precision="fp32", startup_s=42.0,
                             first_step_s=41.5, median_step_s=0.5, tokens_per_s=256.0, first_steps=firsts)  # fmt: skip
    plain = rung.model_copy(update={"name": "amp", "first_steps": []})
    rows = ladder.table_rows(ladder.LadderResult(preset="micro", rungs=[plain, rung]))
    column = rows[0].index("first step s")
    assert rows[1][column] == "41.50" and rows[2][column] == "41.50 cold, 1.25 warm"


@pytest.mark.slow
def test_bench_config_times_the_first_step_cold_then_warm(tmp_path, tiny_dataset, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text(resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu",
                                            "speed.compile": True}).to_toml())  # fmt: skip
    out = tmp_path / "t"
    assert bench.run(BenchOptions(config=toml, steps=2, compile_cache="both", out=out)) == 0
    t = timeline.Timeline.model_validate_json((out / "timeline.json").read_text())
    cold, warm = t.first_steps
    assert (cold.cache, cold.steps, warm.cache, warm.steps) == ("cold", 2, "warm", 1)
    assert cold.cache_files > 0  # the cold run filled the empty directory
    assert warm.cache_files == cold.cache_files  # the warm run read it and compiled nothing new
    assert cold.first_step_s == t.step_times_s[0] and t.compile_cache == "both"
    md = (out / "timeline.md").read_text()
    assert "| cold (empty directory) | 2 steps |" in md and "| warm (filled by the run above) | 1 step |" in md
    assert json.loads((out / "timeline.json").read_text())["first_steps"][1]["cache"] == "warm"
    assert sorted(p.name for p in out.iterdir()) == ["run", "run-warm-1step", "timeline.json", "timeline.md"]
