"""A segment's evaluation: the val loss on the same pinned batches every time, due every
`eval_interval` steps and at the last, with a short sample for the dashboard after it.

A component of the segment (engine/train/trainer.py): it says when it is due and runs on the
segment's built parts; the measuring tools pass `Evaluation(every=None)`, never due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine import events as ev
from engine.train import distributed
from engine.train.build import Parts
from engine.train.generate import generate_text
from engine.train.state import Progress


class Evaluation:
    """`every`: the interval in steps (None: never due on its own; a save still asks for one);
    `sample_tokens` and `tokenizer` (a loader, called once when a sample is first due): the
    sample after each eval."""

    def __init__(self, emit: Callable[[Any], None], every: int | None, sample_tokens: int = 0,
                 tokenizer: Callable[[], Any] | None = None) -> None:  # fmt: skip
        self.emit, self.every = emit, every
        self.sample_tokens, self._load_tokenizer, self._tokenizer = sample_tokens, tokenizer, None

    def due(self, step: int, last: bool) -> bool:
        return self.every is not None and (step % self.every == 0 or last)

    @torch.no_grad()
    def run(self, p: Parts, at: Progress) -> float:
        """The mean val loss over every rank's share; recorded in `at` and said in an event."""
        p.model.eval()
        total = torch.zeros((), device=p.device)
        for x, y in p.val_batches:  # arrays, or tensors pinned once where the loader pins (build.loaders)
            x, y = _on(p.device, x), _on(p.device, y)
            with p.autocast():
                _, loss = p.forward(x, y, return_logits=False)  # only the loss: no (B, T, V) logits kept
            total += loss.float()
        p.model.train()
        val_loss = distributed.global_mean(total, len(p.val_batches), distributed.current())
        at.last_eval = (at.step, val_loss)
        self.emit(ev.Eval(step=at.step, val_loss=val_loss, tokens=at.tokens, train_time_s=at.train_time_s))
        self._sample(p, at.step)
        return val_loss

    def _sample(self, p: Parts, step: int) -> None:
        """A short generation, seeded by the step so global RNG (and a bit-exact resume) is
        untouched; only when the dataset carries a tokenizer."""
        if not self.sample_tokens or self._load_tokenizer is None:
            return
        try:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            p.model.eval()
            # eager: a compiled block would compile again for each new sequence length
            with p.autocast(), torch.compiler.set_stance("force_eager"):
                text = generate_text(p.model, self._tokenizer, "", self.sample_tokens, 0.8, 50, seed=step)
            self.emit(ev.Sample(step=step, text=text))
        except Exception as err:  # a sample is a nicety: never let it end the run
            self.emit(ev.Warning_(message=f"sample at step {step} failed: {err}"))
        finally:
            p.model.train()


def _on(device: torch.device, batch: Any) -> torch.Tensor:
    """A val batch on the device: an array copied, or a pinned tensor copied without blocking."""
    t = torch.as_tensor(batch)
    return t.to(device, non_blocking=t.is_pinned())
