"""What a resume says is what it does (issue 38).

- A wsd run shortened at resume before its decay began re-planned the decay to the new end, which
  could begin before the step reached: the lr dropped by half in one step while the note promised
  "a linear decay from step A". By class: every max steps given at resume, from a step in the stable
  phase and one in the decay, keeps the step reached at the lr it had, never rises, and follows the
  note's words (the linear decay from A to min_lr at B it names).
- `--resume --max-steps 10` at step 30 advised `--max-steps 20`, refused the same way. By class:
  every refusal of a max steps at or below the step reached advises one, and running that advice trains.
"""

from __future__ import annotations

import re

import pytest

from engine.config import RunConfig
from engine.run.preflight import resumed_config
from engine.train.trainer import lr_at
from gpt2_tui import main
from harness import CPU, run_events, stopped_at, train

WSD = CPU | {"train.max_steps": 20, "optim.warmup_steps": 2, "optim.schedule": "wsd", "optim.decay_fraction": 0.2,
             "train.eval_interval": 100, "train.ckpt_interval": 100, "train.sample_tokens": 0}  # fmt: skip
LINEAR = re.compile(r"a linear decay from step (\d+) to min_lr \S+ at step (\d+)")


def _promise_problems(old: RunConfig, new: RunConfig, step: int) -> list[str]:
    """How the resumed plan breaks what a resume promises at `step`, [] if it keeps it all."""
    n0, n = old.train.max_steps, new.train.max_steps
    o = new.optim
    lrs = [lr_at(i, o, n) for i in range(step, n)]
    problems = []
    if lrs[0] != pytest.approx(lr_at(step, old.optim, n0)):
        problems.append(f"step {step} trains at {lrs[0]:.3g}, not the {lr_at(step, old.optim, n0):.3g} it was planned at")
    if any(b > a * (1 + 1e-12) for a, b in zip(lrs, lrs[1:])):
        problems.append("the lr rises")
    for note in new.notes:
        found = LINEAR.search(note)
        if found is None:
            continue
        a, b = map(int, found.groups())
        if a < step:
            problems.append(f"the note's decay begins at step {a}, before the step reached: {note}")
        for i in range(step, n):
            want = o.lr if i < a else o.min_lr + (o.lr - o.min_lr) * (b - i) / (b - a)
            if lr_at(i, o, n) != pytest.approx(want):
                problems.append(f"step {i} is off the note's line ({lr_at(i, o, n):.3g} != {want:.3g}): {note}")
                break
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("stop", [8, 14, 17])  # stable phase (decay from 16), late in it, in the decay
def test_every_max_steps_at_resume_keeps_the_schedule_the_note_promises(tmp_path, tiny_dataset, stop) -> None:
    run_dir = tmp_path / "run"
    stopped_at(run_dir, tiny_dataset, stop, **(WSD | {"data.path": str(tiny_dataset)}))
    old = resumed_config(run_dir, {})
    problems = []
    for n in range(stop + 1, 31):
        new = resumed_config(run_dir, {"train.max_steps": n})
        problems += [f"--max-steps {n} at step {stop}: {p}" for p in _promise_problems(old, new, stop)]
        if n < 20 and not any("ends at step" in x or "re-planned" in x for x in new.notes):
            problems.append(f"--max-steps {n} at step {stop}: shortened, and no note says what the schedule does")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_shortened_wsd_run_trains_the_lr_its_note_says(tmp_path, tiny_dataset, capsys) -> None:
    run_dir = tmp_path / "run"
    stopped_at(run_dir, tiny_dataset, 14, **(WSD | {"data.path": str(tiny_dataset)}))  # its decay: from step 16
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--max-steps", "16"]) == 0  # 20% of 16: it would begin at 13
    said = capsys.readouterr()
    notes = [x for x in (said.out + said.err).splitlines() if "wsd decay" in x]
    assert len(notes) == 1 and "from step 14 to min_lr 0.0003 at step 16" in notes[0], notes
    lrs = {e.step: e.lr for e in run_events(run_dir) if e.event == "step"}
    peak, floor = 3e-3, 3e-4
    assert [lrs[s] for s in (14, 15, 16)] == pytest.approx([peak, peak, (peak + floor) / 2])  # event k: step k-1's lr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_max_steps_refused_at_resume_advises_one_that_trains(tmp_path, tiny_dataset, capsys) -> None:
    run_dir = tmp_path / "run"
    flags = CPU | {"train.max_steps": 2, "optim.warmup_steps": 1, "train.eval_interval": 100,
                   "train.ckpt_interval": 100, "train.sample_tokens": 0}  # fmt: skip
    assert train(run_dir, tiny_dataset, **flags) == "completed"
    capsys.readouterr()
    problems = []
    for asked in ([], ["--max-steps", "{reached}"], ["--max-steps", "1"]):  # 1: below its warmup too
        reached = max(e.step for e in run_events(run_dir) if e.event == "step")
        asked = [a.format(reached=reached) for a in asked]
        code = main(["train", "--resume", str(run_dir), *asked])
        err = capsys.readouterr().err.strip()
        advised = [int(x) for x in re.findall(r"--max-steps (\d+)", err)]
        if code != 2 or len(err.splitlines()) != 1 or not advised:
            problems.append(f"{' '.join(asked) or 'no flag'} at step {reached}: exit {code}, {err[-200:]}")
            continue
        for n in advised:
            if n <= reached:
                problems.append(f"{' '.join(asked) or 'no flag'} at step {reached}: advises --max-steps {n}: {err}")
        n = max(advised)
        if main(["train", "--resume", str(run_dir), "--max-steps", str(n)]) != 0:
            problems.append(f"following --max-steps {n} at step {reached} failed: {capsys.readouterr().err[-300:]}")
        capsys.readouterr()
    assert not problems, "\n".join(problems)
