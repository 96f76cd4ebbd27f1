"""Which combinations of the speed switches run on each kind of device, and why the others
do not: the one table that the config validator (engine/config.py), the form and the live
Switches screen (through engine.device.refuse), the trainer's data switches and the speed
ladder (bench/ladder.py `applicable`) read, and that tests/train/test_switch_matrix.py trains
combination by combination.

A `Target` is a device as far as the switches care: cpu, mps, or cuda with or without native
bf16 (Ampere or newer, which brings TF32 too), on one GPU or several (torchrun).

- `REFUSED`: a combination that crashes or computes wrong there, with the reason and the fixes
  as data ({setting: value}, engine/errors.py). A rule `by_config` is decided from the config
  alone, wherever its device may be CUDA (the validator refuses it); the others need the
  machine (engine.device asks with the machine's Target).
- Sliding-window attention (model.attn_window) runs on every target, no rule needed: the manual
  path bands its mask; flash passes SDPA the banded boolean mask instead of is_causal, which on
  CUDA rules out the FlashAttention kernel (it takes no mask): SDPA runs cuDNN's or the
  memory-efficient kernel (engine.train.attention.kernel_name names it), and the T x T mask is
  built each step. Compiled on CUDA without dropout, FlexAttention runs it instead (block-sparse,
  skipping the masked blocks; engine.train.window.flex_reason): a kernel choice, not a rule.
- `IDLE`: a switch value that does nothing there (the run trains as without it): the ladder
  skips its rung, the trainer leaves it off, the form says why.

This module imports engine.errors only: engine.config imports it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import Invalid

Kind = Literal["cpu", "mps", "cuda"]
Values = Mapping[str, Any]  # {dotted setting: value}; a setting left out has its default (DEFAULTS)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # compile modes that capture CUDA graphs
NO_GRAPHS = "max-autotune-no-cudagraphs"


@dataclass(frozen=True)
class Target:
    kind: Kind
    bf16: bool = True  # native bf16 (CUDA: compute capability 8.0+); CPUs autocast to bf16 either way
    gpus: int = 1  # processes, one GPU each (torchrun); > 1 offers speed.parallel

    @property
    def tf32(self) -> bool:
        return self.kind == "cuda" and self.bf16  # TF32 tensor cores came with bf16 (Ampere)


CPU = Target("cpu")
CUDA_TARGETS = tuple(Target("cuda", bf16, gpus) for bf16 in (True, False) for gpus in (1, 2))
TARGETS = (CPU, Target("mps"), *CUDA_TARGETS)

# The switch values that change what code runs, and so are crossed in `combinations`; the
# defaults of the settings the rules read (engine/config.py holds the same defaults).
AXES: dict[str, tuple[Any, ...]] = {
    "speed.precision": ("fp32", "tf32", "bf16", "fp16"),
    "speed.compile": (False, True),
    "speed.compile_mode": ("default", "reduce-overhead", "max-autotune", NO_GRAPHS),
    "speed.compile_scope": ("blocks", "model"),
    "model.attention": ("flash", "manual"),
    "model.grad_checkpointing": (False, True),
    "model.loss": ("plain", "chunked"),
    "speed.parallel": ("ddp", "fsdp"),
}
DEFAULTS: dict[str, Any] = {"speed.compile": False, "speed.compile_mode": "default", "speed.compile_scope": "blocks",
                            "speed.parallel": "auto", "speed.precision": "auto", "train.grad_accum": 1,
                            "optim.optimizer": "adamw"}  # fmt: skip


def _v(values: Values, dotted: str) -> Any:
    return values.get(dotted, DEFAULTS.get(dotted))


def _graphs(values: Values) -> bool:
    return bool(_v(values, "speed.compile")) and _v(values, "speed.compile_mode") in CUDA_GRAPH_MODES


@dataclass(frozen=True)
class Rule:
    """A refused combination: where (`on`), when (`when` on the values), why, and the fixes."""

    name: str
    settings: tuple[str, ...]  # the settings it names (the form marks them)
    on: Callable[[Target], bool]
    when: Callable[[Values], bool]
    why: Callable[[Values], str]
    fixes: tuple[dict[str, Any], ...]
    by_config: bool = True  # decided from the config alone; False: needs the machine's Target

    def refusal(self, values: Values) -> Invalid:
        return Invalid(self.why(values), *self.fixes)


REFUSED: tuple[Rule, ...] = (
    Rule("cuda graphs + blocks", ("speed.compile_scope", "speed.compile_mode"),
         lambda t: t.kind == "cuda", lambda v: _graphs(v) and _v(v, "speed.compile_scope") == "blocks",
         lambda v: f"compile mode {_v(v, 'speed.compile_mode')} with compile scope blocks crashes on CUDA: its CUDA "
                   "graph trees free one compiled block's outputs when the next block runs at an eval (no_grad) or in a "
                   "checkpointed backward (pytorch#152887, #160281)",
         ({"speed.compile_scope": "model"}, {"speed.compile_mode": NO_GRAPHS})),
    Rule("cuda graphs + fsdp", ("speed.parallel", "speed.compile_mode"),
         lambda t: t.kind == "cuda" and t.gpus > 1, lambda v: _graphs(v) and _v(v, "speed.parallel") == "fsdp",
         lambda v: f"compile mode {_v(v, 'speed.compile_mode')} with parallel fsdp: FSDP2 frees and re-allocates the "
                   "unsharded parameters at every all-gather, under the addresses its CUDA graphs captured",
         ({"speed.compile_mode": NO_GRAPHS}, {"speed.parallel": "ddp"})),
    # reduce-overhead and max-autotune replay CUDA graphs whose outputs (the .grad tensors allocated
    # during capture) are overwritten by the next replay: accumulating gradients over micro-batches
    # reads overwritten memory (torch/_inductor/cudagraph_trees.py names this case). Refused on every
    # device, as it always was: a config that trains on CPU must not change meaning on a GPU.
    Rule("cuda graphs + accumulation", ("train.grad_accum", "speed.compile_mode"),
         lambda t: True, lambda v: _graphs(v) and _v(v, "train.grad_accum") > 1,
         lambda v: f"compile mode {_v(v, 'speed.compile_mode')} with grad accumulation {_v(v, 'train.grad_accum')}: "
                   "its CUDA graphs overwrite the accumulated gradients",
         ({"speed.compile_mode": NO_GRAPHS}, {"speed.compile_mode": "default"}, {"train.grad_accum": 1})),
    # torch.optim.Muon orthogonalizes each whole 2-D gradient: an FSDP2 shard (a DTensor holding
    # rows of it) is not the matrix, and torch has no sharded Muon. Refused on every device, so a
    # config means the same on any machine; auto picks DDP for Muon (engine.train.distributed.choose).
    Rule("muon + fsdp", ("optim.optimizer", "speed.parallel"),
         lambda t: True, lambda v: _v(v, "optim.optimizer") == "muon" and _v(v, "speed.parallel") == "fsdp",
         lambda v: "optimizer muon with parallel fsdp: torch.optim.Muon orthogonalizes whole weight matrices, "
                   "not FSDP2 shards",
         ({"speed.parallel": "ddp"}, {"optim.optimizer": "adamw"})),
    # Not built: torch._scaled_mm's FP8 head (modded-nanogpt's) needs CUDA capability 9.0+, and no
    # Hopper GPU was there to test it; untested CUDA code is not shipped, so it is refused everywhere.
    Rule("fp8 head", ("model.fp8_head",),
         lambda t: True, lambda v: bool(_v(v, "model.fp8_head")),
         lambda v: "model.fp8_head is not built yet: an FP8 lm_head (torch._scaled_mm) runs only on a Hopper GPU "
                   "(CUDA capability 9.0+), and none was there to test it",
         ({"model.fp8_head": False},)),
    Rule("bf16 without native bf16", ("speed.precision",),
         lambda t: t.kind == "cuda" and not t.bf16, lambda v: _v(v, "speed.precision") == "bf16",
         lambda v: "this GPU has no bf16 support",
         ({"speed.precision": "fp16 (with its GradScaler) or tf32"},), by_config=False),
)  # fmt: skip


# The compiles that only several ranks reach, each either trained by the matrix test under
# torchrun (gloo on CPU, where CUDA graphs idle; NCCL on a box of 2+ GPUs) or refused by a rule
# above, its reason said (`verdict`): DDP replicating a CUDA-graph compile (scope model: graphs
# with blocks are refused), and FSDP2 sharding compiled blocks (torchtitan's own layout).
PARALLEL_COMPILES: dict[str, dict[str, Any]] = {
    "ddp + reduce-overhead": {"speed.parallel": "ddp", "speed.compile": True, "speed.compile_mode": "reduce-overhead",
                              "speed.compile_scope": "model"},
    "fsdp + compiled blocks": {"speed.parallel": "fsdp", "speed.compile": True, "speed.compile_scope": "blocks"},
}  # fmt: skip


def verdict(values: Values, target: Target) -> str | None:
    """None when these values train on this target, else why not (the first refusing rule's reason)."""
    rules = refusals(values, target)
    return rules[0].why(values) if rules else None


@dataclass(frozen=True)
class Idle:
    """A switch value that does nothing on some targets (`off` says where), and why."""

    dotted: str
    value: Any
    off: Callable[[Target], bool]
    why: Callable[[Target], str]


IDLE: tuple[Idle, ...] = (
    Idle("speed.precision", "tf32", lambda t: not t.tf32,
         lambda t: "TF32 needs a CUDA GPU (Ampere or newer)" if t.kind != "cuda"
         else "TF32 needs an Ampere or newer GPU (compute capability 8.0+)"),
    Idle("data.pin_memory", True, lambda t: t.kind != "cuda", lambda t: "pinned memory needs CUDA"),
    # both data switches overlap host work with an accelerator's; on CPU the host is the device:
    # the thread only takes cores from the math (measured in docs/benchmarks.md)
    Idle("data.prefetch", True, lambda t: t.kind == "cpu",
         lambda t: "the prefetch thread needs an accelerator: on CPU it takes cores from the math"),
)  # fmt: skip


def targets_of(device: str) -> tuple[Target, ...]:
    """The targets a `speed.device` value may run on, as far as a config can tell."""
    if device == "cpu":
        return (CPU,)
    if device == "mps":
        return (Target("mps"),)
    return CUDA_TARGETS if device == "cuda" else TARGETS


def refusals(values: Values, target: Target) -> list[Rule]:
    """The rules that refuse these values on this target (empty: supported)."""
    return [r for r in REFUSED if r.on(target) and r.when(values)]


def check_config(values: Values, device: str) -> None:
    """The validator's check: raise the first config rule refusing these values on any target
    `device` may be (engine.config calls it, so the CLI, the form and a toggle all refuse alike)."""
    where = targets_of(device)
    for rule in REFUSED:
        if rule.by_config and rule.when(values) and any(rule.on(t) for t in where):
            raise rule.refusal(values)


def idle(dotted: str, value: Any, target: Target) -> str | None:
    """Why this switch value does nothing on this target, or None when it does something."""
    for entry in IDLE:
        if entry.dotted == dotted and entry.value == value and entry.off(target):
            return entry.why(target)
    return None


def idle_switches(target: Target) -> dict[str, str]:
    """The on/off switches that do nothing on this target -> why."""
    return {e.dotted: e.why(target) for e in IDLE if e.value is True and e.off(target)}


def combinations(target: Target) -> list[dict[str, Any]]:
    """Every supported combination of the AXES on this target: refused ones and idle values
    (they would train as another combination) left out, compile's mode and scope only with
    compile, speed.parallel only on several GPUs."""
    names = [n for n in AXES if n != "speed.parallel" or target.gpus > 1]
    out = []
    for values in itertools.product(*(AXES[n] for n in names)):
        combo = dict(zip(names, values))
        if not combo["speed.compile"] and (combo["speed.compile_mode"], combo["speed.compile_scope"]) != ("default", "blocks"):
            continue  # mode and scope only mean something compiled: one uncompiled combination, not eight
        if any(idle(n, v, target) for n, v in combo.items()) or refusals(combo, target):
            continue
        out.append(combo)
    return out
