"""Which SDPA kernel `flash` runs: on CUDA the fastest of the fused kernels, timed; the run
says which one ran. The timing itself needs a GPU (the GPU report runs it in doctor); the
choice, the priority it sets for the segment and what the events say are shown here."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from engine import events as ev
from engine.config import resolve
from engine.run.owner import start
from engine.text import attention_text, describe
from engine.train import attention


def _cuda_shape(batch: int = 4) -> attention.Shape:
    return attention.Shape(batch, 12, 1024, 64, torch.bfloat16, torch.device("cuda", 0))  # never allocated here


def test_the_fastest_kernel_that_runs_is_picked_and_measured_once_per_shape(monkeypatch) -> None:
    monkeypatch.setattr(attention, "_measured", {})
    asked: list[str] = []

    def timer(name: str, shape: attention.Shape) -> float | None:
        asked.append(name)
        return {"cuDNN": 0.8, "flash": 1.1, "efficient": None}[name]

    choice = attention.choose(_cuda_shape(), timer)
    assert choice.picked == "cuDNN" and choice.timings == {"cuDNN": 0.8, "flash": 1.1, "efficient": None}
    assert choice.text() == "cuDNN 0.80 ms, flash 1.10 ms, efficient n/a: cuDNN"
    assert attention.choose(_cuda_shape(), timer) is choice and len(asked) == 3  # once per shape
    attention.choose(_cuda_shape(batch=8), timer)
    assert len(asked) == 6
    assert attention.pick({"cuDNN": None, "flash": None, "efficient": None}) is None


def test_on_cpu_nothing_is_timed_or_picked() -> None:
    shape = attention.shape_of(2, 4, 64, 128, torch.float32, torch.device("cpu"))
    assert attention.choose(shape, lambda *_: 1 / 0) == attention.Choice({}, None)
    assert attention.kernel_name(shape) == "flash"  # SDPA's own choice on this CPU


def test_measuring_never_touches_the_runs_rng() -> None:
    """Set-up measures after a resume restored the RNG: a draw from it would break the
    bit-exact resume (dropout), as the stop/resume tests found."""
    shape = attention.shape_of(2, 4, 64, 128, torch.float32, torch.device("cpu"))
    before = torch.get_rng_state()
    attention.kernel_name(shape)
    assert attention.time_kernel("flash", shape, rounds=1) is not None
    assert torch.equal(torch.get_rng_state(), before)


def test_the_pick_leads_sdpa_priority_for_the_segment_and_only_then() -> None:
    before = torch._C._get_sdp_priority_order()
    with attention.prefer("cuDNN"):
        order = [int(b) for b in torch._C._get_sdp_priority_order()]
        assert order[:3] == [int(SDPBackend.CUDNN_ATTENTION), int(SDPBackend.FLASH_ATTENTION),
                             int(SDPBackend.EFFICIENT_ATTENTION)]  # fmt: skip
    assert torch._C._get_sdp_priority_order() == before
    with attention.prefer(None):
        assert torch._C._get_sdp_priority_order() == before


def test_a_run_trains_under_its_pick_and_its_events_name_the_kernel(tmp_path, tiny_dataset, monkeypatch) -> None:
    """A stand-in measurement (CUDA's, which this CPU cannot make) picks cuDNN: every step runs
    with cuDNN first in SDPA's priority, and run_started names the kernel and the timings."""
    picked = attention.Choice({"cuDNN": 0.8, "flash": 1.1, "efficient": None}, "cuDNN")
    monkeypatch.setattr(attention, "choose", lambda shape: picked)
    seen: list[int] = []
    got: list[object] = []

    def sink(e) -> None:
        got.append(e)
        if isinstance(e, ev.Step):
            seen.append(int(torch._C._get_sdp_priority_order()[0]))

    config = resolve("micro", None, {"data.path": str(tiny_dataset), "speed.device": "cpu", "speed.precision": "fp32",
                                     "model.attention": "flash", "train.max_steps": 3, "train.log_interval": 1})  # fmt: skip
    start(config, tmp_path / "run", sinks=[ev.CallbackSink(sink)]).run()
    assert seen == [int(SDPBackend.CUDNN_ATTENTION)] * 3
    started = next(e for e in got if isinstance(e, ev.RunStarted))
    assert started.attention == "flash" and started.attention_ms == picked.timings  # what ran: CPU's kernel
    assert "attention flash (measured: cuDNN 0.80 ms, flash 1.10 ms, efficient n/a)" in describe(started)
    manual = config.model_copy(update={"model": config.model.model_copy(update={"attention": "manual"})})
    got.clear()
    start(manual, tmp_path / "manual", sinks=[ev.CallbackSink(sink)]).run()
    started = next(e for e in got if isinstance(e, ev.RunStarted))
    assert started.attention is None and attention_text(started) == ""
