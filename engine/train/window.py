"""The sliding window through FlexAttention: where it runs, and its block mask.

The sliding window (model.attn_window) is a band mask. SDPA computes the whole T x T for it (a
dense masked kernel: the window saves nothing, and flash cannot run it), while FlexAttention with
a block mask skips the blocks wholly outside the band. Flex runs where it is the faster and can
train (`flex_reason`): on CUDA, in compiled code (uncompiled, flex is an unfused fallback slower
than SDPA), without dropout (flex has none), at whole 128-token blocks; its block mask is built
once per (T, window) here (`block_mask`). Elsewhere, and in every eager call of the same model
(samples), the band runs through SDPA (engine/train/attention.py), so both give the same
attention (tests/train/test_flex_window.py). The training build (engine/train/build.py), the
memory estimate and preflight's warning all ask `flex_reason` (`runs_flex`: a run's answer), and
whether a window bands at all is `banded`: each rule lives here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

if TYPE_CHECKING:
    from engine.config import RunConfig

FLEX = "flex"  # the window's kernel where FlexAttention runs it, as run_started names it
FLEX_BLOCK = 128  # create_block_mask's block: the sequence lengths flex is given are its multiples


def banded(window: int | None, seq: int) -> bool:
    """Whether `window` masks anything at `seq` tokens: a query sees at most seq - 1 keys back, so
    a window that long or longer is plain causal. SDPA's band (engine.train.attention.band), flex
    and the memory estimate all follow this one rule."""
    return window is not None and window < seq - 1


def runs_flex(config: RunConfig, device_type: str) -> bool:
    """Whether this run's window goes through FlexAttention on `device_type` (the flash path's):
    what build.finish sets up and the memory estimate counts."""
    m = config.model
    return m.attention == "flash" and flex_reason(device_type, config.speed.compile, m.attn_window, config.seq_len,
                                                  m.dropout) is None  # fmt: skip


def flex_reason(device_type: str, compiled: bool, window: int | None, seq: int, dropout: float) -> str | None:
    """Why the window's band does not run through FlexAttention (None: it does). Flex trains
    only on CUDA (torch has no flex backward on CPU), is fast only compiled (eager flex is an
    unfused fallback that writes the T x T scores), and has no dropout. Sequences off its
    128-token block are left to SDPA: flex's partial last block has had wrong answers and NaN
    gradients (pytorch#159247, #153799), and no GPU here has checked the torch it runs on."""
    if not banded(window, seq):
        return "no window shorter than the sequence"
    if device_type != "cuda":
        return "FlexAttention trains on CUDA only"
    if not compiled:
        return "FlexAttention is fast only compiled"
    if dropout > 0:
        return "FlexAttention has no dropout"
    if seq % FLEX_BLOCK:
        return f"FlexAttention is used for sequences of a multiple of {FLEX_BLOCK} tokens"
    return None


_block_masks: dict[tuple[int, int, str], BlockMask] = {}


def block_mask(seq: int, window: int, device: torch.device) -> BlockMask:
    """The window's band as FlexAttention's block mask (causal, at most `window` back:
    engine.train.attention.band's rule), built once per sequence length, window and device
    in a process."""
    key = (seq, window, str(device))
    if key not in _block_masks:
        def within(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return (q >= k) & (q - k <= window)

        _block_masks[key] = create_block_mask(within, None, None, seq, seq, device=device)
    return _block_masks[key]
