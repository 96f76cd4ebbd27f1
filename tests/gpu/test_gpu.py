"""CUDA paths: bf16/fp16, compile, flash, fused AdamW, pinned memory, peak memory.

Skipped without a CUDA GPU (our CI has none); run on a GPU box with `pytest tests/gpu/test_gpu.py`.
"""

import pytest
import torch

from harness import open_run, run_events

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(tmp_path, data, **flags):
    run = open_run(tmp_path / "run", data, **({"speed.device": "cuda", "train.max_steps": 20} | flags))
    run.run()
    return run.segment, [e for e in run_events(tmp_path / "run") if e.event == "step"]


def test_bf16_compile_flash_fused(tmp_path, structured_dataset):
    trainer, steps = _run(tmp_path, structured_dataset, **{"speed.precision": "bf16", "speed.compile": True,
                                                     "model.attention": "flash"})
    assert trainer.parts.optimizer.defaults["fused"] is True  # auto-on for CUDA
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in steps)
    assert steps[-1].loss < steps[0].loss
    assert steps[-1].mem_bytes and steps[-1].mem_bytes > 0
    assert next(trainer.parts.model.parameters()).dtype == torch.float32  # fp32 master weights


def test_fp16_uses_a_grad_scaler_that_is_checkpointed(tmp_path, structured_dataset):
    trainer, steps = _run(tmp_path, structured_dataset, **{"speed.precision": "fp16"})
    assert trainer.parts.scaler is not None
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_000020.pt", weights_only=True)
    assert state["scaler"] and state["scaler"]["scale"] > 0


def test_pinned_prefetching_loader_feeds_the_gpu(tmp_path, tiny_dataset):
    from engine.dataset import open_dataset
    from engine.train.batches import BatchLoader, BatchSampler

    ds = open_dataset(tiny_dataset)
    loader = BatchLoader(BatchSampler(ds.train, 4, 16, seed=0), torch.device("cuda"), pin_memory=True, prefetch=True)
    x, y = loader.next()
    loader.close()
    assert x.is_cuda and y.is_cuda and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
