"""`train --tune` (issue 48) on the real engine, micro preset on CPU: each trial is a live
toggle, so a segment with its settled speed; what the launch's rules refuse or what would not fit
is never tried; a run killed mid-tune resumes mid-tune; under torchrun both ranks follow the
same trials; the tuned set is read back through the run's file rules by `--from-tuned`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import device, rundir
from engine.config import resolve
from engine.run import tune, tuned
from engine.run.preflight import open_data, preflight
from engine.run.requests import Control
from engine.run.segments import segments_of, switches
from engine.train import memory
from harness import CPU, QUIET, ROOT, force_cpu_native, micro_config, run_events, train, trained

STEPS = 120
TUNED = QUIET | {"train.max_steps": STEPS, "speed.tune": True, "speed.tune_budget": "100%"}


def _plan(config) -> tune.State:
    """The tuner's plan for `config` (as its first step boundary makes it), its events kept."""
    said: list = []
    tuner = tune.Tuner(Path(config.out_dir or "."))
    tuner._save = lambda: None  # a plan, not a run: nothing to write
    tuner.at_boundary(0, config, Control(), said.append)
    assert said[0].event == "tune_plan"
    return tuner.state


def test_a_precision_the_cpu_only_emulates_is_never_a_candidate(tiny_dataset, monkeypatch):
    config, _ = open_data(micro_config(tiny_dataset))
    force_cpu_native(monkeypatch, "none")
    state = _plan(config)
    assert not any("precision" in t.label for t in state.trials)
    assert any(s.startswith("precision bf16: this CPU has no native bf16") for s in state.skipped)
    force_cpu_native(monkeypatch, "bf16")
    state = _plan(config)
    assert [t.change for t in state.trials if "precision" in t.label] == [{"speed.precision": "bf16"}]
    assert not any(s.startswith("precision bf16") for s in state.skipped)


def test_what_the_switch_matrix_refuses_is_never_planned(tiny_dataset):
    """reduce-overhead replays CUDA graphs that overwrite accumulated gradients: the matrix refuses
    it with grad accumulation on every device, so the micro-batch split is not a trial."""
    config, _ = open_data(micro_config(tiny_dataset, **{"speed.compile": True, "speed.compile_mode": "reduce-overhead"}))
    state = _plan(config)
    b = config.train.batch_size
    assert not any(t.change.get("train.grad_accum", 1) > 1 for t in state.trials)
    (why,) = [s for s in state.skipped if s.startswith(f"micro-batch {b // 2} x 2")]
    assert "reduce-overhead with grad accumulation 2" in why


def test_what_would_not_fit_is_never_planned(tiny_dataset, monkeypatch):
    """The memory estimate judges each candidate against the device's budget, as a toggle is."""
    config, _ = open_data(micro_config(tiny_dataset, **{"train.batch_size": 4, "train.grad_accum": 2}))
    wide = config.model_copy(update={"train": config.train.model_copy(update={"batch_size": 8, "grad_accum": 1})})
    now, bigger = memory.estimate(config).peak_bytes, memory.estimate(wide).peak_bytes
    assert bigger > now
    monkeypatch.setattr(device, "budget", lambda kind, held=None: ((now + bigger) // 2, "RAM available"))
    state = _plan(config)
    assert {"train.batch_size": 2, "train.grad_accum": 4} in [t.change for t in state.trials]
    assert {"train.batch_size": 8, "train.grad_accum": 1} not in [t.change for t in state.trials]
    (why,) = [s for s in state.skipped if s.startswith("micro-batch 8 x 1")]
    assert "memory" in why or "fit" in why


def _trials(events, *statuses: str) -> list:
    return [e for e in events if e.event == "tune_trial" and e.status in statuses]


@pytest.mark.slow
def test_every_trial_is_a_segment_with_its_settled_speed_and_the_tokens_are_the_runs(tmp_path, tiny_dataset, monkeypatch):
    force_cpu_native(monkeypatch, "none")
    events = trained(tmp_path / "tuned", tiny_dataset, **TUNED)
    plain = trained(tmp_path / "plain", tiny_dataset, **(QUIET | {"train.max_steps": STEPS}))

    steps = [e.step for e in events if e.event == "step"]
    assert steps == list(range(1, STEPS + 1))  # every step once, across every trial's segment
    tokens = lambda evs: [e.tokens for e in evs if e.event == "step"][-1]  # noqa: E731
    assert tokens(events) == tokens(plain)
    (plan,) = [e for e in events if e.event == "tune_plan"]
    assert plan.trials and any("precision bf16" in s for s in plan.skipped)

    measured = _trials(events, "measured", "contended")
    assert len(measured) >= 3, [(e.label, e.status, e.reason) for e in _trials(events, "measured", "skipped", "unsettled")]
    segments = segments_of(events)
    for t in measured:  # its figure is its segment's settled speed, by the Segments tab's own rule
        (seg,) = [s for s in segments if s.switches == t.switches and s.from_step < t.step <= s.to_step]
        assert seg.settled_step_time_s == pytest.approx(t.settled_step_time_s, rel=1e-9)
    asked = [e for e in events if e.event == "request" and e.id.startswith(tune.ID_PREFIX)]
    toggles = [s for s in segments if s.reason == "toggle"]
    assert len(toggles) == len(asked) and all(a.status == "applied" for a in asked)

    (done,) = [e for e in events if e.event == "tune_done"]
    best = min(measured, key=lambda t: t.settled_step_time_s)
    chosen = [t for t in measured if t.switches == done.switches]
    assert chosen and chosen[0].settled_step_time_s <= best.settled_step_time_s * tune.KEEP_GAIN
    assert segments[-1].switches == done.switches  # the rest of the run trains with what was chosen
    state, why = tune.load_state(tmp_path / "tuned")
    assert why is None and state.done

    config, _ = open_data(micro_config(tiny_dataset, **{"speed.from_tuned": True}))
    verdict = preflight(config, explicit={"speed.from_tuned": True})
    started = switches(verdict.raise_first())
    assert {n: started[n] for n in done.switches} == done.switches
    assert any(n.startswith("--from-tuned: ") for n in verdict.config.notes)

    _dashboard_shows_the_tune(tmp_path / "tuned")


def _dashboard_shows_the_tune(run_dir: Path) -> None:
    import asyncio

    from tui.app import GPT2App
    from harness import until

    async def go() -> tuple[str, str]:
        app = GPT2App(attach_dir=run_dir)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: "tuned" in str(app.screen.query_one("#status").render()), "the tune's word")
            await pilot.press("4")  # the Segments tab
            await until(pilot, lambda: "trial" in str(app.screen.query_one("#tune").render()), "the tune's table")
            return str(app.screen.query_one("#status").render()), str(app.screen.query_one("#tune").render())

    status, table = asyncio.run(go())
    assert "tuned" in status
    assert "trial" in table and "the start" in table and "ms/step" in table and "tune done at step" in table


def _seen(run: Path, match) -> dict | None:
    """The first event of a live run's log that `match`es (its torn last line skipped)."""
    if not (run / rundir.EVENTS).exists():
        return None
    for line in (run / rundir.EVENTS).read_text().splitlines():
        e = json.loads(line) if line.endswith("}") else {}
        if match(e):
            return e
    return None


@pytest.mark.slow
def test_a_tune_asked_of_a_live_run_and_killed_mid_tune_resumes_mid_tune(tmp_path, tiny_dataset):
    """`toggle RUN --tune` starts the tuner of a run launched without it; a kill -9 in its second
    trial, then `--resume`: the same tune goes on from that trial (tune.json), not planned anew."""
    from harness import cli_process

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "engine.cli", "train", "--preset", "micro", "--device", "cpu", "--precision", "fp32",
           "--data", str(tiny_dataset), "--out", str(run), "--max-steps", str(STEPS), "--tune-budget", "100%",
           "--eval-interval", "100", "--ckpt-interval", "100", "--sample-tokens", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    killed_in = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not _seen(run, lambda e: e.get("event") == "step"):
            time.sleep(0.1)
        asked = cli_process("toggle", run, "--tune")
        assert asked.returncode == 0 and "to tune itself" in asked.stdout, asked.stderr
        while time.monotonic() < deadline and proc.poll() is None and killed_in is None:
            time.sleep(0.2)
            e = _seen(run, lambda e: e.get("event") == "tune_trial" and e.get("status") == "trying" and e["index"] >= 2)
            killed_in = e and e["index"]
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert killed_in is not None, "the tune never reached its second trial"
    assert _seen(run, lambda e: e.get("event") == "request" and e.get("kind") == "tune")["status"] == "applied"
    state, why = tune.load_state(run)
    assert why is None and not state.done and state.current == killed_in

    assert train(run, resume=True) == "completed"
    events = run_events(run)
    assert len([e for e in events if e.event == "tune_plan"]) == 1  # not planned anew
    after = [e for e in events if e.event == "tune_trial" and e.index == killed_in and e.status != "trying"]
    assert after, "the trial it was killed in was not finished on resume"
    ended = [e.index for e in events if e.event == "tune_trial" and e.status != "trying"]
    assert len(set(ended)) == len(ended)  # each trial ends once: the one killed ends after the resume
    assert [e.event for e in events].count("tune_done") == 1
    assert tune.load_state(run)[0].done
    assert [e.step for e in events if e.event == "step"][-1] == STEPS


@pytest.mark.slow
def test_under_torchrun_both_ranks_follow_the_same_trials(tmp_path, tiny_dataset):
    """120 steps: the ranks agree on each trial's toggle about every 0.2 s, tens of micro's steps."""
    from harness import cli_process

    run = tmp_path / "run"
    proc = cli_process("train", "--preset", "micro", "--device", "cpu", "--precision", "fp32", "--data", tiny_dataset,
                       "--out", run, "--nproc", "2", "--max-steps", "120", "--tune", "--tune-budget", "40",
                       "--eval-interval", "100", "--ckpt-interval", "100", "--sample-tokens", "0",
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=420)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = run_events(run)
    assert all(e.world_size == 2 for e in events if e.event == "run_started")
    assert len([e for e in events if e.event == "segment"]) >= 3  # the start and at least two trials
    steps = [e for e in events if e.event == "step"]
    assert [e.step for e in steps] == list(range(1, 121))
    assert all(len(e.rank_step_times or []) == 2 for e in steps)  # both ranks stepped every step of every trial
    assert len(_trials(events, "measured", "contended")) >= 2
    assert [e.event for e in events].count("tune_done") == 1


def test_the_tuned_set_is_read_by_the_file_rules(tiny_dataset, tmp_path):
    """tuned/*.json is untrusted: a link, a FIFO, torn or huge JSON, names that are no speed
    switch, values no config takes, another machine's key: each is one line, and the run starts
    with its own switches. A good one applies, under the flags the user gave."""
    config, _ = open_data(micro_config(tiny_dataset))
    path = tuned.tuned_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    good = tuned.Tuned(key=tuned.tuned_key(config), switches={**switches(config), "model.loss": "chunked",
                                                             "train.batch_size": 2, "train.grad_accum": 2})

    def started(explicit: dict | None = None):
        c, line = tuned.from_tuned(config, explicit)
        return switches(c), line

    def planted(write) -> str:
        path.unlink(missing_ok=True) if not path.is_dir() else path.rmdir()
        write()
        now, line = started()
        assert now == switches(config), line
        return line

    assert "none saved yet" in planted(lambda: None)
    target = tmp_path / "elsewhere.json"
    target.write_text(good.model_dump_json())
    assert "could not be read" in planted(lambda: path.symlink_to(target))
    assert "could not be read" in planted(lambda: os.mkfifo(path))
    assert "could not be read" in planted(lambda: path.write_text('{"version": 1, "key": '))
    assert "could not be read" in planted(lambda: path.write_text("[" * 100_000))
    assert "could not be read" in planted(lambda: path.write_bytes(b" " * (tuned.CAP + 1)))
    bad = good.model_copy(update={"switches": {"optim.lr": 1.0}})
    assert "not speed switches" in planted(lambda: path.write_text(bad.model_dump_json()))
    bad = good.model_copy(update={"switches": {"model.loss": "\x1b[31mfast"}})
    line = planted(lambda: path.write_text(bad.model_dump_json()))
    assert "no config takes" in line and "\x1b" not in line
    assert "not a tuned set" in planted(lambda: path.write_text(good.model_dump_json().replace('"gain":null', '"gain":NaN')))
    bad = good.model_copy(update={"key": {**good.key, "device": "another"}})
    assert "another machine" in planted(lambda: path.write_text(bad.model_dump_json()))
    path.unlink()
    path.write_text(good.model_dump_json())
    now, line = started()
    assert now["model.loss"] == "chunked" and (now["train.batch_size"], now["train.grad_accum"]) == (2, 2), line
    now, line = started({"model.loss": "plain", "train.batch_size": 4})  # the user's flags win
    assert now["model.loss"] == "plain" and now["train.batch_size"] == config.train.batch_size


def test_a_tune_state_that_is_not_one_is_said_and_not_used(tmp_path):
    (tmp_path / tune.STATE).symlink_to(tmp_path / "x")
    assert tune.load_state(tmp_path)[1].startswith("tune.json could not be read")
    (tmp_path / tune.STATE).unlink()
    (tmp_path / tune.STATE).write_text(json.dumps({"version": 1, "start": {}, "trials": [], "budget": "20%"}))
    assert tune.load_state(tmp_path)[1] == "tune.json names trials it does not hold"
    (tmp_path / tune.STATE).write_text(json.dumps({"version": 1, "start": {}, "budget": "20%",
                                                   "trials": [{"label": "x", "switches": {"optim.lr": 1}}]}))
    assert "not speed switches" in tune.load_state(tmp_path)[1]
    for planted in ('{"label": "x", "settled_step_time_s": NaN}', '{"label": "x", "switches": {"train.batch_size": 1e400}}',
                    '{"label": "x", "from_step": -1}'):  # fmt: skip
        (tmp_path / tune.STATE).write_text('{"version": 1, "start": {}, "budget": "20%", "trials": [' + planted + ']}')
        assert "is not a tune's state" in tune.load_state(tmp_path)[1], planted
    assert tune.load_state(tmp_path / "none") == (None, None)


def test_the_budget_reads_as_a_share_steps_or_seconds():
    config = resolve("micro", None, CPU | {"train.max_steps": 200})
    assert tune._budget("20%", config) == (40, None)
    assert tune._budget("60", config) == (60, None)
    assert tune._budget("90s", config) == (None, 90.0)



@pytest.mark.slow
def test_a_trial_that_runs_out_of_memory_is_not_tried_again_on_resume(tmp_path, tiny_dataset, monkeypatch):
    """The estimate said the micro-batch split fits, and the device disagreed: the run stops with
    the out-of-memory line (raised by a patched step, no GPU here; the rest is the real run), and
    its resume skips that trial, with the reason, and tunes on to the end."""
    import torch

    from engine.train import guard
    from engine.train.trainer import Trainer

    original = Trainer.train_step

    def train_step(self, lr):
        if self.config.train.grad_accum == 2:  # the "micro-batch 2 x 2" trial
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, lr)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    run = tmp_path / "run"
    with pytest.raises(guard.OutOfMemory):
        train(run, tiny_dataset, **TUNED)
    state, _ = tune.load_state(run)
    (split,) = [t for t in state.trials if t.change.get("train.grad_accum") == 2]
    assert split.status == "skipped" and split.reason.startswith("out of memory at step")

    assert train(run, resume=True) == "completed"  # still patched: trying it again would fail again
    events = run_events(run)
    assert [e.reason for e in events if e.event == "tune_trial" and e.label == split.label and e.status == "skipped"]
    (done,) = [e for e in events if e.event == "tune_done"]
    assert done.switches["train.grad_accum"] == 1 and any(s.startswith(split.label) for s in done.skipped)


def test_the_steps_a_trials_toggle_waits_to_reach_every_rank_are_not_the_budgets(tiny_dataset, tmp_path):
    """Under torchrun the ranks agree on requests about every 0.2 s (distributed.agree): at a few
    ms a step a trial's toggle waits tens of boundaries before it applies, training the old
    switches. Those boundaries are not tuning: a 16-step budget still measures the trial that
    waited 23 (CI saw a torchrun tune whose second trial was cut by its budget this way)."""
    from engine import events as ev
    from engine.run import toggle

    config, _ = open_data(micro_config(tiny_dataset, **{"speed.tune_budget": "16", "train.max_steps": 200,
                                                        "train.log_interval": 1}))  # fmt: skip
    tuner, said, control = tune.Tuner(tmp_path), [], Control()

    def steps(first: int, last: int) -> None:
        for i in range(first, last + 1):
            tuner.emit(ev.Step(step=i, loss=3.0, lr=1e-3, grad_norm=1.0, step_time_s=0.01, tokens_per_s=1e4, mfu=None,
                               mem_bytes=None, tokens=i * 64))  # fmt: skip

    tuner.at_boundary(0, config, control, said.append)  # the plan; the start is trial 0
    steps(1, 7)
    tuner.at_boundary(7, config, control, said.append)  # the start measured: trial 1's toggle asked
    (asked,) = control.take()
    for boundary in range(8, 31):  # the toggle on its way to every rank: the old switches train on
        steps(boundary, boundary)
        tuner.at_boundary(boundary, config, control, said.append)
    trial = tuner.state.trials[1]
    now = toggle.check(config, asked.switches)
    tuner.emit(ev.Segment(step=30, switches=switches(now), changed={}, reason="toggle"))
    for boundary in range(31, 38):
        steps(boundary, boundary)
        tuner.at_boundary(boundary, now, control, said.append)
    assert trial.status == "measured", trial.reason
    assert trial.settled_step_time_s == pytest.approx(0.01)
