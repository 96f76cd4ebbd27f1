"""Restored optimizer state is checked before torch sees it (issue 38): a checkpoint whose optimizer
groups or buffers are hostile (a 0-dim or stride-0 buffer where a parameter-shaped one belongs, an
integer or complex buffer, a Muon group with ns_steps 100, amsgrad on, betas outside [0, 1), ...)
is refused in one line, exit 2, nothing written: torch loads what it is given and failed at the
first step with a traceback (or trained on with the hostile value).

By class: every group key and every state entry that AdamW and Muon save is either given hostile
values here or named as harmless, so a key a new torch adds must be placed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from gpt2_tui import main
from harness import MICRO, random_tokens, tree_snapshot, write_gpt2tui

NAN, INF = math.nan, math.inf
HOSTILE_GROUP: dict[str, list[Any]] = {  # group key -> values no run of gpt2-tui saves, that torch takes
    "lr": [NAN, -1.0, INF],
    "betas": [(1.5, 0.9), (0.9, 1.0), (-0.1, 0.9), (0.9,), (NAN, 0.9)],
    "eps": [0.0, -1e-8, NAN, 2.0],
    "weight_decay": [-0.1, INF],
    "amsgrad": [True],
    "maximize": [True],
    "capturable": [True],
    "differentiable": [True],
    "foreach": [1.5],
    "fused": [2.0],
    "decoupled_weight_decay": [0.5],
    "momentum": [1.5, -0.1, NAN],
    "nesterov": [0.5],
    "ns_steps": [100, 0, -3, 11],
    "ns_coefficients": [(3.4, -4.7), (NAN, 1.0, 1.0), (1e300, 1.0, 1.0)],
    "adjust_lr_fn": [1.0],
}
HARMLESS_GROUP: set[str] = set()  # group keys whose any value trains the same (none today)


def _buffer_cases(p: torch.Tensor) -> dict[str, Any]:
    """Stand-ins for a parameter-shaped buffer like `p`."""
    return {
        "0-dim": torch.tensor(0.0),
        "stride-0": torch.zeros(1).expand(*p.shape),
        "int64": torch.zeros(p.shape, dtype=torch.int64),
        "complex": torch.zeros(p.shape, dtype=torch.complex64),
        "bool": torch.zeros(p.shape, dtype=torch.bool),
        "transposed-shape": torch.zeros(tuple(reversed(p.shape)) + (2,)),
        "a number": 0.0,
        "missing": None,
    }


STEP_CASES: dict[str, Any] = {
    "NaN": torch.tensor(NAN), "-1": torch.tensor(-1.0), "inf": torch.tensor(INF), "3 numbers": torch.zeros(3),
    "complex": torch.tensor(1 + 1j), "missing": None,
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An AdamW run and a Muon run, 2 micro steps each, checkpointed at step 2."""
    base = tmp_path_factory.mktemp("optstate")
    data = write_gpt2tui(base / "data", random_tokens(20_000, 64, 1), random_tokens(4_000, 64, 2), 64)
    out = {}
    for optimizer in ("adamw", "muon"):
        run = base / optimizer
        argv = ["train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", "2", "--ckpt-interval", "2",
                "--eval-interval", "2", "--sample-tokens", "0", "--optimizer", optimizer]  # fmt: skip
        assert main(argv) == 0
        out[optimizer] = run
    return out


def _saved(run: Path) -> dict[str, Any]:
    return torch.load(run / "checkpoints" / "step_000002.pt", weights_only=True)


def _cases(optimizer: str, state: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, the checkpoint with one hostile change) for every group key and state entry the run saved."""
    opt = state["optimizer"]
    cases = []
    for gi, group in enumerate(opt["param_groups"]):
        for key in sorted(set(group) - {"params"}):
            for value in HOSTILE_GROUP[key]:  # a KeyError here: a key torch added, to place in the tables
                changed = {**opt, "param_groups": [dict(g) for g in opt["param_groups"]]}
                changed["param_groups"][gi][key] = value
                cases.append((f"{optimizer} group {gi} {key}={value!r}", {**state, "optimizer": changed}))
    seen: set[tuple[str, int]] = set()  # one parameter of each group kind and dimension is enough
    for pid, entry in opt["state"].items():
        for name, buffer in entry.items():
            what = (name, buffer.dim())
            if what in seen:
                continue
            seen.add(what)
            hostile = STEP_CASES if name == "step" else _buffer_cases(buffer)
            for label, value in hostile.items():
                if value is None and len(entry) == 1:
                    continue  # an empty entry is a fresh one (a parameter never stepped): torch starts it anew
                changed = {**opt, "state": {k: dict(v) for k, v in opt["state"].items()}}
                if value is None:
                    del changed["state"][pid][name]
                else:
                    changed["state"][pid][name] = value
                cases.append((f"{optimizer} {name} of param {pid} {label}", {**state, "optimizer": changed}))
    return cases


@pytest.mark.slow
def test_every_saved_group_key_is_placed(runs) -> None:
    for optimizer, run in runs.items():
        keys = {k for g in _saved(run)["optimizer"]["param_groups"] for k in g} - {"params"}
        assert keys <= set(HOSTILE_GROUP) | HARMLESS_GROUP, f"{optimizer}: place {keys - set(HOSTILE_GROUP)}"
        assert all(HOSTILE_GROUP[k] for k in keys - HARMLESS_GROUP)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_hostile_optimizer_state_is_one_line(runs, optimizer, tmp_path, capsys) -> None:
    run = runs[optimizer]
    state = _saved(run)
    problems = []
    for i, (name, hostile) in enumerate(_cases(optimizer, state)):
        path = tmp_path / f"hostile_{i}.pt"
        torch.save(hostile, path)
        before = tree_snapshot(run)
        capsys.readouterr()
        try:
            code = main(["train", "--resume", str(run), "--from", str(path), "--max-steps", "3"])
        except BaseException as err:  # noqa: BLE001 - a traceback is what this test looks for
            problems.append(f"{name}: raised {type(err).__name__}: {str(err)[:120]}")
            continue
        err = capsys.readouterr().err.strip()
        if code != 2 or len(err.splitlines()) != 1 or "Traceback" in err or "cannot be resumed" not in err:
            problems.append(f"{name}: exit {code}: {err[-200:]}")
        elif tree_snapshot(run) != before:
            problems.append(f"{name}: refused, but the run directory changed")
    assert not problems, f"{len(problems)} hostile optimizer states not refused in one line:\n" + "\n".join(problems)


@pytest.mark.slow
def test_the_run_own_state_still_resumes(runs, tmp_path, capsys) -> None:
    """The checks refuse nothing gpt2-tui itself saves (both optimizers, fused and not)."""
    for optimizer, run in runs.items():
        assert main(["train", "--resume", str(run), "--max-steps", "3", "--no-fused-adamw"]) == 0, capsys.readouterr().err
