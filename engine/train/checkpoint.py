"""Checkpoints: atomic writes, keep-last-K plus best, a `latest` pointer, safe loading.

A checkpoint holds everything a resumed run needs to continue as if never stopped: model,
optimizer, scaler, step, best val loss, the resolved config, RNG states and the data
sampler's state. Files are only ever loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from engine import files
from engine.errors import UserError
from engine.events import FIGURE_MAX, INT_MAX

REQUIRED = ("model", "optimizer", "step", "config")
RESUME = ("rng", "data")  # what --resume needs beyond the weights


def _is_bytes_tensor(value: object) -> bool:
    """A generator state: one device's CUDA RNG (what a checkpoint holds)."""
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
TMP_SUFFIX = files.TMP_SUFFIX
POINTER_CAP = 4096  # `latest` holds one file name


def atomic_save(obj: dict[str, Any], path: Path) -> None:
    """torch.save, atomically; a failed write surfaces as the OSError it is."""

    def write(f: BinaryIO) -> None:
        try:
            torch.save(obj, f)
        except RuntimeError as err:  # on a full disk torch's zip writer hides ENOSPC behind its own error
            cause = err.__cause__ or err.__context__
            while cause is not None and not isinstance(cause, OSError):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            raise cause from None

    files.atomic_write(path, write)


def _link_or_copy(src: Path, dst: Path) -> None:
    files.link_or_copy(src, dst)


class CheckpointDir:
    """`checkpoints/` of a run: step_XXXXXX.pt files, best.pt and a `latest` pointer file."""

    def __init__(self, path: Path, keep_last: int = 3):
        self.path, self.keep_last = path, keep_last

    def step_files(self) -> list[tuple[int, Path]]:
        if not self.path.is_dir():
            return []
        found = ((_STEP_FILE.match(p.name), p) for p in self.path.iterdir())
        # a FIFO, a device or a link named like a step file is not a checkpoint (lstat)
        return sorted((int(m.group(1)), p) for m, p in found if m and files.is_regular(p))

    def save(self, state: dict[str, Any], step: int, is_best: bool) -> Path:
        files.make_dir(self.path)
        target = self.path / f"step_{step:06d}.pt"
        atomic_save(state, target)
        if is_best:
            _link_or_copy(target, self.path / "best.pt")
        files.atomic_write_bytes(self.path / "latest", target.name.encode() + b"\n")
        for _, old in self.step_files()[: -self.keep_last]:
            files.remove(old)
        for stale in self.path.glob(f".*{TMP_SUFFIX}"):  # left by a kill -9 mid-write
            files.remove(stale)
        return target

    def resolve(self, which: str) -> Path:
        """The checkpoint `--from` names: `best`, a step number, or a file path."""
        if which == "best":
            path = self.path / "best.pt"
        elif which.isdigit():
            path = self.path / f"step_{int(which):06d}.pt"
        else:
            path = Path(which)
        if not path.is_file():
            kept = [str(s) for s, _ in self.step_files()] + (["best"] if (self.path / "best.pt").is_file() else [])
            raise UserError(
                f"--from {which}: no such checkpoint in {self.path} (kept: {', '.join(kept) or 'none'}); "
                "pass best, one of those steps, or a checkpoint file"
            )
        return path

    def set_aside_after(self, step: int) -> Path | None:
        """Resuming from an earlier checkpoint: move the later step files into a folder of their
        own, so retention keeps the new branch and nothing of the old one is lost."""
        later = [p for s, p in self.step_files() if s > step]
        if not later:
            return None
        aside = self.path / f"after_step_{step:06d}_{int(time.time())}"
        files.make_new_dir(aside)
        for p in later:
            files.replace(p, aside / p.name)
        if (self.path / f"step_{step:06d}.pt").is_file():
            files.atomic_write_bytes(self.path / "latest", f"step_{step:06d}.pt\n".encode())
        return aside

    def latest_step(self) -> int | None:
        """The step of the latest checkpoint (what a resume continues from), None without one."""
        path = self.latest()
        match = _STEP_FILE.match(path.name) if path is not None else None
        return int(match.group(1)) if match else None

    def latest(self) -> Path | None:
        try:
            name = files.read_bounded(self.path / "latest", POINTER_CAP).decode(errors="replace").strip()
        except OSError:  # missing, a link, a FIFO, too big: the listing decides
            name = ""
        if _STEP_FILE.match(name) and files.is_regular(self.path / name):  # only a step file here
            return self.path / name
        steps = self.step_files()  # pointer missing or stale: fall back to the newest file
        return steps[-1][1] if steps else None


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and sanity-check a checkpoint; every failure is a one-line UserError."""
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; check the path")
    try:
        with files.open_read(path) as f:  # a regular file, not a link; never pickle's code
            state = torch.load(f, map_location=map_location, weights_only=True)
    except files.Refused as err:
        raise UserError(f"checkpoint {path} is refused ({err.strerror}); pass a checkpoint file") from None
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{path} is not a gpt2-tui checkpoint (refused by the safe loader: {first[:160]}); "
            "load only checkpoints written by gpt2-tui"
        ) from None
    except Exception as err:  # noqa: BLE001 - any parse failure of a damaged file is one line
        raise UserError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}); "
            f"move it out of {path.parent} and --resume takes the newest checkpoint left there"
        ) from None
    problem = _malformed(state)
    if problem:
        raise UserError(f"{path} is not a gpt2-tui checkpoint ({problem}); use another checkpoint of the run")
    # the weights as a plain dict: torch's state_dict carries a `_metadata` attribute that
    # load_state_dict trusts (a damaged one, a tuple, was an AttributeError); our modules need none
    state["model"] = dict(state["model"])
    return state


def _malformed(state: Any) -> str | None:
    """What is wrong with a loaded checkpoint's structure, or None."""
    if not isinstance(state, dict):
        return "not a dict"
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    model = state["model"]
    if not isinstance(model, dict) or not model or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()
    ):
        return "model is not a dict of tensors"
    if not isinstance(state["optimizer"], dict):
        return "optimizer is not a dict"
    if not isinstance(state["step"], int) or isinstance(state["step"], bool) or state["step"] < 0:
        return "step is not a count"
    if not isinstance(state["config"], dict):
        return "config is not a dict"
    return None


def _optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer | None) -> str | None:
    """What keeps `saved` from loading into an optimizer and training, or None: the form torch's
    state_dict has, every group's values within their ranges (_group_problem), every state entry
    a sane tensor (_buffer_problem); with `optimizer`, also its groups, each entry's keys for its
    group's kind (AdamW's or Muon's) and the shapes of its parameters. Checked before torch
    sees it: torch loads what it is given and fails at the first step, in its own words."""
    if not isinstance(saved.get("state"), dict) or not isinstance(saved.get("param_groups"), list):
        return "optimizer state is not {state, param_groups}"
    groups = saved["param_groups"]
    if not groups or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(type(i) is int for i in g["params"])
        for g in groups
    ):
        return "optimizer param_groups are empty or malformed"
    ids = [i for g in groups for i in g["params"]]
    if len(set(ids)) != len(ids):
        return "optimizer param_groups repeat a parameter"
    if not all(_hyper(v) for g in groups for k, v in g.items() if k != "params"):
        return "optimizer hyper-parameters are not numbers"
    for g in groups:
        problem = _group_problem(g)
        if problem:
            return problem
    for key, entry in saved["state"].items():
        if type(key) is not int or key not in ids or not isinstance(entry, dict) or not all(
            isinstance(k, str) and isinstance(v, (torch.Tensor, int, float)) for k, v in entry.items()
        ):
            return "optimizer state entries are malformed"
        for name, v in entry.items():
            problem = _buffer_problem(name, v)
            if problem:
                return problem
    if optimizer is None:
        return None
    own = optimizer.param_groups
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in own]:
        return "optimizer param_groups do not match the model's"
    if any(_kind(g) not in (_kind(mine), "unknown") for g, mine in zip(groups, own)):  # unknown: the run's are applied
        return "optimizer param_groups are another optimizer's"
    params = {i: (p, _kind(mine)) for g, mine in zip(groups, own) for i, p in zip(g["params"], mine["params"])}
    for key, entry in saved["state"].items():
        param, kind = params[key]
        if entry and set(entry) != STATE_KEYS[kind]:
            return f"optimizer state of a {kind} parameter holds {', '.join(sorted(entry))}"
        for name, v in entry.items():
            if name != "step" and v.shape != param.shape:
                return f"optimizer {name} has another shape than its parameter"
    return None


STATE_KEYS = {"adamw": {"step", "exp_avg", "exp_avg_sq"}, "muon": {"momentum_buffer"}}  # what each keeps per parameter
NS_STEPS = (1, 10)  # Muon's Newton-Schulz iterations: 5 is torch's and modded-nanogpt's; each costs matmuls
_FLAGS_OFF = ("amsgrad", "maximize", "capturable", "differentiable")  # never set by gpt2-tui: no setting turns them on


def _kind(group: dict[str, Any]) -> str:
    """Which optimizer a group is torch's for: AdamW keeps betas, Muon a momentum."""
    return "adamw" if "betas" in group else "muon" if "momentum" in group else "unknown"


def _number(v: Any, low: float, high: float = math.inf, low_open: bool = False, high_open: bool = True) -> bool:
    """A finite int or float (not a bool) within [low, high), the ends open or closed as asked."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        if not math.isfinite(v):
            return False
    except OverflowError:  # an int past any float (10**400)
        return False
    return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)


def _group_problem(g: dict[str, Any]) -> str | None:
    """A group value out of its range (the kernels compute with these before the run's settings
    are applied over them: engine.train.build.apply_settings), or None."""
    checks: dict[str, Callable[[Any], bool]] = {
        "lr": lambda v: _number(v, 0), "initial_lr": lambda v: _number(v, 0),
        "eps": lambda v: _number(v, 0, 1, low_open=True, high_open=False),
        "weight_decay": lambda v: _number(v, 0), "momentum": lambda v: _number(v, 0, 1),
        "betas": lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(_number(b, 0, 1) for b in v),
        "ns_steps": lambda v: type(v) is int and NS_STEPS[0] <= v <= NS_STEPS[1],
        "ns_coefficients": lambda v: isinstance(v, (tuple, list)) and len(v) == 3
        and all(_number(c, -100, 100) for c in v),
        "nesterov": lambda v: isinstance(v, bool), "decoupled_weight_decay": lambda v: isinstance(v, bool),
        "foreach": lambda v: v is None or isinstance(v, bool), "fused": lambda v: v is None or isinstance(v, bool),
        "adjust_lr_fn": lambda v: v is None,
        **{flag: (lambda v: v is False) for flag in _FLAGS_OFF},
    }  # fmt: skip
    for key, ok in checks.items():
        if key in g and not ok(g[key]):
            value = str(g[key])[:40]
            return f"optimizer group {key} {value} is out of range"
    return None


def _buffer_problem(name: str, v: Any) -> str | None:
    """A state entry torch cannot train with, or None: a step count is one finite number >= 0;
    every other entry a dense float tensor laid out as a parameter is (at least one dimension,
    contiguous: no 0-dim or stride-0 stand-in for a parameter-shaped buffer)."""
    if name == "step":
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or v.layout != torch.strided or v.is_complex() or v.dtype == torch.bool:
                return "optimizer step is not one number"
            v = v.item()
        return None if _number(v, 0) else f"optimizer step {str(v)[:40]} is not a count"
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided or v.is_meta:
        return f"optimizer {name[:40]} is not a dense tensor"
    if not v.is_floating_point():
        return f"optimizer {name[:40]} is {str(v.dtype).removeprefix('torch.')}, not a float tensor"
    if v.dim() == 0 or not v.is_contiguous():
        return f"optimizer {name[:40]} is not laid out as its parameter (shape {tuple(v.shape)}, strides {v.stride()})"
    return _buffer_values(name, v)


STATE_MAX = 1e18  # a moment or momentum beyond it is damage: a step's update would overflow what it multiplies


def _buffer_values(name: str, v: torch.Tensor) -> str | None:
    """The values as well as the form: every element finite and within STATE_MAX, a second moment
    (exp_avg_sq, whose square root divides the step) >= 0. A NaN or negative moment would train the
    weights into NaN at the first step and leave the checkpoint to blame the learning rate."""
    if v.numel() == 0:
        return None
    low, high = torch.aminmax(v.detach().float())  # NaN propagates into both: one pass, two numbers
    low, high = low.item(), high.item()
    if not (math.isfinite(low) and math.isfinite(high)) or max(abs(low), abs(high)) > STATE_MAX:
        return f"optimizer {name[:40]} holds values that are not finite or out of range"
    if name == "exp_avg_sq" and low < 0:
        return "optimizer exp_avg_sq holds negative values (a second moment is >= 0)"
    return None


def _hyper(v: Any) -> bool:
    """A value torch's optimizers keep per group: a number, a flag, None, or a tuple of numbers (betas)."""
    if isinstance(v, (tuple, list)):
        return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    return v is None or isinstance(v, (bool, int, float))


def _resume_problem(state: dict[str, Any], optimizer: torch.optim.Optimizer | None) -> str | None:
    """What a resume cannot use in a checkpoint that loaded: RNG states, data position, optimizer."""
    missing = [k for k in RESUME if k not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    from engine.config import build

    try:
        build(state["config"])  # the run's config.toml drives a resume, but a damaged one here is damage
    except UserError:
        return "config is not a valid run config"
    rng = state["rng"]
    if not isinstance(rng, dict) or not all(k in rng for k in ("python", "numpy", "torch", "cuda")):
        return "rng is not the RNG states"
    cpu = rng["torch"]
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8 or cpu.numel() != torch.get_rng_state().numel():
        return "rng.torch is not a CPU generator state"
    if not (isinstance(rng["numpy"], str) and isinstance(rng["python"], (tuple, list))
            and (isinstance(rng["cuda"], list) or _is_bytes_tensor(rng["cuda"]))):  # a list: every GPU's (older)
        return "rng states have the wrong types"
    try:
        position = json.loads(state["data"]) if isinstance(state["data"], str) else None
    except ValueError:
        position = None
    if not isinstance(position, dict):
        return "data is not a sampler position"
    return _guard_problem(state.get("guard")) or _optimizer_problem(state["optimizer"], optimizer)


def _guard_problem(saved: Any) -> str | None:
    """The step guard's loss level and bad-step streak (engine.train.guard.StepGuard.state_dict), or
    None where absent (older runs): a level >= 0, +inf before any (nothing finite beyond the events'
    range), a streak a count; anything else (10**400, NaN, text) is damage."""
    if saved is None:
        return None
    if not isinstance(saved, dict) or set(saved) - {"ema", "streak"}:
        return "guard is not the step guard's state"
    ema, streak = saved.get("ema", math.inf), saved.get("streak", 0.0)
    level = ema == math.inf or _number(ema, 0, FIGURE_MAX, high_open=False)
    if not (level and _number(streak, 0, INT_MAX, high_open=False) and float(streak).is_integer()):
        return "guard holds a loss level or bad-step streak out of range"
    return None


def check_resumable(state: dict[str, Any], path: Path, optimizer: torch.optim.Optimizer | None = None) -> None:
    """--resume needs the RNG, data position and a loadable optimizer too (sample needs only the
    weights). Pass the run's `optimizer` to check its groups and shapes as well."""
    problem = _resume_problem(state, optimizer)
    if problem:
        raise UserError(
            f"{path} cannot be resumed from ({problem}); move it aside and --resume takes the newest "
            "checkpoint left, or start a new run"
        )


def find(run_or_file: Path) -> Path:
    """A checkpoint file from a run directory, a checkpoints/ directory or a file path."""
    if run_or_file.is_file():
        return run_or_file
    for d in (run_or_file / "checkpoints", run_or_file):
        ck = CheckpointDir(d).latest()
        if ck is not None:
            return ck
    if not run_or_file.exists():
        raise UserError(f"{run_or_file} does not exist; give a run directory or a checkpoint file")
    raise UserError(f"{run_or_file} holds no checkpoint; train it longer or pick another run")
