"""The eval asks the model for its loss alone (issue 37): in eval mode the model hands back its
(B, T, V) logits unless told not to, so each val batch kept a B*T*V tensor alive (in fp32:
B*T*V*4 bytes, the largest activation of GPT-2) that nothing reads. Both losses are checked
on a real segment's parts; the val batches keep their place (pinned on CUDA: needs a GPU, see
tests/gpu/test_gpu_eval.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.train.evaluation import Evaluation
from engine.train.losses import cross_entropy
from engine.train.state import Progress
from harness import built_parts


@pytest.mark.parametrize("loss", ["plain", "chunked"])
def test_the_eval_gets_no_logits_and_the_same_loss(loss: str, tiny_dataset: Path, tmp_path: Path) -> None:
    p = built_parts(tiny_dataset, tmp_path, {"speed.device": "cpu", "speed.precision": "fp32", "model.loss": loss,
                                              "train.eval_batches": 3})  # fmt: skip
    outputs: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    p.model.register_forward_hook(lambda module, args, out: outputs.append(out))
    events: list[object] = []
    got = Evaluation(events.append, every=None).run(p, Progress(step=1))
    assert len(outputs) == 3 and all(logits is None for logits, _ in outputs)  # before: (B, T, V) in plain
    assert p.model.training  # handed back in training mode
    p.model.eval()
    with torch.no_grad():  # the same batches through the full logits, by hand
        want = sum(cross_entropy(p.model.lm_head(_last_hidden(p.model, torch.as_tensor(x))), torch.as_tensor(y)).item()
                   for x, y in p.val_batches) / 3  # fmt: skip
    assert math.isclose(got, want, rel_tol=1e-5)


def _last_hidden(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    t = model.transformer
    x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.size(1))))
    for block in t.h:
        x, _ = block(x)  # (output, its v: the value residual's)
    return t.ln_f(x)
