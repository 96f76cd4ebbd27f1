"""torch.compile for one segment: what it compiles, what it carries in the run, what it cost.

Scope (`speed.compile_scope`):
    model   torch.compile(model): one graph for the whole forward (embeddings, every block,
            final norm, loss); the longest cold compile, every op fusable across blocks.
    blocks  each transformer Block compiled in place (Module.compile): all blocks share one
            code object and Dynamo treats their parameters as inputs, so one graph is traced
            and built once and reused by every layer (PyTorch's regional-compilation recipe);
            the final norm, lm_head and loss (GPT.loss_head) are one more small region,
            the embeddings stay eager. The cold compile no longer grows with depth; the
            parameter names (state_dict) stay as they are.

Run artifacts: after the first compiled steps the trainer saves
torch.compiler.save_cache_artifacts() into the run directory (`compile-artifacts.bin`,
written atomically, never through a link) and loads it with load_cache_artifacts() before
the next compile of that run: a resume, a live toggle back to compile, the run copied to a
new machine. A file from another torch version or device is ignored with one line.

Those bytes are code: torch unpickles them and writes each entry where its key says (an
absolute key is a path anywhere). So a run's artifacts reach torch only when this user made
them on this machine: save signs the file (HMAC-SHA256 in its header) with a per-user key kept
in the gpt2-tui cache (`compile-artifacts.key`, mode 0600, engine.files.private_key), and load
checks the signature before anything else; an unsigned, foreign or altered file (a planted
one, a run copied from elsewhere) is ignored with one line and never handed to torch.

Warm-up: `Warmup` reads torch's own counters and compile metrics around a segment's first
steps: the seconds spent compiling, whether anything was compiled at all (a Dynamo that
hit its recompile limit runs eager), and where the code came from (cold, warm from the
on-disk caches, or from the run's artifacts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any, Literal

import torch

from engine import events as ev
from engine import files

ARTIFACTS = "compile-artifacts.bin"
MAX_ARTIFACTS_BYTES = 2 << 30  # read bounded: a run directory is a trust boundary
_MAGIC = b"gpt2-tui compile artifacts 2\n"  # 2: signed (version 1 files are ignored)
KEY = "compile-artifacts.key"  # in the gpt2-tui cache (engine.files.cache_root)
Scope = Literal["model", "blocks"]


def compile_forward(model: torch.nn.Module, scope: Scope, mode: str | None,
                    backend: str = "inductor") -> torch.nn.Module:  # fmt: skip
    """What the trainer calls forward: the model compiled whole, or the model with each of its
    blocks compiled in place (the same module: its state_dict names do not change). `backend`:
    Inductor; tests trace with another (aot_eager: Dynamo and AOTAutograd, no code generated)."""
    if scope == "blocks":
        for block in model.transformer.h:  # type: ignore[union-attr]
            block.compile(mode=mode, backend=backend)
        model.loss_head = torch.compile(model.loss_head, mode=mode, backend=backend)  # an attribute: no state
        return model
    return torch.compile(model, mode=mode, backend=backend)


def reset() -> None:
    """Forget every compiled graph of this process (a live toggle's hand-over): the old
    segment's guards, cache entries and CUDA-graph pools go, so repeated toggles never reach
    the recompile limit; the on-disk caches keep the next compile cheap."""
    torch._dynamo.reset()


# ------------------------------------------------------------------------------ artifacts


def _stamp(device_label: str) -> dict[str, str]:
    return {"torch": torch.__version__, "device": device_label}


def signing_key(create: bool = False) -> bytes | None:
    """This user's key for the run artifacts (None when there is none yet and not `create`);
    Refused (an OSError) for a key file that is a link, not ours or readable by others."""
    from engine.files import cache_root

    return files.private_key(cache_root() / KEY, create=create)


def _mac(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, signed, hashlib.sha256).hexdigest().encode()


def pack(stamp: dict[str, str], body: bytes, key: bytes) -> bytes:
    """The artifacts file: magic, stamp, the HMAC of magic+stamp+body, body."""
    stamp_line = json.dumps(stamp).encode()
    return _MAGIC + stamp_line + b"\n" + _mac(key, _MAGIC + stamp_line + b"\n" + body) + b"\n" + body


def unpack(data: bytes, device_label: str) -> tuple[bytes | None, str]:
    """(the body torch may load, "") if this user's key signed `data` for this torch and
    device, else (None, why not, in words)."""
    if not data.startswith(_MAGIC):
        return None, "not a signed gpt2-tui artifacts file"
    stamp_line, _, rest = data[len(_MAGIC):].partition(b"\n")
    mac, _, body = rest.partition(b"\n")
    try:
        key = signing_key()
    except OSError as err:
        return None, f"this user's signing key cannot be used: {err}"
    if key is None or not hmac.compare_digest(mac, _mac(key, _MAGIC + stamp_line + b"\n" + body)):
        return None, "not made by this user on this machine: its signature does not match"
    try:
        stamp = json.loads(stamp_line)
    except ValueError:
        stamp = None
    if not isinstance(stamp, dict):
        return None, "not a signed gpt2-tui artifacts file"
    if stamp != _stamp(device_label):
        return None, (f"made by torch {stamp.get('torch')} on {stamp.get('device')}, "
                      f"this is torch {torch.__version__} on {device_label}")  # fmt: skip
    return body, ""


def save_artifacts(run_dir: Path, device_label: str) -> int | None:
    """What this process compiled so far, signed, into run_dir/ARTIFACTS (atomic, O_NOFOLLOW|O_EXCL
    temp file, then a rename); the bytes written, or None when torch had nothing to save."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data = pack(_stamp(device_label), saved[0], signing_key(create=True))  # type: ignore[arg-type]
    files.atomic_write_bytes(Path(run_dir) / ARTIFACTS, data)  # O_EXCL temp, rename: never through a link
    return len(data)


def _read_bounded(path: Path) -> bytes | None:
    try:
        return files.read_bounded(path, MAX_ARTIFACTS_BYTES)  # a link, FIFO or huge file: Refused
    except FileNotFoundError:
        return None


def load_artifacts(run_dir: Path, device_label: str) -> tuple[bool, str | None]:
    """Hot-load the run's artifacts into torch's caches before a compile: (loaded, one-line
    reason it was ignored). A missing file is neither; one this user's key did not sign (a
    planted or copied one), a foreign or a damaged one is ignored and never reaches torch."""
    path = Path(run_dir) / ARTIFACTS
    try:
        data = _read_bounded(path)
    except (OSError, ValueError) as err:
        return False, f"compile artifacts {path} ignored ({err}); this segment compiles without them"
    if data is None:
        return False, None
    body, why = unpack(data, device_label)
    if body is None:
        return False, f"compile artifacts {path} ignored ({why}); this segment compiles without them"
    try:
        info = torch.compiler.load_cache_artifacts(body)
    except Exception as err:  # torch's own reader: damage is a miss, never an error
        return False, f"compile artifacts {path} ignored ({type(err).__name__}); this segment compiles without them"
    if info is None:
        return False, f"compile artifacts {path} ignored (unreadable by torch {torch.__version__})"
    return True, None


# ------------------------------------------------------------------------------ the warm-up


def _cache_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    ind, aot = counters["inductor"], counters["aot_autograd"]
    hits = ind["fxgraph_cache_hit"] + aot["autograd_cache_hit"]
    misses = ind["fxgraph_cache_miss"] + aot["autograd_cache_miss"]
    return hits, misses


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class Warmup:
    """Torch's counters at a segment's compile, read again after its first steps."""

    def __init__(self, scope: str, from_artifacts: bool) -> None:
        from torch._dynamo.utils import clear_compilation_metrics

        clear_compilation_metrics()
        self.scope, self.from_artifacts = scope, from_artifacts
        self.hits0, self.misses0 = _cache_counts()
        self.graphs0 = _graphs()

    def read(self, step: int) -> ev.Compiled:
        from torch._dynamo.utils import get_compilation_metrics

        seconds = 0.0
        for m in get_compilation_metrics():
            seconds += m.entire_frame_compile_time_s or 0.0
            seconds += (m.backward_cumulative_compile_time_us or 0) / 1e6
        hits, misses = _cache_counts()
        hits, misses = hits - self.hits0, misses - self.misses0
        graphs = _graphs() - self.graphs0
        source: Any = "cold" if misses or not hits else ("run artifacts" if self.from_artifacts else "warm disk")
        return ev.Compiled(
            step=step, scope=self.scope, compiled=graphs > 0, graphs=graphs, compile_s=seconds,
            source=source, cache_hits=hits, cache_misses=misses,
        )  # fmt: skip
