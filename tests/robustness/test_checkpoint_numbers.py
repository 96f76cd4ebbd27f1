"""Every number a checkpoint restores goes through the one reading (issue 46, class D): each
numeric field of a real checkpoint's saved state (its counters, the step guard's level and
streak, the optimizer's group settings), set to each number out of any range (10**400, NaN, Inf,
-1), is either refused at `train --resume` in one line with exit 2, or resumed; never a
traceback. A property over the fields a checkpoint holds, not a list of the ones found so far:
a field added later is walked too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from gpt2_tui import main

HOSTILE = [10**400, float("nan"), float("inf"), -1]
SKIP = ("model", "rng", "config")  # tensors (the weights), the RNG's bytes, the config (checked by the config's model)


def _numbers(state: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every int or float leaf outside tensors (and outside SKIP at the top)."""
    if isinstance(state, dict):
        for k, v in state.items():
            if not (path == () and k in SKIP):
                yield from _numbers(v, (*path, k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from _numbers(v, (*path, i))
    elif isinstance(state, (int, float)) and not isinstance(state, bool):
        yield path


def _with(state: dict, path: tuple, value: Any) -> dict:
    import copy

    out = copy.deepcopy(state)
    node, parent, key = out, None, None
    for k in path[:-1]:
        parent, key, node = node, k, node[k]
    if isinstance(node, tuple):  # betas: rebuild the tuple
        items = list(node)
        items[path[-1]] = value
        parent[key] = tuple(items)
    else:
        node[path[-1]] = value
    return out


def test_every_number_a_checkpoint_restores_is_refused_in_one_line_or_resumed(trained_runs, tmp_path, capsys):
    original = trained_runs.original("micro-2")
    latest = (original / "checkpoints" / "latest").read_text().strip()
    state = torch.load(original / "checkpoints" / latest, weights_only=True)
    paths = list(_numbers(state))
    assert ("step",) in paths and ("guard", "ema") in paths and any(p[:1] == ("optimizer",) for p in paths)
    failures = []
    for i, path in enumerate(paths):
        for j, value in enumerate(HOSTILE):
            run = trained_runs.copy("micro-2", tmp_path / f"r{i}-{j}")
            torch.save(_with(state, path, value), run / "checkpoints" / latest)
            code = main(["train", "--resume", str(run), "--max-steps", "3"])
            err = capsys.readouterr().err.strip()
            bad = "Traceback" in err or code not in (0, 1, 2) or (code == 2 and len(err.splitlines()) != 1)
            if bad:
                failures.append(f"{'.'.join(map(str, path))} = {value if not isinstance(value, int) or abs(value) < 1e6 else '10**400'}: "
                                f"exit {code}: {err.splitlines()[-1] if err else ''}")
    assert not failures, "\n".join(failures)


def test_optimizer_state_is_checked_for_its_values_as_well_as_its_form(trained_runs, tmp_path, capsys):
    """Issue 46, class E: an AdamW moment or a Muon momentum that is NaN, infinite or past any
    range, or a second moment below 0, is refused at resume in one line naming the optimizer
    state, before torch sees it (it would train the weights into NaN at the first step)."""
    for table in ("micro-2", "muon-wsd"):
        original = trained_runs.original(table)
        latest = (original / "checkpoints" / "latest").read_text().strip()
        state = torch.load(original / "checkpoints" / latest, weights_only=True)
        names = sorted({k for entry in state["optimizer"]["state"].values() for k, v in entry.items()
                        if isinstance(v, torch.Tensor) and v.dim() > 0})  # fmt: skip
        assert {"exp_avg", "exp_avg_sq"} <= set(names) and ("momentum_buffer" in names) == (table == "muon-wsd"), names
        for name in names:
            for value in [float("nan"), float("inf"), 1e30, *([-1.0] if name == "exp_avg_sq" else [])]:
                run = trained_runs.copy(table, tmp_path / f"{table}-{name}-{value}")
                bad = torch.load(original / "checkpoints" / latest, weights_only=True)
                entry = next(e for e in bad["optimizer"]["state"].values() if name in e and e[name].dim() > 0)
                entry[name].view(-1)[0] = value
                torch.save(bad, run / "checkpoints" / latest)
                code = main(["train", "--resume", str(run), "--max-steps", str(state["step"] + 1)])
                err = capsys.readouterr().err.strip()
                assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (table, name, value, err)
                assert "optimizer" in err and name in err, err
