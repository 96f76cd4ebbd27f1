"""The eval on CUDA: its val batches pinned once where the training batches are, copied without
blocking the host, and the loss alone asked of the model (issue 37). CPU torch cannot pin:
skipped without a CUDA GPU; tests/train/test_eval_loss_only.py covers the loss on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.train.evaluation import Evaluation
from engine.train.state import Progress
from harness import built_parts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("pin", [True, False])
def test_val_batches_are_pinned_where_the_training_batches_are(pin: bool, tiny_dataset: Path, tmp_path: Path) -> None:
    p = built_parts(tiny_dataset, tmp_path, {"speed.device": "cuda", "speed.precision": "bf16",
                                              "data.pin_memory": pin, "train.eval_batches": 2})  # fmt: skip
    pinned = [torch.as_tensor(t).is_pinned() for batch in p.val_batches for t in batch]
    assert pinned == [pin] * 4
    loss = Evaluation(lambda e: None, every=None).run(p, Progress(step=1))
    assert loss == loss and loss > 0
