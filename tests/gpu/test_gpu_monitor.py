"""The GPU monitor without a GPU: recorded samples through the sampler thread, a fake NVML
for the reader (fields that fail give None), and what `available()` says on this machine."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from engine import gpu_monitor as gm
from engine.gpu_monitor import GpuEvent, GpuSample, GpuSampler, NvmlReader, available, visible_indices

RECORDED = [
    [GpuSample(t=100.0 + k, index=i, name="NVIDIA H100 80GB HBM3", util_pct=90.0 + k, mem_used_bytes=(40 + k) * 2**30,
               mem_total_bytes=80 * 2**30, power_w=600.0 + k, temp_c=60.0 + k, sm_clock_mhz=1980)
     for i in range(2)]
    for k in range(5)
]  # fmt: skip


def replay(rounds: list[list[GpuSample]]):
    it = iter(rounds)
    return lambda: next(it, [])


def test_sampler_thread_hands_recorded_rounds_to_the_callback_in_order():
    got: list[list[GpuSample]] = []
    threads: set[str] = set()
    done = threading.Event()

    def on_samples(samples: list[GpuSample]) -> None:
        got.append(samples)
        threads.add(threading.current_thread().name)
        if len(got) == len(RECORDED):
            done.set()

    sampler = GpuSampler(on_samples, interval=0.01, read=replay(RECORDED))
    sampler.start()
    assert done.wait(30), "the sampler never delivered every round"
    sampler.stop()
    assert not sampler.running
    assert got == RECORDED
    assert threads == {"gpu-sampler"}  # off the caller's (the UI's) thread


def test_stop_is_prompt_even_with_a_long_interval():
    first = threading.Event()
    sampler = GpuSampler(lambda s: first.set(), interval=600.0, read=replay(RECORDED))
    sampler.start()
    assert first.wait(30)
    sampler.stop(timeout=10)  # a sleep(600) would still be running after the join's timeout
    assert not sampler.running


def test_a_failing_read_or_callback_is_recorded_and_sampling_goes_on():
    calls = {"n": 0}
    two = threading.Event()

    def flaky() -> list[GpuSample]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("GPU is lost")
        return RECORDED[0]

    def on_samples(samples: list[GpuSample]) -> None:
        if calls["n"] >= 3:
            two.set()
        raise ValueError("the UI went away")

    sampler = GpuSampler(on_samples, interval=0.01, read=flaky)
    sampler.start()
    assert two.wait(30)
    sampler.stop()
    assert sampler.last_error and "the UI went away" in sampler.last_error


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        GpuSampler(lambda s: None, interval=0)


# ------------------------------------------------------------------------------ fake NVML


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


def fake_pynvml(count: int = 2, unsupported: set[str] = frozenset()) -> types.ModuleType:
    """Just enough of pynvml's surface; functions named in `unsupported` raise NotSupported."""
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVMLError_NotSupported = _NVMLError, _NotSupported
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1
    m.inits = 0

    def may_fail(name, fn):
        def call(*a):
            if name in unsupported:
                raise _NotSupported("Not Supported")
            return fn(*a)
        return call

    def init():
        m.inits += 1

    def shutdown():
        m.inits -= 1

    m.nvmlInit, m.nvmlShutdown = init, shutdown
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetName = may_fail("name", lambda h: f"Fake GPU {h[1]}".encode())
    m.nvmlDeviceGetUUID = lambda h: f"GPU-0000-{h[1]}"
    m.nvmlDeviceGetUtilizationRates = may_fail("util", lambda h: types.SimpleNamespace(gpu=77, memory=10))
    m.nvmlDeviceGetMemoryInfo = may_fail("mem", lambda h: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30, free=0))
    m.nvmlDeviceGetPowerUsage = may_fail("power", lambda h: 123456)
    m.nvmlDeviceGetTemperature = may_fail("temp", lambda h, kind: 55)
    m.nvmlDeviceGetClockInfo = may_fail("clock", lambda h, kind: 1410)
    return m


def test_nvml_reader_reads_every_field(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    reader = NvmlReader()
    samples = reader()
    assert [s.index for s in samples] == [0, 1]
    s = samples[1]
    assert s.name == "Fake GPU 1" and s.util_pct == 77.0
    assert (s.mem_used_bytes, s.mem_total_bytes) == (3 * 2**30, 16 * 2**30)
    assert s.power_w == pytest.approx(123.456) and s.temp_c == 55.0 and s.sm_clock_mhz == 1410
    reader.close()
    assert nv.inits == 0


def test_fields_that_raise_give_none_not_a_crash(monkeypatch):
    nv = fake_pynvml(count=1, unsupported={"power", "clock", "util", "name"})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    (s,) = NvmlReader(indices=[0])()
    assert s.power_w is None and s.sm_clock_mhz is None and s.util_pct is None
    assert s.name == "GPU 0" and s.temp_c == 55.0 and s.mem_used_bytes == 3 * 2**30


def test_sampler_opens_nvml_itself_when_no_reader_is_given(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1))
    got: list[list[GpuSample]] = []
    one = threading.Event()
    sampler = GpuSampler(lambda s: (got.append(s), one.set()), interval=0.01)
    sampler.start()
    assert one.wait(30)
    sampler.stop()
    assert got[0][0].name == "Fake GPU 0"


def test_visible_indices_follow_cuda_visible_devices():
    nv = fake_pynvml(count=4)
    assert visible_indices(nv, 4, "") == [0, 1, 2, 3]
    assert visible_indices(nv, 4, "2,3") == [2, 3]
    assert visible_indices(nv, 4, "GPU-0000-3") == [3]
    assert visible_indices(nv, 4, "1,bogus,2") == [1]  # CUDA stops at the first bad entry


def test_available_with_a_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=2))
    assert available() == (True, "2 GPU(s): Fake GPU 0, Fake GPU 1")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=0))
    assert available() == (False, gm.NO_GPU)


def test_available_without_the_binding(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert available() == (False, gm.NOT_INSTALLED)


def test_available_on_this_machine_says_why_in_one_line():
    ok, reason = available()
    assert reason and "\n" not in reason
    if not ok:  # the dev/CI machines: CPU only
        assert reason.startswith((gm.NO_DRIVER, gm.NOT_INSTALLED, gm.NO_GPU, "NVML not available")), reason
    else:
        assert "GPU" in reason


def test_gpu_event_round_trips_through_json():
    e = GpuEvent(gpus=RECORDED[0])
    line = e.model_dump_json()
    assert '"event":"gpu"' in line
    assert GpuEvent.model_validate_json(line) == e


def test_visible_indices_follow_cuda_device_order():
    """NVML numbers GPUs by PCI bus id; CUDA's default order (FASTEST_FIRST) puts the faster
    first. CUDA_VISIBLE_DEVICES=0 on a box with an old card in PCI slot 0 and a new one in
    slot 1 means the new card, unless CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    nv = fake_pynvml(count=2)
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: [(7, 0), (9, 0)][h[1]]  # a V100, then an H100
    assert visible_indices(nv, 2, "0", order="PCI_BUS_ID") == [0]
    assert visible_indices(nv, 2, "0", order="FASTEST_FIRST") == [1]
    assert visible_indices(nv, 2, "", order="FASTEST_FIRST") == [1, 0]
    # torch's own UUIDs of the visible GPUs (CUDA up in this process) decide exactly
    assert visible_indices(nv, 2, "1", order="FASTEST_FIRST", uuids=["GPU-0000-1"]) == [1]
