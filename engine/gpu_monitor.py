"""GPU readings (utilization, memory, power, temperature, SM clock) through NVML, off the UI thread.

Why NVML and not torch.cuda: it sees the whole card (other processes, power, clocks) and
costs no CUDA context. `nvidia-ml-py` (module `pynvml`) is the official binding; it is
imported lazily so that a machine without it (or without a driver) still runs, and the
panel says why in one line (`available()`).

A `GpuSampler` reads at about 1 Hz on a daemon thread and hands each round to a callback;
what it reads is injected (`read`), so tests feed recorded samples. A field the card does
not support (NVMLError_NotSupported, common for power on some boards) is None, not a crash.

Recording into events.jsonl: `GpuEvent` below is the proposed `gpu` event, mirroring
engine/events.py. The integrator adds to events.py, next to the others:

    class Gpu(_Event):
        event: Literal["gpu"] = "gpu"
        gpus: list[GpuSample]          # one per visible GPU, from one sampling round

and puts `Gpu` in the `Event` union. `GpuEvent(gpus=samples).model_dump_json()` already
writes the same line that class would.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NOT_INSTALLED = "nvidia-ml-py not installed"
NO_DRIVER = "NVML not available: no NVIDIA driver"
NO_GPU = "no GPU"


class GpuSample(BaseModel):
    """One GPU at one moment; None where the card or driver cannot tell."""

    t: float  # time.time()
    index: int  # NVML index (all GPUs on the box, whatever CUDA_VISIBLE_DEVICES says)
    name: str
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None


class GpuEvent(BaseModel):
    """The proposed `gpu` event (see the module docstring): one sampling round."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    time: float = Field(default_factory=time.time)
    event: Literal["gpu"] = "gpu"
    gpus: list[GpuSample]


Reader = Callable[[], list[GpuSample]]


def _nvml() -> Any:
    import pynvml  # lazily: optional at runtime, and absent on many dev machines

    return pynvml


def available() -> tuple[bool, str]:
    """(True, "N GPU(s): names") when NVML answers, else (False, one line saying why)."""
    try:
        nv = _nvml()
    except ImportError:
        return False, NOT_INSTALLED
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        return False, f"{NO_DRIVER} ({err})"
    try:
        n = nv.nvmlDeviceGetCount()
        names = [_text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
    except nv.NVMLError as err:
        return False, f"NVML not available: {err}"
    finally:
        nv.nvmlShutdown()
    if not n:
        return False, NO_GPU
    return True, f"{n} GPU(s): {', '.join(names)}"


def _text(v: str | bytes) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _field(fn: Callable[[], Any], errors: type[BaseException] | tuple[type[BaseException], ...]) -> Any:
    """The value, or None when this reading fails (not supported, GPU lost, ...)."""
    try:
        return fn()
    except errors:
        return None


def _torch_uuids() -> list[str] | None:
    """The UUIDs of the GPUs this process's CUDA sees, in CUDA's order, when torch has CUDA up
    already (asking costs no context then); None otherwise."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    except Exception:
        return None


def cuda_order(nv: Any, count: int, order: str | None = None) -> list[int]:
    """NVML indices in CUDA's device order (CUDA_DEVICE_ORDER). NVML enumerates by PCI bus id,
    as CUDA does under PCI_BUS_ID; CUDA's default, FASTEST_FIRST, puts faster devices first
    (ties by PCI bus id), approximated here by compute capability, higher first: the same
    order on a machine of one GPU model."""
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") if order is None else order
    indices = list(range(count))
    if order.strip().upper() == "PCI_BUS_ID":
        return indices

    def capability(i: int) -> tuple[int, int]:
        cc = _field(lambda: nv.nvmlDeviceGetCudaComputeCapability(nv.nvmlDeviceGetHandleByIndex(i)),
                    (nv.NVMLError, AttributeError))  # an older binding lacks it: PCI order
        return tuple(cc) if cc else (0, 0)  # type: ignore[return-value]

    return sorted(indices, key=lambda i: tuple(-c for c in capability(i)))


def visible_indices(nv: Any, count: int, env: str | None = None, order: str | None = None,
                    uuids: list[str] | None = None) -> list[int]:  # fmt: skip
    """NVML indices of the GPUs CUDA exposes, in CUDA's order (all when CUDA_VISIBLE_DEVICES
    is unset or unreadable).

    NVML ignores CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, so a job pinned to GPU 3 would
    otherwise watch GPU 0. Exact when torch has CUDA up in this process (`uuids`: each visible
    GPU's UUID, matched to NVML's); else the variable's entries are read as CUDA ordinals
    (`cuda_order`) or UUID prefixes.
    """
    uuids = _torch_uuids() if uuids is None and env is None else uuids
    nvml_uuids: dict[str, int] | None = None

    def by_uuid() -> dict[str, int]:
        nonlocal nvml_uuids
        if nvml_uuids is None:
            nvml_uuids = {}
            for i in range(count):
                u = _field(lambda i=i: _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))), nv.NVMLError)
                if u:
                    nvml_uuids[u] = i
        return nvml_uuids

    if uuids:
        known = by_uuid()
        hits = [next((i for u, i in known.items() if u.removeprefix("GPU-") == w.removeprefix("GPU-")), None) for w in uuids]
        if all(h is not None for h in hits):
            return [h for h in hits if h is not None]
    spec = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    ordinals = cuda_order(nv, count, order)
    if spec is None or not spec.strip():
        return ordinals
    out: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if item.isdigit():
            if int(item) >= count:
                break  # CUDA stops at the first invalid entry
            out.append(ordinals[int(item)])
            continue
        hit = [i for u, i in by_uuid().items() if item and u.startswith(item)]
        if not hit:
            break  # CUDA stops at the first invalid entry
        out.append(hit[0])
    return out or ordinals


def free_bytes(cuda_index: int) -> int | None:
    """Memory free now on CUDA device `cuda_index` (CUDA's numbering), read through NVML, so
    that asking creates no CUDA context in this process (0.3-0.6 GiB held for the process's
    whole life on that GPU); None when NVML cannot say."""
    try:
        nv = _nvml()
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - not installed, no driver: the caller asks CUDA instead
        return None
    try:
        indices = visible_indices(nv, nv.nvmlDeviceGetCount())
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(indices[cuda_index])).free)
    except (nv.NVMLError, IndexError):
        return None
    finally:
        nv.nvmlShutdown()


class NvmlReader:
    """Reads every visible GPU through NVML; `close()` releases the library."""

    def __init__(self, indices: list[int] | None = None):
        nv = _nvml()
        nv.nvmlInit()
        self._nv = nv
        count = nv.nvmlDeviceGetCount()
        self.indices = visible_indices(nv, count) if indices is None else indices
        self._handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in self.indices}
        self._names = {i: _field(lambda h=h: _text(nv.nvmlDeviceGetName(h)), nv.NVMLError) or f"GPU {i}"
                       for i, h in self._handles.items()}  # fmt: skip

    def __call__(self) -> list[GpuSample]:
        nv, err = self._nv, self._nv.NVMLError
        out = []
        for i, h in self._handles.items():
            mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(h), err)
            util = _field(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu, err)
            power = _field(lambda: nv.nvmlDeviceGetPowerUsage(h), err)  # milliwatts
            out.append(GpuSample(
                t=time.time(), index=i, name=self._names[i],
                util_pct=None if util is None else float(util),
                mem_used_bytes=None if mem is None else int(mem.used),
                mem_total_bytes=None if mem is None else int(mem.total),
                power_w=None if power is None else power / 1000.0,
                temp_c=_field(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), err),
                sm_clock_mhz=_field(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)), err),
            ))  # fmt: skip
        return out

    def close(self) -> None:
        _field(self._nv.nvmlShutdown, self._nv.NVMLError)


class GpuSampler:
    """Calls `read` every `interval` seconds on a daemon thread and passes each round to
    `on_samples`. `read=None` opens an NvmlReader on the thread (check `available()` first).

    A failing read or callback is recorded in `last_error` and sampling goes on: a monitor
    must never take the run down. The callback runs on the sampler thread; a Textual app
    hands the samples over with `app.call_from_thread` (or GpuPanel.add_samples, which is
    safe from any thread).
    """

    def __init__(self, on_samples: Callable[[list[GpuSample]], None], *, interval: float = 1.0,
                 read: Reader | None = None):  # fmt: skip
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.on_samples, self.interval, self._read = on_samples, interval, read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.rounds = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Wakes the thread at once (it waits on an Event, never sleeps) and joins it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def _loop(self) -> None:
        read = self._read
        owned: NvmlReader | None = None
        if read is None:
            try:
                read = owned = NvmlReader()
            except Exception as err:  # no library, no driver: say so once and end
                self.last_error = f"NVML not available: {err}"
                return
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    samples = read()
                    if samples:
                        self.on_samples(samples)
                    self.rounds += 1
                except Exception as err:
                    self.last_error = f"{type(err).__name__}: {err}"
                next_at += self.interval
                now = time.monotonic()
                if next_at < now:  # fell behind (a slow read): restart the beat, do not burst
                    next_at = now
                if self._stop.wait(next_at - now):
                    break
        finally:
            if owned is not None:
                owned.close()


__all__ = ["GpuEvent", "GpuSample", "GpuSampler", "NvmlReader", "Reader", "available", "visible_indices"]
