"""The language-model loss, two ways: on full logits, and fused with the lm_head in chunks.

`cross_entropy` takes the (possibly vocab-padded) logits as they come out of the lm_head:
no slice back to the real vocab and no `.float()` of our own. Padded ids never occur as
targets, so the loss needs no slice; they do sit in the softmax normalizer (as in nanoGPT),
where training drives their logits down. Sampling still slices them off.

What the dtype does (measured on torch 2.13, CPU; the CUDA autocast lists say the same):
- fp32: F.cross_entropy reads the logits in place; log_softmax writes one B*T*V fp32 tensor.
- under autocast (bf16/fp16), cross_entropy is on autocast's fp32 list on CPU and CUDA, so
  autocast itself casts the low-precision logits to a B*T*V fp32 copy before log_softmax.
  An explicit `.float()` beforehand costs the same copy, no more; calling F.cross_entropy
  on bf16 logits outside autocast avoids it but stores the log-probabilities in bf16.
  The copy is what `chunked_linear_cross_entropy` removes.
- the old path, `logits[..., :V].reshape(-1, V).float()`: in fp32 the reshape stays a
  (strided) view, but log_softmax then reads strided rows and backward adds
  slice_backward's zero-filled B*T*Vp gradient; under autocast `.float()` is the copy
  autocast would make anyway. Both paths' backward allocates two B*T*V fp32 tensors
  (nll_loss_backward, _log_softmax_backward_data), plus a low-precision cast under autocast.

`chunked_linear_cross_entropy` computes lm_head + loss over row chunks and never holds the
N x V logits: per chunk it forms the logits, the loss and, right away, the gradients for
the hidden rows and the weight (the approach of Liger-Kernel's fused linear cross
entropy), so backward only scales them by grad_output / N. Peak extra memory: one chunk's
logits (a few copies of chunk_rows x V) + grad_hidden (N x C) + grad_weight (V x C, fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.train.memory import chunk_rows_for
from torch import Tensor



def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy straight on (B, T, Vp) logits, padded vocab included.

    `view` (not `reshape`) so a non-contiguous input fails loudly instead of being copied.
    """
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))




def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype autocast would give the lm_head matmul here: its dtype if on, else x's."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class _ChunkedLinearCE(torch.autograd.Function):
    """Forward computes loss and gradients chunk by chunk; backward scales them."""

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_rows: int, want_grad: bool,
        softcap: float | None = None,
    ) -> Tensor:
        N, C = hidden.shape
        V = weight.size(0)
        dtype = _compute_dtype(hidden)
        need_h = want_grad and ctx.needs_input_grad[0]
        need_w = want_grad and ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):  # explicit casts below
            h = hidden.to(dtype)  # (N, C)
            w = weight.to(dtype)  # (V, C), the one cast autocast's linear would make too
            targets = targets.long()
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_h = torch.empty_like(hidden) if need_h else None  # (N, C), hidden's dtype
            grad_w = torch.zeros(V, C, dtype=torch.float32, device=weight.device) if need_w else None
            for start in range(0, N, chunk_rows):
                h_c, t_c = h[start : start + chunk_rows], targets[start : start + chunk_rows]
                z = (h_c @ w.T).float()  # (n, V) logits; softmax math in fp32
                if softcap is not None:  # z = c * tanh(z / c); its derivative 1 - tanh^2 scales p below
                    cap = torch.tanh(z.div_(softcap))
                    z = cap * softcap
                lse = torch.logsumexp(z, dim=-1)  # (n,)
                loss += (lse - z.gather(1, t_c[:, None]).squeeze(1)).sum()
                if not (need_h or need_w):
                    continue
                # d(summed loss)/d(logits) = softmax - onehot, built in place on z. The 1/N
                # waits for backward: applied before the cast, fp16 would flush p/N to zero.
                p = z.sub_(lse[:, None]).exp_()  # (n, V)
                p[torch.arange(len(t_c), device=p.device), t_c] -= 1.0
                if softcap is not None:
                    p.mul_(cap.square_().neg_().add_(1.0))
                g = p.to(dtype)  # (n, V)
                if need_h:
                    grad_h[start : start + chunk_rows] = g @ w  # (n, C)
                if need_w:
                    if dtype == torch.float32:
                        grad_w.addmm_(g.T, h_c)  # (V, C), accumulated without a temporary
                    else:
                        grad_w += g.T @ h_c  # low-precision product, fp32 sum over chunks
            if need_w:
                grad_w = grad_w.to(weight.dtype)  # no-op for an fp32 parameter
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n_rows = N
        return loss / N

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        scale = grad_out / ctx.n_rows  # on the device: no host sync
        grad_h, grad_w = ctx.saved_tensors  # in place: a second backward (retain_graph) raises
        if grad_h is not None:
            grad_h = grad_h.mul_(scale.to(grad_h.dtype))
        if grad_w is not None:
            grad_w = grad_w.mul_(scale.to(grad_w.dtype))
        return grad_h, grad_w, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk_rows: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, never holding N x V logits.

    hidden (N, C), weight (V, C) (the tied wte works: autograd adds the embedding's grad),
    targets (N,) int; `softcap` c: the logits capped to c * tanh(z / c) (model.logit_softcap).
    Returns a scalar fp32 loss. Under autocast the matmuls run in the
    autocast dtype; gradients come back in the inputs' own dtypes.
    """
    assert hidden.dim() == 2 and weight.dim() == 2 and targets.shape == hidden.shape[:1]
    rows = chunk_rows or chunk_rows_for(hidden.size(0), weight.size(0))
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ChunkedLinearCE.apply(hidden, weight, targets, rows, want_grad, softcap)
