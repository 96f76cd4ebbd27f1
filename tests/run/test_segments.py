"""engine.run.segments: a run as segments of one set of speed switches each. The trainer's
`segment` events from real runs (micro preset, CPU), and the reading rules on logs written
by hand (old runs without segment events, live toggles, the settled figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import events as ev
from engine import rundir
from engine.config import RunConfig, resolve
from engine.run.segments import SWITCHES, changed, opening, segments_of, switches
from engine.text import describe

FLAGS = {"speed.device": "cpu", "speed.precision": "fp32", "train.eval_interval": 3, "train.ckpt_interval": 3,
         "train.log_interval": 1}  # fmt: skip


def test_switches_are_real_config_settings_and_old_configs_get_defaults() -> None:
    cfg = RunConfig()
    sw = switches(cfg)
    assert list(sw) == list(SWITCHES)
    assert sw["speed.compile"] is False and sw["train.batch_size"] == 16 and sw["optim.fused"] is None
    old = {"speed": {"compile": True}, "model": {"attention": "manual"}}  # written before most settings existed
    sw_old = switches(old)
    assert sw_old["speed.compile"] is True and sw_old["model.attention"] == "manual"
    assert sw_old["model.loss"] == "plain" and sw_old["data.prefetch"] is True


def test_changed_lists_old_and_new_per_switch_in_order() -> None:
    a = switches(RunConfig())
    b = dict(a, **{"speed.compile": True, "data.prefetch": False})
    assert changed(a, b) == {"speed.compile": [False, True], "data.prefetch": [True, False]}
    assert changed(a, dict(a)) == {}


def test_segment_event_round_trips_and_has_a_console_line() -> None:
    before = RunConfig()
    after = before.model_copy(update={"speed": before.speed.model_copy(update={"compile": True})})
    e = opening(after, 30, before.model_dump(mode="json"), "resume")
    assert e.changed == {"speed.compile": [False, True]}
    back = ev.parse_event(e.model_dump_json())
    assert isinstance(back, ev.Segment) and back == e
    assert describe(e) == "segment from step 30: compile off -> on (resume)"
    same = opening(after, 40, after, "resume")
    assert describe(same) == "segment from step 40: switches unchanged (resume)"
    assert describe(opening(after, 0, None, "start")) == ""  # run_started's line says it all


def _started(step: int, cfg: dict, t: float, peak: float | None = None) -> ev.RunStarted:
    return ev.RunStarted(time=t, config=cfg, n_params=1, device="cuda", device_name="x", precision="bf16",
                         start_step=step, flops_per_token=1000, peak_flops=peak)  # fmt: skip


def _step(step: int, st: float, mem: int | None = None, tokens_per_step: int = 128) -> ev.Step:
    return ev.Step(step=step, loss=3.0, lr=1e-3, grad_norm=1.0, step_time_s=st, tokens_per_s=tokens_per_step / st,
                   mfu=None, mem_bytes=mem, tokens=step * tokens_per_step)  # fmt: skip


def test_an_old_log_is_one_segment_per_run_started() -> None:
    base = RunConfig().model_dump(mode="json")
    compiled = RunConfig.model_validate({"speed": {"compile": True}}).model_dump(mode="json")
    log = [_started(0, base, 0.0), *(_step(s, 0.1) for s in range(1, 5)),
           _started(4, compiled, 100.0), _step(5, 5.0), *(_step(s, 0.05) for s in range(6, 10))]  # fmt: skip
    first, second = segments_of(log)
    assert (first.from_step, first.to_step, first.reason, first.changed) == (0, 4, "start", {})
    assert (second.from_step, second.to_step, second.reason) == (4, 9, "resume")
    assert second.changed == {"speed.compile": [False, True]}
    assert second.first_step_time_s == 5.0  # the compile warm-up stays in the first interval
    assert second.settled_step_time_s == ev.settled_step_time([5.0, 0.05, 0.05, 0.05, 0.05]) == 0.05
    assert second.tokens_per_s == pytest.approx(128 / 0.05)


def test_segment_events_replace_the_guess_and_a_live_toggle_splits_the_run() -> None:
    base = RunConfig().model_dump(mode="json")
    sw = switches(base)
    toggled = dict(sw, **{"data.prefetch": False})
    log = [
        _started(0, base, 0.0, peak=1e6),
        ev.Segment(step=0, switches=sw, changed={}, reason="start"),
        _step(1, 0.2, mem=100), _step(2, 0.1, mem=300),
        ev.Segment(step=2, switches=toggled, changed=changed(sw, toggled), reason="toggle"),
        _step(3, 0.3, mem=50), _step(4, 0.2, mem=60), _step(5, 0.2, mem=55),  # 3 reports: the settle window
        ev.Eval(step=5, val_loss=2.0),
    ]
    a, b = segments_of(log)
    assert (a.from_step, a.to_step, a.reason, a.peak_mem_bytes) == (0, 2, "start", 300)
    assert (b.from_step, b.to_step, b.reason, b.peak_mem_bytes) == (2, 5, "toggle", 60)
    assert b.switches == toggled and b.changed == {"data.prefetch": [True, False]}
    assert b.mfu == pytest.approx((128 / 0.2) * 1000 / 1e6)  # settled tok/s x FLOPs/token / peak


@pytest.fixture
def resumed_run(tmp_path: Path, tiny_dataset: Path) -> Path:
    """A real run: 3 steps, resumed to 6 with --no-pin-memory, then to 8 unchanged."""
    from engine.run.preflight import resumed_config
    from engine.run.owner import start

    run_dir = tmp_path / "run"
    start(resolve("micro", None, {**FLAGS, "data.path": str(tiny_dataset), "train.max_steps": 3}), run_dir).run()
    start(resumed_config(run_dir, {"data.pin_memory": False, "train.max_steps": 6}), run_dir, resume=True).run()
    start(resumed_config(run_dir, {"train.max_steps": 8}), run_dir, resume=True).run()
    return run_dir


@pytest.mark.slow
def test_the_trainer_opens_a_segment_at_each_start_and_resume(resumed_run: Path) -> None:
    events, problems = ev.read_events(resumed_run / rundir.EVENTS)
    assert problems == []
    marks = [e for e in events if isinstance(e, ev.Segment)]
    assert [(m.step, m.reason) for m in marks] == [(0, "start"), (3, "resume"), (6, "resume")]
    assert [m.changed for m in marks] == [{}, {"data.pin_memory": [True, False]}, {}]
    assert marks[1].switches["data.pin_memory"] is False and marks[2].switches["data.pin_memory"] is False
    kinds = [e.event for e in events]
    for i in (i for i, k in enumerate(kinds) if k == "segment"):
        assert kinds[i - 1] == "run_started"  # right after it: nothing of the segment precedes its mark

    segs = segments_of(events)
    assert [(s.from_step, s.to_step) for s in segs] == [(0, 3), (3, 6), (6, 8)]
    steps = [e for e in events if isinstance(e, ev.Step)]
    for s in segs:
        times = [e.step_time_s for e in steps if s.from_step < e.step <= s.to_step]
        assert s.first_step_time_s == times[0]
        assert s.mfu is None and s.peak_mem_bytes is None  # CPU: unknown, never invented
        if not ev.settles(times):  # the last segment's 2 steps: fewer than the settle window
            assert s.too_short_to_settle and s.settled_step_time_s is None and s.tokens_per_s is None
            continue
        assert s.settled_step_time_s == ev.settled_step_time(times)
        assert s.tokens_per_s == pytest.approx(4 * 32 / s.settled_step_time_s)
