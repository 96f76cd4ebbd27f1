"""Every number read back from a run's files is bounded at its one reading (engine.events: the event
models' numeric types; the mailbox's parser; a checkpoint's counters at resume). A line holding 10**400,
Infinity, NaN, 1e300, -1 or 2**63 in any numeric field of any event model is either skipped with one
warning, like a torn line, or read as a number every reader can compute with; and every reader
(`compare` plain, --json, --target and --tui, `runs`, attach's tail and the dashboard's model, the
Segments reader, the Compare screen's model) reads the good lines around it and goes on.

The models come from the `Event` union and their numeric fields from their annotations (and, in the
free-form parts, from a real run's config, summary and switches): a new event or field is covered as
it lands, and must say its range (`engine.events`: Count, Measure, Figure, Timestamp, Loss, Plain)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import shutil
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from harness import MICRO, bigram_tokens, cli_fails, until, write_gpt2tui
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from engine import events as ev
from engine import rundir
from engine.gpu_monitor import GpuSample
from engine.inspect import compare as cmp
from engine.run import requests
from engine.run.segments import segments_of
from gpt2_tui import main

# the values planted, as JSON text (what a hand-edited or hostile line holds)
EXTREMES = {"10**400": "1" + "0" * 400, "-1": "-1", "2**63": str(2**63), "1e300": "1e300", "inf": "Infinity",
            "-inf": "-Infinity", "nan": "NaN"}  # fmt: skip
# what no reader may ever see where a number is not a loss (a loss may be NaN/Inf: a diverged step),
# and beyond int64 where the number is a count (an int); -1 and 1e300 are each field's own call
MUST_SKIP = {"10**400", "inf", "-inf", "nan"}
TRAIN = [*MICRO, "--eval-interval", "3", "--ckpt-interval", "3", "--log-interval", "1"]
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


# ------------------------------------------------------------------------------ the models, by introspection


def event_models() -> list[type[BaseModel]]:
    """Every member of the Event union (what EventLines reads)."""
    union = get_args(ev.Event)[0]
    return list(get_args(union))


def _numeric(ann: Any) -> bool:
    """An annotation that holds an int or a float somewhere (Optional, list, dict, a nested model)."""
    if ann in (int, float):
        return True
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return any(_numeric(f.annotation) for f in ann.model_fields.values())
    return any(_numeric(a) for a in get_args(ann) if not isinstance(a, FieldInfo))


def _loss(field: FieldInfo) -> bool:
    """Declared as a loss (events.Loss: allow_inf_nan=True), which may be NaN/Inf."""

    def walk(x: Any) -> bool:
        if isinstance(x, FieldInfo):
            return any(walk(m) for m in x.metadata)
        if getattr(x, "allow_inf_nan", None) is True:
            return True
        return any(walk(a) for a in get_args(x))

    return any(walk(m) for m in field.metadata) or walk(field.annotation)


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every number (not a bool) in a JSON-like value."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def templates(events: list[Any]) -> dict[type, BaseModel]:
    """One valid event of each model with every numeric field holding a number: a real run's
    own where it logged one (its config, summary and switches are real), made here otherwise."""
    first = {type(e): e for e in reversed(events)}
    t0 = first[ev.RunStarted].time
    seg = first[ev.Segment]
    out = {
        ev.RunStarted: first[ev.RunStarted].model_copy(update={"attention_ms": {"flash": 1.5}}),
        ev.Step: first[ev.Step].model_copy(update={"rank_step_times": [0.1, 0.2]}),
        ev.Eval: first[ev.Eval],
        ev.Checkpoint: first[ev.Checkpoint],
        ev.RunFinished: first[ev.RunFinished].model_copy(update={"summary": first[ev.RunFinished].summary
                                                                  | {"peak_mem_bytes": 1 << 20}}),  # fmt: skip
        ev.Segment: seg.model_copy(update={"changed": {"train.micro_batch": [4, 2]}}),
        ev.Warning_: ev.Warning_(time=t0, message="a warning"),
        ev.RunFailed: ev.RunFailed(time=t0, step=3, error="RuntimeError: boom"),
        ev.Sample: ev.Sample(time=t0, step=3, text="a sample"),
        ev.Paused: ev.Paused(time=t0, step=3),
        ev.Resumed: ev.Resumed(time=t0, step=3),
        ev.Gpu: ev.Gpu(time=t0, gpus=[GpuSample(t=t0, index=0, name="H100", util_pct=50.0, mem_used_bytes=1 << 30,
                                                mem_total_bytes=80 << 30, power_w=300.0, temp_c=60.0,
                                                sm_clock_mhz=1980)]),  # fmt: skip
        ev.RequestAck: ev.RequestAck(time=t0, step=3, id="r1", kind="pause", status="applied"),
        ev.Compiled: ev.Compiled(time=t0, step=1, scope="model", compiled=True, graphs=2, compile_s=3.0, source="cold",
                                 cache_hits=1, cache_misses=2),  # fmt: skip
        ev.TunePlan: ev.TunePlan(time=t0, step=0, trials=["compile"], skipped=["precision bf16: emulated"], budget="20%",
                                 budget_steps=12, budget_s=90.0, steps_per_trial=6),  # fmt: skip
        ev.TuneTrial: ev.TuneTrial(time=t0, step=6, index=1, of=2, label="compile", switches=seg.switches,
                                   status="measured", settled_step_time_s=0.1, spread=0.05, warmup_s=2.0, vs_start=1.2,
                                   contention=ev.Contention(load=0.5, cores=2, cpu=1.9, stolen=0.01)),  # fmt: skip
        ev.TuneDone: ev.TuneDone(time=t0, step=12, switches=seg.switches, changed={"speed.compile": [False, True]},
                                 gain=1.2, trials=2, skipped=[], reason="every planned trial was tried"),  # fmt: skip
    }
    missing = [m.__name__ for m in event_models() if m not in out]
    assert not missing, f"a new event model: give it a template here so its numbers are planted: {missing}"
    out = {model: _filled(e) for model, e in out.items()}
    for model, e in out.items():
        data = e.model_dump(mode="json")
        for name, field in model.model_fields.items():
            if _numeric(field.annotation):
                assert any(p[0] == name for p in _leaves(data)), f"{model.__name__}.{name}: no number in its template"
    return out


def _models_in(ann: Any) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in get_args(ann) if not isinstance(a, FieldInfo) for m in _models_in(a)]


def _filled(e: BaseModel) -> BaseModel:
    """Every numeric field a template leaves None given a number (a nested model: its numbers 1), so
    an optional field is planted as soon as it lands."""
    data = e.model_dump(mode="json")
    for name, field in type(e).model_fields.items():
        if data.get(name) is None and _numeric(field.annotation):
            nested = _models_in(field.annotation)
            data[name] = {n: 1 for n, f in nested[0].model_fields.items() if _numeric(f.annotation)} if nested else 1
    return type(e).model_validate(data)


def cases(tpl: dict[type, BaseModel]) -> list[tuple[type, tuple, str]]:
    """(model, path to a number in its line, extreme) for every number of every model."""
    return [(m, p, x) for m, e in tpl.items() for p in _leaves(e.model_dump(mode="json")) for x in EXTREMES]


def planted(e: BaseModel, path: tuple, extreme: str) -> bytes:
    """The event's line with the number at `path` written as EXTREMES[extreme]."""
    data = e.model_dump(mode="json")
    where = data
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = "@@PLANTED@@"
    return json.dumps(data).replace('"@@PLANTED@@"', EXTREMES[extreme]).encode()


def must_skip(tpl: dict[type, BaseModel], model: type, path: tuple, extreme: str) -> bool:
    """Out of every reader's range, whatever the field: skipped (a loss alone may be NaN/Inf; an
    int, a count, is never beyond int64)."""
    if is_detail(model, path):
        return False  # a detail reads as unknown and the event stays (issue 46 class D2: detail_unknown)
    if extreme == "2**63":
        return isinstance(_at(tpl[model].model_dump(mode="json"), path), int)
    return extreme in MUST_SKIP and not _loss(model.model_fields[path[0]])


def is_detail(model: type, path: tuple) -> bool:
    """A field events.or_unknown reads: a run_started's details, a step's or a tune trial's contention."""
    return (model is ev.RunStarted and path[0] in DETAILS) or (model in (ev.Step, ev.TuneTrial) and path[0] == "contention")


def detail_unknown(read: BaseModel, path: tuple) -> bool:
    """The planted detail read as unknown: None where it was, or the whole detail emptied."""
    data: Any = read.model_dump()
    for key in path:
        if not isinstance(data, (dict, list)) or (isinstance(data, dict) and key not in data):
            return True
        data = data[key]
    return data is None


# ------------------------------------------------------------------------------ a real run, and run dirs


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes], dict[type, BaseModel]]:
    """A real 6-step micro run (evals, checkpoints, a finish): its dir, its lines, the templates."""
    root = tmp_path_factory.mktemp("numbers")
    data = write_gpt2tui(root / "data", bigram_tokens(20_000, 64, 1), bigram_tokens(4_000, 64, 2), 64)
    run = root / "good"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", *TRAIN, "--data", str(data), "--max-steps", "6", "--out", str(run)]) == 0
    lines = (run / rundir.EVENTS).read_bytes().splitlines()
    events, problems = ev.read_events(run / rundir.EVENTS)
    assert problems == [] and len(events) == len(lines)
    return run, lines, templates(events)


def run_with(good: Path, root: Path, lines: list[bytes], name: str = "bad") -> Path:
    """A copy of the good run's files (config, events) with these lines as its events."""
    d = root / name
    d.mkdir(parents=True)
    shutil.copy2(good / rundir.CONFIG, d / rundir.CONFIG)
    (d / rundir.EVENTS).write_bytes(b"".join(line + b"\n" for line in lines))
    return d


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def every_reader(run: Path, root: Path, good_run: Path, skipped: int) -> None:
    """Every reader over `run`: no crash, the right exit codes, the good lines read, one warning a skip."""
    events, problems = ev.read_events(run / rundir.EVENTS)
    assert len(problems) == skipped, problems
    assert len(events) == len((run / rundir.EVENTS).read_bytes().splitlines()) - skipped  # every other line read
    assert any(isinstance(e, ev.RunStarted) for e in events)
    segments_of(events)  # the Segments reader
    for argv in ([], ["--json"], ["--target", "5.0"]):  # compare, in all its plain forms
        rc, out, err = _cli(["compare", str(run), str(good_run), *argv])
        assert rc == 0 and "Traceback" not in err and run.name in out, err
        if argv == ["--json"]:
            assert [r["run_dir"] for r in json.loads(out)["runs"]] == [str(run), str(good_run)]
    rc, out, err = _cli(["runs", str(root)])  # one bad run hides no good one
    assert rc == 0 and "Traceback" not in err, err
    assert run.name in out and good_run.name in out, out
    from tui.models.runstate import RunState
    from tui.models.tail import EventTail
    from tui.screens.compare import load

    tail, state = EventTail(run / rundir.EVENTS), RunState()  # attach: its tail and the dashboard's model
    for e in tail.read_new():
        state.feed(e)
    assert len(tail.problems) == skipped and state.started is not None
    state.state, state.eta(), state.elapsed(), state.settled_step_time(), state.next_checkpoint(), state.phase_seconds()
    state.checkpoint_rows(), state.gpu_since(0), state.grad_clip, state.max_steps
    for row in cmp.rows([("run", state.segments.segments(), state.best_val_loss)]):  # the Segments tab's cells
        cmp.cells(row)
    load([run, good_run])  # the Compare screen's model


# ------------------------------------------------------------------------------ the properties


@pytest.mark.slow
def test_every_planted_number_is_skipped_or_readable_and_every_reader_goes_on(good, tmp_path: Path) -> None:
    """All at once: one line per (model, number, extreme), in the middle of a real run."""
    run, lines, tpl = good
    bad, skipped = [], 0
    for model, path, x in cases(tpl):
        line = planted(tpl[model], path, x)
        reader = ev.EventLines("x")
        read = reader.parse(line)
        if must_skip(tpl, model, path, x):
            assert read is None and len(reader.problems) == 1, f"{model.__name__}{list(path)} = {x} was read"
        if is_detail(model, path) and x in MUST_SKIP:
            assert read is not None and detail_unknown(read, path), (path, x)  # kept, the detail unknown
        if read is None:
            assert len(reader.problems) == 1 and "out of range" in reader.problems[0], (model, path, x, reader.problems)
            skipped += 1
        elif _loss(model.model_fields[path[0]]) and x in ("nan", "inf", "-inf"):
            assert str(_at(read.model_dump(), path)) == str(float(x))  # a diverged step still reads back
        bad.append(line)
    root = tmp_path / "runs"
    every_reader(run_with(run, root, lines[:3] + bad + lines[3:]), root, run_with(run, root, lines, "good"), skipped)


def _at(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


_EXAMPLE = itertools.count()


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_one_bad_line_anywhere_in_a_run(good, tmp_path: Path, data: st.DataObject) -> None:
    """One planted line at any place of a real run's log: every reader, each form."""
    run, lines, tpl = good
    model, path, x = data.draw(st.sampled_from(cases(tpl)))
    at = data.draw(st.integers(1, len(lines)))  # after run_started: the run has begun
    line = planted(tpl[model], path, x)
    skipped = int(ev.EventLines("x").parse(line) is None)
    assert skipped or not must_skip(tpl, model, path, x)
    root = Path(tmp_path) / f"ex{next(_EXAMPLE)}"
    every_reader(run_with(run, root, lines[:at] + [line] + lines[at:]), root, run_with(run, root, lines, "good"),
                 skipped)  # fmt: skip


@pytest.mark.slow
def test_compare_tui_shows_the_good_lines_of_a_run_full_of_planted_numbers(good, tmp_path: Path) -> None:
    """`compare --tui`: the screen loads and draws every chart; the app exits without an error."""
    from tui.screens.compare import CompareApp

    run, lines, tpl = good
    bad = [planted(tpl[m], p, x) for m, p, x in cases(tpl)]
    d = run_with(run, tmp_path, lines[:3] + bad + lines[3:])

    async def drive() -> CompareApp:
        app = CompareApp([d, run])
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: getattr(app.screen, "loaded", False), "the runs on screen")
            for key in ("x", "x", "l"):  # every x axis, log-y: every chart drawn again
                await pilot.press(key)
                await pilot.pause()
            await pilot.press("escape")
        return app

    app = asyncio.run(drive())
    assert app.return_code == 0 and app._exception is None


# ------------------------------------------------------------------------------ the mailbox and checkpoints


@settings(max_examples=200, deadline=None, derandomize=True)
@given(at=st.one_of(st.sampled_from(list(EXTREMES.values())), st.integers().map(str), st.floats().map(json.dumps)),
       switch=st.sampled_from(list(EXTREMES.values())))  # fmt: skip
def test_the_mailbox_reads_a_time_and_switches_by_the_same_rule(at: str, switch: str) -> None:
    """A mailbox line's time and switches: read by the events' rule, or the line's problem; never raised."""
    r = requests.parse('{"id": "r1", "time": %s, "kind": "pause"}' % at)
    expect = ev.bounded(ev.Timestamp, json.loads(at))
    assert (r.problem is None) == (expect is not None) and (r.time == expect if expect is not None else True)
    t = requests.parse('{"id": "r2", "time": 5, "kind": "toggle", "switches": {"train.micro_batch": %s}}' % switch)
    assert (t.problem is None) == (switch in (EXTREMES["-1"], EXTREMES["1e300"]))  # the config judges these


@pytest.mark.slow
def test_a_mailbox_line_out_of_range_is_dropped_and_the_run_trains_on(resumable, tmp_path: Path) -> None:
    """A run whose mailbox holds a time of 10**400 (and the other extremes, in times and in a
    toggle's switches) when it resumes: each such request is dropped in words, and the run
    trains to its end (rc 0), not a traceback before its first checkpoint."""
    src, _ = resumable
    d = tmp_path / "run"
    shutil.copytree(src, d)
    box = [f'{{"id": "t{i}", "time": {x}, "kind": "save"}}' for i, x in enumerate(EXTREMES.values())]
    box += [f'{{"id": "s{i}", "time": 5, "kind": "toggle", "switches": {{"train.micro_batch": {x}}}}}'
            for i, x in enumerate(EXTREMES.values())]  # fmt: skip
    (d / rundir.MAILBOX).write_text("\n".join(box) + "\n")
    (d / rundir.MAILBOX).chmod(0o600)
    before = len((d / rundir.EVENTS).read_bytes().splitlines())
    rc, out, err = _cli(["train", "--resume", str(d), "--max-steps", "6"])
    assert rc == 0 and "Traceback" not in err, err
    events, problems = ev.read_events(d / rundir.EVENTS)
    assert problems == [] and isinstance(events[-1], ev.RunFinished) and events[-1].step == 6
    acks = {e.id: e.status for e in events[before:] if isinstance(e, ev.RequestAck)}
    asked = {f"{k}{i}" for k in "ts" for i in range(len(EXTREMES))}
    assert asked <= set(acks) and {acks[i] for i in asked} == {"dropped"}, acks


CKPT_EDITS = [("step", 2**63), ("step", 10**400), ("tokens", 10**400), ("tokens", -1), ("tokens", 2**63),
              ("tokens", float("nan")), ("best_val_loss", float("nan")), ("best_val_loss", float("inf")),
              ("val_loss", float("-inf")), ("train_time_s", float("inf")), ("train_time_s", -1.0),
              ("train_time_s", 1e300)]  # fmt: skip
CKPT_IDS = [f"{k}={'10**400' if v == 10**400 else '2**63' if v == 2**63 else v}" for k, v in CKPT_EDITS]


@pytest.fixture(scope="module")
def resumable(good) -> tuple[Path, bytes]:
    """A 3-step run with a checkpoint to resume (its directory and the checkpoint's bytes)."""
    run, _, _ = good
    d = run.parent / "short"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", *TRAIN, "--data", str(run.parent / "data"), "--max-steps", "3", "--out", str(d)]) == 0
    return d, (d / "checkpoints" / "step_000003.pt").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize(("key", "value"), CKPT_EDITS, ids=CKPT_IDS)
def test_a_checkpoints_numbers_out_of_range_refuse_the_resume_in_one_line(resumable, tmp_path, capsys, key,
                                                                          value) -> None:  # fmt: skip
    """A checkpoint's counters go through the same reading: out of range, the resume is refused
    in one line naming the number (exit 2), and nothing trains on from it."""
    src, real = resumable
    d = tmp_path / "run"
    shutil.copytree(src, d)
    state = torch.load(io.BytesIO(real), weights_only=True)
    state[key] = value
    buf = io.BytesIO()
    torch.save(state, buf)
    (d / "checkpoints" / "step_000003.pt").write_bytes(buf.getvalue())
    before = (d / rundir.EVENTS).read_bytes()
    capsys.readouterr()
    cli_fails(capsys, ["train", "--resume", str(d), "--max-steps", "6"], "step_000003.pt", key)
    after = (d / rundir.EVENTS).read_bytes()
    assert not any(b'"event":"step"' in line for line in after[len(before):].splitlines())


DETAILS = ("peak_flops", "dataset", "attention", "attention_ms", "contention", "parallel", "init_from")
HOSTILE_DETAILS = [float("nan"), 1e308, -1, "x\x1b]0;pwned\x07", {"a": {"b": float("inf")}}, [1e400]]


@pytest.mark.parametrize("field", DETAILS)
def test_one_bad_detail_never_hides_the_run_it_started(tmp_path: Path, field: str) -> None:
    """Issue 46 class D2: a run_started whose detail (a kernel's timing, the peak FLOP/s, the
    dataset's description, the load...) holds NaN, 1e308, an escape or a wrong type is kept, that
    detail read as unknown (or kept as text, shown through the printable rule): the run still
    started. Every detail field with a default is walked (a new one must be listed here)."""
    defaults = {n for n, f in ev.RunStarted.model_fields.items() if not f.is_required()}
    assert defaults - {"time", "event", "start_step", "world_size"} == set(DETAILS)  # a new detail: add it above
    good = ev.RunStarted(config={"model": {"n_layer": 1}}, n_params=1, device="cpu", device_name="CPU",
                         precision="fp32", flops_per_token=1).model_dump(mode="json")  # fmt: skip
    path = tmp_path / "events.jsonl"
    for value in HOSTILE_DETAILS:
        line = json.dumps(good | {field: value}).replace("1e+400", "1e400")
        path.write_text(line + "\n")
        events, problems = ev.read_events(path)
        assert [e.event for e in events] == ["run_started"], (field, value, problems)
        assert events[0].n_params == 1
