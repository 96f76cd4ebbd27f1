"""Issue 12 items 1 and 5, through the real `gpt2-tui` command.

Item 1: a run that diverges with a finite loss (resume a healthy 30-step `micro` run with
`--lr 1e6 --min-lr 0`) must stop in one line (exit 2) without saving the blown-up state: no
checkpoint on disk has non-finite or exploded weights, retention keeps the newest healthy
ones (step_000020, step_000030), `latest` names a healthy checkpoint, the stop message's
advice can be followed as printed (and following it does not destroy the healthy ones), and
`sample RUN` does not traceback.

Item 5 (a full disk at the end): emulated without root or a tiny filesystem by planting the
final checkpoint's temp file as a symlink to /dev/full (writes fail with ENOSPC). It relies on
today's temp-file name (`.step_000030.pt.tmp`) and skips, saying so, if the name changed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from harness import Work, make_work, refusal_problems

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

HEALTHY = ["train", "--preset", "micro", "--device", "cpu", "--data", "ds", "--out", "run", "--max-steps", "30",
           "--ckpt-interval", "10"]  # fmt: skip
BLOW_UP = [
    "train",
    "--resume",
    "run",
    "--lr",
    "1e6",
    "--min-lr",
    "0",
    "--max-steps",
    "60",
]
EXPLODED = 100.0  # max |w| this many times the healthy run's = exploded


def _weights(path: Path) -> tuple[float, bool, float]:
    """(max |w|, all finite, val loss) of a checkpoint's model."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    tensors = [
        t.float()
        for t in state["model"].values()
        if torch.is_tensor(t) and t.is_floating_point()
    ]
    finite = all(bool(torch.isfinite(t).all()) for t in tensors)
    biggest = max(float(t.abs().nan_to_num(nan=math.inf).max()) for t in tensors)
    val = state.get("val_loss")
    return biggest, finite, float("nan") if val is None else float(val)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> tuple[Path, float, float]:
    """A healthy 30-step run (checkpoints at 10, 20, 30): its dir, max |w| and val loss at 30."""
    w = make_work(tmp_path_factory.mktemp("healthy"))
    res = w.run(HEALTHY, timeout=120)
    assert res.rc == 0, res.summary()
    ck = w.dir / "run" / "checkpoints"
    assert {p.name for p in ck.glob("step_*.pt")} >= {
        "step_000020.pt",
        "step_000030.pt",
    }
    biggest, finite, val = _weights(ck / "step_000030.pt")
    assert finite and math.isfinite(val)
    return w.dir, biggest, val


def _copy_work(tmp_path: Path, src: Path) -> Work:
    import shutil

    w = make_work(tmp_path)
    shutil.copytree(src / "run", w.dir / "run", symlinks=True)
    return w


def _damage(w: Work, healthy_max: float, healthy_val: float,
            keep: tuple[str, ...] = ("step_000020.pt", "step_000030.pt")) -> list[str]:
    """Every way the run directory breaks item 1's promises. Once the advice has trained
    on healthily, `--keep-last` may retire 20 and 30 like any older checkpoint (keep=())."""
    ck = w.dir / "run" / "checkpoints"
    problems = []
    for p in sorted(ck.glob("*.pt")):
        biggest, finite, val = _weights(p)
        if not finite or biggest > EXPLODED * healthy_max:
            problems.append(
                f"{p.name} holds blown-up weights (max |w| {biggest:.3g} vs healthy {healthy_max:.3g})"
            )
        elif not math.isfinite(val) or val > 2 * healthy_val:
            problems.append(
                f"{p.name} has val loss {val:.3g} (healthy {healthy_val:.3g})"
            )
    for name in keep:
        if not (ck / name).exists():
            problems.append(f"{name} (healthy) was deleted")
    pointer = ck / "latest"
    name = pointer.read_text().strip() if pointer.exists() else ""
    if not (ck / name).is_file() if name else True:
        problems.append(f"latest names {name or 'nothing'}, which is not a file")
    else:
        biggest, finite, val = _weights(ck / name)
        if (
            not finite
            or biggest > EXPLODED * healthy_max
            or not math.isfinite(val)
            or val > 2 * healthy_val
        ):
            problems.append(
                f"latest -> {name}: not healthy (max |w| {biggest:.3g}, val loss {val:.3g})"
            )
    return problems


def _advice(line: str) -> list[list[str]]:
    """The commands a stop line tells the user to run: `gpt2-tui ...` in backticks or after a
    colon, else a bare `--resume X [--from Y]`, made into `gpt2-tui train --resume X ...`."""
    cmds = [shlex.split(c) for c in re.findall(r"`(gpt2-tui [^`]+)`", line)]
    if not cmds:
        cmds = [
            shlex.split(c)
            for c in re.findall(r"(gpt2-tui (?:train|sample)[^;`)]*)", line)
        ]
    if not cmds:
        for m in re.finditer(
            r"--resume (\S+?)(?:[;,.)]?(?:\s|$))((?:--from \S+?)?)(?=[;,.)]?(?:\s|$))",
            line,
        ):
            cmds.append(
                ["gpt2-tui", "train", "--resume", m.group(1), *m.group(2).split()]
            )
    return [c[1:] if c and c[0] == "gpt2-tui" else c for c in cmds]


def test_divergence_with_finite_loss_keeps_the_healthy_checkpoints(
    healthy, tmp_path: Path
) -> None:
    src, healthy_max, healthy_val = healthy
    w = _copy_work(tmp_path, src)
    found: list[str] = []

    res = w.run(BLOW_UP, timeout=120)
    stop = res.err.strip()
    first = refusal_problems(res)
    if first:
        found.append(f"{' '.join(BLOW_UP)} -> {', '.join(first)} ({res.summary()})")
    found += [f"after the blow-up: {p}" for p in _damage(w, healthy_max, healthy_val)]

    # the advice, followed as printed (the issue: it blew up again and retention ate the good ones)
    help_text = w.run(["train", "--help"]).out
    advised = _advice(stop) if stop else []
    for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", stop)) - {"--"}):
        if flag not in help_text:
            found.append(
                f"the stop line advises {flag}, which `gpt2-tui train` does not have"
            )
    for argv in advised[:2]:
        again = w.run(argv, timeout=120)
        if "Traceback" in again.err or again.rc not in (0, 2):
            found.append(f"advice `gpt2-tui {' '.join(argv)}` -> {again.summary()}")
        elif again.rc == 2 and re.search(
            r"usage|unrecognized|not a run|cannot|does not exist", again.err
        ):
            found.append(
                f"advice `gpt2-tui {' '.join(argv)}` is refused: {again.summary()}"
            )
        found += [
            f"after following the advice `{' '.join(argv)}`: {p}"
            for p in _damage(w, healthy_max, healthy_val, keep=())
        ]

    smp = w.run(["sample", "run", "--max-new-tokens", "5"], timeout=60)
    if (
        "Traceback" in smp.err
        or smp.rc not in (0, 2)
        or (smp.rc == 2 and len(smp.err.splitlines()) != 1)
    ):
        found.append(f"sample run -> {smp.summary()}")

    assert not found, f"stop line: {stop[:300]!r}\n" + "\n".join(dict.fromkeys(found))


def test_the_advice_parser() -> None:
    line = "error: diverged at step 36; fix it and continue with --resume run"
    assert _advice(line) == [["train", "--resume", "run"]]
    assert _advice("x; run `gpt2-tui train --resume r --from best --lr 1e-3`") == [
        ["train", "--resume", "r", "--from", "best", "--lr", "1e-3"]
    ]
    assert _advice(
        "resume from an earlier one: --resume RUN --from STEP, or see x"
    ) == [["train", "--resume", "RUN", "--from", "STEP"]]


def test_a_final_checkpoint_that_cannot_be_written_is_not_success(
    tmp_path: Path,
) -> None:
    w = make_work(tmp_path)
    res = w.run(
        [*HEALTHY[:-4], "--max-steps", "20", "--ckpt-interval", "10"], timeout=120
    )
    assert res.rc == 0, res.summary()
    ck = w.dir / "run" / "checkpoints"
    planted = ck / ".step_000030.pt.tmp"
    os.symlink(
        "/dev/full", planted
    )  # the final save's temp file: every write is ENOSPC
    events = w.dir / "run" / "events.jsonl"
    seen = events.stat().st_size
    res = w.run(["train", "--resume", "run", "--max-steps", "30"], timeout=120)
    if (ck / "step_000030.pt").exists():
        pytest.skip(
            "the final checkpoint was written: the temp-file name changed, so /dev/full was not hit"
        )
    new = [
        json.loads(x)
        for x in events.read_bytes()[seen:].decode(errors="replace").splitlines()
        if x.strip()
    ]
    kinds = [e.get("event") for e in new]
    found = []
    if res.rc == 0:
        found.append("exit 0 although the final checkpoint was not written")
    elif "Traceback" in res.err or len(res.err.strip().splitlines()) != 1:
        found.append(f"stderr is not one line: {res.summary()}")
    if "run_failed" not in kinds:
        found.append(f"no run_failed event (events: {sorted(set(kinds))})")
    if "run_finished" in kinds:
        found.append("a run_finished event")
    if (ck / "latest").read_text().strip() != "step_000020.pt":
        found.append(f"latest -> {(ck / 'latest').read_text().strip()}")
    last = [ln for ln in res.out.splitlines() if ln.strip()][-3:]
    assert not found, f"{'; '.join(found)} | stdout ends: {last} | {res.summary()}"
