"""Which SDPA kernel `flash` runs: on CUDA the fastest of the fused kernels, timed; the run
says which one ran. The timing itself needs a GPU (the GPU report runs it in doctor); the
choice, the priority it sets for the segment and what the events say are shown here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from engine import events as ev
from engine.config import resolve
from engine.run.owner import start
from engine.text import attention_text, describe
from engine.train import attention
from harness import ROOT


def _cuda_shape(batch: int = 4) -> attention.Shape:
    return attention.Shape(batch, 12, 1024, 64, torch.bfloat16, torch.device("cuda", 0))  # never allocated here


def test_the_fastest_kernel_that_runs_is_picked_and_measured_once_per_shape(monkeypatch) -> None:
    monkeypatch.setattr(attention, "_measured", {})
    asked: list[attention.Shape] = []

    def timer(shape: attention.Shape) -> dict[str, float | None]:
        asked.append(shape)
        return {"cuDNN": 0.8, "flash": 1.1, "efficient": None}

    choice = attention.choose(_cuda_shape(), timer)
    assert choice.picked == "cuDNN" and choice.timings == {"cuDNN": 0.8, "flash": 1.1, "efficient": None}
    assert choice.text() == "cuDNN 0.80 ms, flash 1.10 ms, efficient n/a: cuDNN"
    assert attention.choose(_cuda_shape(), timer) is choice and len(asked) == 1  # once per shape
    attention.choose(_cuda_shape(batch=8), timer)
    assert len(asked) == 2
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
    ms = attention.measure(shape, rounds=1)
    assert ms["flash"] is not None and ms["cuDNN"] is None and ms["efficient"] is None  # CPU: one fused kernel
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


@pytest.mark.slow
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


def test_the_timing_alternates_the_candidates_and_keeps_each_ones_best() -> None:
    """Fair to each kernel: the order turns every round (none always first after a pause, none
    always last) and a slow sample (a first call, a hiccup) never stands for a kernel's speed."""
    order: list[str] = []

    def call(name: str, slow_first: bool = False):
        def once() -> None:
            order.append(name)
            time.sleep(0.02 if slow_first and order.count(name) == 1 else 0.002)

        return once

    best = attention.time_rounds({"a": call("a", slow_first=True), "b": call("b"), "c": call("c")}, rounds=3,
                                 per_sample=1)  # fmt: skip
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert set(best) == {"a", "b", "c"} and all(2 <= ms < 15 for ms in best.values())  # a's 20 ms sample dropped


def test_measuring_leaves_the_process_warnings_alone_while_another_thread_trains() -> None:
    """warnings.catch_warnings() swaps the process's filters: a training thread's warnings
    raised meanwhile were silently dropped. The measurement asks SDPA's checks instead."""
    shape = attention.shape_of(2, 4, 256, 128, torch.float32, torch.device("cpu"))
    stop, sent = threading.Event(), []

    def other_thread() -> None:
        while not stop.is_set():
            sent.append(len(sent))
            warnings.warn(f"from the training thread {sent[-1]}", UserWarning, stacklevel=1)
            time.sleep(0.0005)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        worker = threading.Thread(target=other_thread)
        worker.start()
        try:
            for _ in range(3):
                attention.measure(shape, rounds=3)
        finally:
            stop.set()
            worker.join()
    got = [w for w in seen if "from the training thread" in str(w.message)]
    assert len(sent) > 0 and len(got) == len(sent)


RANK_CHILD = r"""
import json, os, sys
import torch
from engine.train import attention, distributed

ctx = distributed.init("cpu")
measured = []

def timer(shape):  # each rank's own (different) measurement, as two GPUs may read
    measured.append(ctx.rank)
    return {"cuDNN": 1.0 + ctx.rank, "flash": 1.5 - ctx.rank, "efficient": None}

shape = attention.Shape(4, 12, 1024, 64, torch.bfloat16, torch.device("cuda", ctx.local_rank))  # never allocated
choice = attention.choose(shape, timer)
print("RESULT " + json.dumps({"rank": ctx.rank, "picked": choice.picked, "timings": choice.timings,
                              "measured": measured}), flush=True)
distributed.shutdown()
distributed.leave(0)  # as the CLI's workers leave: before the interpreter's teardown
"""


@pytest.mark.slow
def test_rank_0_measures_and_every_rank_runs_its_pick(tmp_path) -> None:
    """Two gloo ranks whose own timings disagree (rank 1 alone would pick flash): both run
    rank 0's pick, and only rank 0 spends the time measuring."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_CHILD], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, err[-3000:]
        results.append(json.loads(line.removeprefix("RESULT ")))
    assert [r["picked"] for r in results] == ["cuDNN", "cuDNN"]
    assert results[0]["timings"] == results[1]["timings"] == {"cuDNN": 1.0, "flash": 1.5, "efficient": None}
    assert [r["measured"] for r in results] == [[0], []]


@pytest.mark.parametrize("version, seq, allowed", [
    (91500, 32, False), (91500, 1000, False), (91500, 1024, True),  # cuDNN <= 9.15: multiples of 128 only
    (91600, 32, True), (None, 32, False), (None, 256, True),
])  # fmt: skip
def test_cudnn_attention_is_never_picked_where_torch_itself_avoids_it(monkeypatch, version, seq, allowed):
    """Issue 45 item 1: cuDNN's SDPA up to 9.15 writes out of bounds for a sequence length not a
    multiple of 128 (pytorch#169849): our timing no longer offers it there (the doctor's T = 32
    rows, a --block-size 1000), from cuDNN 9.16 on any length; the doctor prints the version."""
    import torch

    from engine.inspect import doctor
    from engine.train import attention

    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: version is not None)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: version)
    assert attention.cudnn_allowed(seq) is allowed
    said = doctor._cudnn_text()  # the doctor's cuDNN row
    assert (str(version) in said and ("any" in said) == (version >= 91600)) if version else said == "not available"


@pytest.mark.parametrize("switches", [{}, {"model.qk_norm": True, "model.positions": "rotary"},
                                      {"model.attn_window": 5}, {"model.value_residual": True}],
                         ids=["plain", "qk-norm+rotary", "window", "value-residual"])  # fmt: skip
def test_the_kernel_timer_times_the_call_the_model_makes(monkeypatch, switches) -> None:
    """Issue 45 item 2: the kernels were timed on a causal call of contiguous tensors while the run
    passed the window's band mask (flash then cannot run) on views of the (B, T, 3C) projection:
    the pick, `run_started` and the ladder described a call that never runs. The model's own calls
    (watched through SDPA, its real forward on CPU) against the timer's (measure, and kernel_name)."""
    import collections

    import torch.nn.functional as F

    from engine.train.model import GPT

    cfg = resolve("micro", None, {"speed.device": "cpu", "model.vocab_size": 64, **switches})
    calls: list[tuple] = []
    real = F.scaled_dot_product_attention

    def watched(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):  # type: ignore[no-untyped-def]
        calls.append((q.stride(), k.stride(), v.stride(), None if attn_mask is None else attn_mask.clone(), is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", watched)
    B, T = 2, cfg.seq_len
    GPT(cfg.model)(torch.randint(0, 64, (B, T)), torch.randint(0, 64, (B, T)))
    model_calls, calls[:] = list(calls), []
    strides = collections.Counter(c[:3] for c in model_calls).most_common(1)[0][0]  # most layers' layout
    shape = attention.shape_of(B, cfg.model.n_head, T, cfg.model.n_embd, torch.float32, torch.device("cpu"), cfg.model)
    assert attention.measure(shape, rounds=1)["flash"] is not None
    attention.kernel_name(shape)
    assert calls, "the timer made no call"
    for q, k, v, mask, causal in calls:
        assert (q, k, v) == strides, (switches, (q, k, v), strides)
        want = model_calls[0][3]
        assert (mask is None) == (want is None) and causal == model_calls[0][4]
        assert want is None or torch.equal(mask, want)
