"""`engine.inspect.runs`: run directories at a glance. One real run from the engine (micro preset,
tiny dataset, CPU), the other states from hand-written run directories in the same format."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import events as ev
from engine import rundir
from engine.inspect.runs import RunSummary, format_table, list_runs, summarize


def write_run(root: Path, name: str, t0: float, *, steps: int = 4, max_steps: int = 10, end: str | None = None,
              writer: str | None = None, vals: tuple[float, ...] = (5.0, 4.5), preset: str = "nano") -> Path:  # fmt: skip
    """A run directory as the trainer leaves it: config.toml, events.jsonl, maybe writer.pid.
    end: None (no ending), "completed", "stopped" or "failed"; writer: "alive" or "dead"."""
    d = root / name
    (d / rundir.CHECKPOINTS).mkdir(parents=True)
    (d / rundir.CONFIG).write_text(f'preset = "{preset}"\n[train]\nmax_steps = {max_steps}\n')
    config = {"preset": preset, "model": {"vocab_size": 8192}, "train": {"max_steps": max_steps}}
    out = [ev.RunStarted(time=t0, config=config, n_params=1_858_304, device="cuda", device_name="NVIDIA H100",
                         precision="bf16", flops_per_token=1)]  # fmt: skip
    for s in range(1, steps + 1):
        out.append(ev.Step(time=t0 + s, step=s, loss=6.0 - s / 10, lr=1e-3, grad_norm=0.5, step_time_s=0.1 * (2 if s == 1 else 1),
                           tokens_per_s=1000.0 / (0.1 * (2 if s == 1 else 1)), mfu=None, mem_bytes=None, tokens=100 * s))  # fmt: skip
    for k, v in enumerate(vals):
        out.append(ev.Eval(time=t0 + 0.5 + k, step=k, val_loss=v))
    if end in ("completed", "stopped"):
        out.append(ev.RunFinished(time=t0 + steps + 1, step=steps, reason=end, best_val_loss=min(vals),
                                  summary={"tokens_per_s": 10_000.0, "median_step_time_s": 0.1}))  # fmt: skip
    elif end == "failed":
        out.append(ev.RunFailed(time=t0 + steps + 1, step=steps, error="RuntimeError: CUDA out of memory"))
    (d / rundir.EVENTS).write_text("".join(e.model_dump_json() + "\n" for e in out))
    if writer == "alive":  # a live writer holds the run's lock (the one liveness rule); this process does
        claim(d)
    elif writer == "dead":
        (d / rundir.WRITER).write_text(f"{socket.gethostname()} {dead_pid()}\n")
    return d


_claimed: list[Path] = []


def claim(d: Path) -> None:
    """This process becomes the run's writer (lock + writer.pid), until the test ends."""
    rundir.claim_writer(d)
    _claimed.append(d)


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    yield
    while _claimed:
        rundir.release_writer(_claimed.pop())


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def by_name(runs: list[RunSummary]) -> dict[str, RunSummary]:
    return {r.name: r for r in runs}


@pytest.mark.slow
def test_a_real_run_from_the_engine(tmp_path: Path, tiny_dataset: Path) -> None:
    from engine.config import resolve
    from engine.run.owner import start  # the one front door

    root = tmp_path / "runs"
    run_dir = root / "micro-real"
    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "speed.precision": "fp32",
                                     "train.max_steps": 12})  # fmt: skip
    start(config, run_dir).run()
    events, _ = ev.read_events(run_dir / rundir.EVENTS)
    started = next(e for e in events if e.event == "run_started")
    finished = events[-1]
    vals = [e.val_loss for e in events if e.event == "eval"]

    (r,) = list_runs(root)
    assert r.name == "micro-real" and r.path == run_dir
    assert r.state == "completed" and not (run_dir / rundir.WRITER).exists()
    assert (r.step, r.max_steps) == (12, 12)
    assert r.preset == "micro" and r.vocab == 64 and r.n_params == started.n_params
    assert r.best_val_loss == pytest.approx(min(vals))
    assert r.settled_tokens_per_s == pytest.approx(finished.summary["tokens_per_s"])
    assert r.device_name == started.device_name
    assert r.started.timestamp() == pytest.approx(started.time)
    table = format_table([r]).splitlines()
    assert len(table) == 3 and table[0].split()[:3] == ["name", "model", "state"]
    assert table[2].startswith("to target: training time (sum of step times) and tokens to first reach val loss ")
    assert "micro" in table[1] and "v64" in table[1] and "12/12" in table[1] and "completed" in table[1]


@pytest.mark.slow
def test_states_steps_losses_and_order(tmp_path: Path) -> None:
    write_run(tmp_path, "done", 1000.0, end="completed")
    write_run(tmp_path, "halted", 2000.0, end="stopped", steps=3)
    write_run(tmp_path, "crashed", 3000.0, end="failed", writer="dead")
    write_run(tmp_path, "orphan", 4000.0, writer="dead", steps=7)
    write_run(tmp_path, "live", 5000.0, writer="alive", steps=9, vals=(5.0, 3.25, 4.0))
    runs = list_runs(tmp_path)
    assert [r.name for r in runs] == ["live", "orphan", "crashed", "halted", "done"]  # newest first
    s = by_name(runs)
    assert {n: r.state for n, r in s.items()} == {
        "done": "completed", "halted": "stopped", "crashed": "failed", "orphan": "writer gone", "live": "running",
    }  # fmt: skip
    assert (s["orphan"].step, s["orphan"].max_steps) == (7, 10)
    assert s["live"].best_val_loss == 3.25 and s["done"].best_val_loss == 4.5
    assert s["done"].settled_tokens_per_s == 10_000.0  # the run's own settled figure
    assert s["live"].settled_tokens_per_s == pytest.approx(10_000.0)  # median past the slow first step
    assert s["crashed"].error == "RuntimeError: CUDA out of memory"
    lines = format_table(runs).splitlines()
    assert len(lines) == 7 and lines[0].startswith("name")
    assert lines[-1].startswith("to target: ") and "(the worst final val loss among these runs)" in lines[-1]
    lines = lines[:-1]
    assert [ln.split()[0] for ln in lines[1:]] == ["live", "orphan", "crashed", "halted", "done"]
    assert "writer gone" in lines[2] and "7/10" in lines[2] and "nano 1.9M v8192" in lines[2]


def test_a_resumed_run_reads_its_last_segment(tmp_path: Path) -> None:
    d = write_run(tmp_path, "twice", 1000.0, end="stopped", steps=3)
    with open(d / rundir.EVENTS, "a") as f:
        cfg = {"preset": "nano", "model": {"vocab_size": 8192}, "train": {"max_steps": 20}}
        f.write(ev.RunStarted(time=2000.0, config=cfg, n_params=5, device="cpu", device_name="CPU", precision="fp32",
                              flops_per_token=1, start_step=3).model_dump_json() + "\n")  # fmt: skip
    claim(d)  # the resumed segment's writer: it holds the lock
    r = summarize(d)
    assert r is not None and r.state == "running" and r.step == 3 and r.max_steps == 20
    assert r.device_name == "CPU" and r.n_params == 5
    assert r.started.timestamp() == 1000.0  # when the run began, not the segment


def test_torn_and_garbage_lines_missing_files_and_non_runs(tmp_path: Path) -> None:
    d = write_run(tmp_path, "messy", 1000.0, end="completed", steps=5)
    text = (d / rundir.EVENTS).read_text().splitlines()
    text.insert(2, "garbage \x00 not json")
    text.insert(3, '{"event": "step", "step": "x"}')
    text.insert(4, "[1, 2, 3]")
    text.insert(5, '{"event": "eval", "step": 1, "val_loss": NaN}')
    (d / rundir.EVENTS).write_text("\n".join(text) + '\n{"time": 1, "event": "st')  # torn by a kill
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("hello")
    (tmp_path / "a-file.txt").write_text("not a directory")
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / rundir.CONFIG).write_text("this is = = not toml")
    runs = by_name(list_runs(tmp_path))
    assert set(runs) == {"messy", "config-only"}
    assert runs["messy"].state == "completed" and runs["messy"].step == 5 and runs["messy"].best_val_loss == 4.5
    lonely = runs["config-only"]
    assert lonely.state == "writer gone" and lonely.step == 0 and lonely.preset is None and lonely.n_params is None
    assert "config-only" in format_table(list(runs.values()))


def test_missing_or_empty_root_and_a_run_dir_given_as_root(tmp_path: Path) -> None:
    assert list_runs(tmp_path / "nope") == []
    assert list_runs(tmp_path) == []
    assert format_table([]) == "no runs found"
    d = write_run(tmp_path, "solo", 1000.0, end="completed")
    assert [r.name for r in list_runs(d)] == ["solo"]


def test_a_growing_log_is_read_again(tmp_path: Path) -> None:
    d = write_run(tmp_path, "grow", 1000.0, writer="alive", steps=2)
    assert summarize(d).step == 2
    with open(d / rundir.EVENTS, "a") as f:
        f.write(ev.Step(time=1010.0, step=3, loss=1.0, lr=1e-3, grad_norm=0.1, step_time_s=0.1, tokens_per_s=1000.0,
                        mfu=None, mem_bytes=None, tokens=300).model_dump_json() + "\n")  # fmt: skip
        f.write(ev.RunFinished(time=1011.0, step=3, reason="completed").model_dump_json() + "\n")
    r = summarize(d)
    assert r.step == 3 and r.state == "completed"  # the finish counts even while writer.pid is still there
