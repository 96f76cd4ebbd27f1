"""An opened dataset (engine.dataset) -> random (x, y) training batches on a device.

`BatchSampler` draws window starts with ONE numpy RNG call per batch, so the vectorized
gather and the naive per-row loop (kept as the slow rung of the speed ladder) produce
identical batches from the same seed, and its state round-trips through JSON for exact
resumption. With data.align_docs the starts are drawn from `document_starts` (each row
begins after an end-of-text token), still one RNG call a batch. `BatchLoader` moves batches
to the device, optionally building the next one on a background thread while the model computes.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any

import numpy as np
import torch

from engine.dataset import Dataset, DatasetInfo, TokenSplit
from engine.errors import UserError
from engine.text import program


# --------------------------------------------------------------------------- sampling


class BatchSampler:
    """Random windows of block_size + 1 tokens from one split, as (x, y) int64 arrays.

    Each batch costs exactly one RNG call, ``rng.integers(0, usable, B)``, over the
    concatenated window starts of all shards (each shard weighted by its usable length);
    the vectorized and the loop paths then only differ in how they copy the tokens out.
    """

    def __init__(
        self, split: TokenSplit, batch_size: int, block_size: int, seed: int, vectorized: bool = True
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch size {batch_size} is not positive", {"train.batch_size": "1 or more"})
        split.check_block(block_size)
        self.split = split
        self.batch_size = batch_size
        self.block_size = block_size
        self.seed = seed
        self.vectorized = vectorized
        self.batches = 0
        self._rng = np.random.default_rng(seed)
        usable = np.array([s.count - block_size for s in split.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(usable)[:-1]])
        self._usable_total = int(usable.sum())
        self._aligned: np.ndarray | None = None  # align(): the only window starts drawn

    def align(self, starts: np.ndarray) -> None:
        """Draw rows only from these window starts (`document_starts`): each batch is still one
        RNG call, now over their indices, so a restored state resumes the same batches."""
        self._aligned = starts

    def _draw(self) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, offset in shard) per row, from one RNG call."""
        if self._aligned is None:
            g = self._rng.integers(0, self._usable_total, size=self.batch_size, dtype=np.int64)
        else:
            g = self._aligned[self._rng.integers(0, len(self._aligned), size=self.batch_size, dtype=np.int64)]
        if len(self._starts) == 1:  # the common case, without the search (~15 us a batch)
            return np.zeros(self.batch_size, dtype=np.int64), g
        shard = np.searchsorted(self._starts, g, side="right") - 1
        return shard, g - self._starts[shard]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        shard_ids, offsets = self._draw()
        self.batches += 1
        if self.vectorized:
            return self._gather(shard_ids, offsets)
        return self._loop(shard_ids, offsets)

    def _gather(self, shard_ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One gather per shard, then one cast per output: no Python work per row.

        From RAM the gather indexes rows of a sliding-window view of the tokens, the same
        result as ``tokens[offsets[:, None] + np.arange(T + 1)]`` without building the
        (B, T+1) index array: each window is one contiguous copy, ~3.5x faster at B=64,
        T=512 (see bench_data).
        """
        width = self.block_size + 1
        shards = self.split.shards
        if len(shards) == 1:
            windows = shards[0].windows(offsets, width)
        else:
            windows = np.empty((self.batch_size, width), dtype=shards[0].dtype)
            for i in np.unique(shard_ids).tolist():
                rows = np.flatnonzero(shard_ids == i)
                windows[rows] = shards[i].windows(offsets[rows], width)
        x = windows[:, :-1].astype(np.int64, order="C")
        y = windows[:, 1:].astype(np.int64, order="C")
        return x, y

    def _loop(self, shard_ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The naive way (slice, cast and stack row by row); kept as the benchmark baseline."""
        T = self.block_size
        xs, ys = [], []
        for i, off in zip(shard_ids.tolist(), offsets.tolist()):
            window = self.split.shards[i].read(off, T + 1)
            xs.append(window[:-1].astype(np.int64))
            ys.append(window[1:].astype(np.int64))
        return np.stack(xs), np.stack(ys)

    def state(self) -> dict[str, Any]:
        """JSON-safe: the 128-bit PCG64 words are stored as decimal strings."""
        bg = self._rng.bit_generator.state
        return {
            "seed": self.seed,
            "batches": self.batches,
            "bit_generator": bg["bit_generator"],
            "state": str(bg["state"]["state"]),
            "inc": str(bg["state"]["inc"]),
            "has_uint32": int(bg["has_uint32"]),
            "uinteger": str(bg["uinteger"]),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            if state["bit_generator"] != "PCG64":
                raise ValueError(f"bit generator {state['bit_generator']}")
            bg = {
                "bit_generator": "PCG64",
                "state": {"state": int(state["state"]), "inc": int(state["inc"])},
                "has_uint32": int(state["has_uint32"]),
                "uinteger": int(state["uinteger"]),
            }
            rng = np.random.default_rng()
            rng.bit_generator.state = bg
            batches = int(state["batches"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(
                f"the saved data sampler state is invalid ({exc!r}); resume from another "
                f"checkpoint or start a new run"
            ) from exc
        self._rng = rng
        self.batches = batches
        self.seed = state.get("seed", self.seed)


# --------------------------------------------------------------------------- document starts


_SCAN = 1 << 24  # tokens per chunk when scanning a split for end-of-text tokens
_found: weakref.WeakKeyDictionary[TokenSplit, dict[tuple[int, int], np.ndarray]] = weakref.WeakKeyDictionary()


def document_starts(split: TokenSplit, eot_id: int, block_size: int) -> np.ndarray:
    """Every window start that begins a document (the token after an end-of-text token, or a
    shard's first token unless it is one) and holds block_size + 1 tokens, in the sampler's
    coordinates (shards' usable starts laid end to end). One int64 per document, scanned in
    chunks (a split on disk is never read whole), once per split: preflight's count is build's."""
    cached = _found.setdefault(split, {})
    if (eot_id, block_size) in cached:
        return cached[eot_id, block_size]
    parts, base = [], 0
    for shard in split.shards:
        usable = shard.count - block_size
        found = [] if usable < 1 or int(shard.read(0, 1)[0]) == eot_id else [np.zeros(1, np.int64)]
        for at in range(0, max(usable - 1, 0), _SCAN):  # an EOT at p starts a document at p + 1 < usable
            chunk = shard.read(at, min(_SCAN, usable - 1 - at))
            found.append(np.flatnonzero(chunk == eot_id).astype(np.int64) + (at + 1))
        parts.extend(f + base for f in found)
        base += max(usable, 0)
    starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    cached[eot_id, block_size] = starts
    return starts


def check_eot(info: DatasetInfo) -> int:
    """The dataset's end-of-text id, or one line refusing data.align_docs on data that records none."""
    if info.eot_id is None:
        raise UserError(f"data.align_docs needs documents, but this {info.format} dataset records no end-of-text "
                        "id", {"data.align_docs": False},
                        also=f"tokenize the text with `{program()} prepare`, which marks each one")  # fmt: skip
    return info.eot_id


def documents(dataset: Dataset, block_size: int, batch_size: int) -> np.ndarray:
    """data.align_docs' train-row starts, or one line refusing a dataset with no end-of-text id
    or fewer documents than a batch has rows (the val set is never aligned: every recipe is
    judged on the same one)."""
    starts = document_starts(dataset.train, check_eot(dataset.info), block_size)
    if len(starts) < max(2, batch_size):
        raise UserError(f"data.align_docs needs documents, but the train split has {len(starts)} that start a "
                        f"block of {block_size} tokens (a batch has {batch_size} rows)", {"data.align_docs": False},
                        also="use a dataset of more documents")  # fmt: skip
    return starts


def reach(starts: np.ndarray, split: TokenSplit, block_size: int) -> float:
    """The share of the split's tokens that rows from these starts can hold: a document longer
    than a block is trained on its first block only (the rest is never seen)."""
    ends = np.append(starts[1:], split.num_tokens - block_size)  # shards laid end to end: near enough
    return float(np.minimum(ends - starts, block_size + 1).sum()) / max(1, split.num_tokens)


# --------------------------------------------------------------------------- device loading


_Item = tuple[torch.Tensor, torch.Tensor, dict] | BaseException


class BatchLoader:
    """Batches from a sampler as int64 tensors on a device.

    With pin_memory the host tensors are pinned and copied with non_blocking=True, so the copy
    overlaps the previous step's compute; with prefetch, a daemon thread builds the next batch
    while the caller trains on this one. Both do as asked: which pay on which device is the
    caller's decision (the trainer asks engine.device.idle_data_switches).
    """

    def __init__(
        self,
        sampler: BatchSampler,
        device: torch.device | str,
        pin_memory: bool = False,
        prefetch: bool = True,
    ) -> None:
        self.sampler = sampler
        self.device = torch.device(device)
        self.pin = pin_memory
        self.prefetch = prefetch
        self._next_state = sampler.state()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=1)
        self._closed = False
        if prefetch:
            self._start()

    def _host_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        x, y = self.sampler.next()
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if self.pin:
            xt, yt = xt.pin_memory(), yt.pin_memory()
        return xt, yt, self.sampler.state()

    def _start(self) -> None:
        # Each thread gets its own stop event and queue, so a stopped thread can never
        # hand a stale batch to its successor.
        self._stop = stop = threading.Event()
        self._queue = q = queue.Queue(maxsize=1)
        self._thread = threading.Thread(
            target=self._produce, args=(stop, q), name="batch-prefetch", daemon=True
        )
        self._thread.start()

    def _produce(self, stop: threading.Event, q: queue.Queue[_Item]) -> None:
        while not stop.is_set():
            try:
                item: _Item = self._host_batch()
            except BaseException as exc:  # handed to the consumer, raised there
                item = exc
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def _halt(self, timeout: float | None) -> None:
        """Stop the prefetch thread and drop any batch it built."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._closed:
            raise RuntimeError("BatchLoader.next() called after close()")
        if not self.prefetch:
            x, y, after = self._host_batch()
        else:
            while True:
                try:
                    item = self._queue.get(timeout=1.0)
                    break
                except queue.Empty:
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the batch prefetch thread stopped unexpectedly") from None
            if isinstance(item, BaseException):
                self._thread = None
                raise item
            x, y, after = item
        self._next_state = after
        return (
            x.to(self.device, non_blocking=self.pin),
            y.to(self.device, non_blocking=self.pin),
        )

    def state(self) -> dict[str, Any]:
        """The sampler state before the batch the next next() call returns (prefetched or not)."""
        return dict(self._next_state)

    def set_state(self, state: dict[str, Any]) -> None:
        """Rewind/fast-forward the sampler; a prefetched batch is discarded and rebuilt."""
        if self.prefetch and not self._closed:
            self._halt(timeout=None)  # the sampler must be idle before it is touched
        self.sampler.set_state(state)
        self._next_state = self.sampler.state()
        if self.prefetch and not self._closed:
            self._start()

    def close(self) -> None:
        """Stop the prefetch thread. Returns within about a batch's build time; the thread
        is a daemon, so even a stuck read cannot keep the process alive."""
        if self._closed:
            return
        self._closed = True
        if self.prefetch:
            self._halt(timeout=5.0)

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
