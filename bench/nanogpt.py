"""nanoGPT's own `train.py`, run as it ships, timed beside our Trainer (`bench --plain --nanogpt DIR`).

The in-house reference loop (bench/reference.py) is written by us, so a habit we share with it
cannot show. nanoGPT is the loop users compare us with: given a checkout of it (its `train.py`,
`model.py` and `configurator.py`), this copies those three files into a scratch directory, writes
our train tokens there as its `data/<name>/train.bin` and `val.bin` (uint16, as its prepare
scripts do), and runs its script at our shape: layers, heads, width, sequence, micro-batch,
bias, our lm_head's vocab (padded when we pad: written as its `meta.pkl`), fp32, eager,
no accumulation, no checkpoints, one eval batch at step 0 (inside the warm-up). Its step times
are the ones it prints itself (`iter N: loss L, time T ms`: the wall time between two steps,
the next batch's read included, as our step times are).
"""

from __future__ import annotations

import pickle
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.reference import ReferenceShape
from engine import child
from engine.errors import UserError

FILES = ("train.py", "model.py", "configurator.py")
LINE = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms")
MAX_LINES = 100_000  # nanoGPT prints one line a step: a bound on what is read back


def check_checkout(path: Path) -> Path:
    """The checkout's directory, refused in one line unless it holds nanoGPT's three files."""
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise UserError(f"--nanogpt {path}: no {', '.join(missing)} there: give a checkout of "
                        "github.com/karpathy/nanoGPT (its train.py, model.py and configurator.py)")  # fmt: skip
    return path


def step_times(checkout: Path, train: np.ndarray, val: np.ndarray, shape: ReferenceShape, steps: int,
               lr: float, seconds: float = 3600.0) -> list[float]:  # fmt: skip
    """Seconds per step of nanoGPT's train.py, `steps` steps at `shape` (fp32, eager, CPU/GPU
    as torch finds), from the times it prints."""
    if shape.vocab_size > 65536:
        raise UserError(f"nanoGPT reads uint16 tokens: vocab {shape.vocab_size} does not fit")
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-nanogpt-") as tmp:
        work = Path(tmp)
        for name in FILES:
            shutil.copyfile(checkout / name, work / name)
        data = work / "data" / "gpt2tui"
        data.mkdir(parents=True)
        np.asarray(train, dtype=np.uint16).tofile(data / "train.bin")
        np.asarray(val, dtype=np.uint16).tofile(data / "val.bin")
        (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": shape.vocab_size}))  # what it reads the vocab from
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        flags = dict(dataset="gpt2tui", device=device, compile=False, dtype="float32", n_layer=shape.n_layer,
                     n_head=shape.n_head, n_embd=shape.n_embd, block_size=shape.block_size,
                     batch_size=shape.batch_size, gradient_accumulation_steps=shape.grad_accum, bias=shape.bias,
                     max_iters=steps - 1, eval_interval=10**9, eval_iters=1, log_interval=1, out_dir=str(work / "out"),
                     always_save_checkpoint=False, warmup_iters=0, learning_rate=lr, lr_decay_iters=max(1, steps),
                     min_lr=lr / 10)  # fmt: skip
        argv = [sys.executable, "train.py", *(f"--{k}={v}" for k, v in flags.items())]
        # its own group, killed with us or at `seconds`; its output read bounded (engine.child)
        done = child.run(argv, cwd=work, timeout=seconds)
    times = [float(m.group(2)) / 1000 for line in done.output.splitlines()[:MAX_LINES] if (m := LINE.match(line))]
    if done.returncode != 0 or len(times) != steps:
        status = f"exited {done.returncode}" if done.returncode is not None else f"ran past {seconds:g} s"
        tail = done.output.strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"nanoGPT's train.py {status} after {len(times)} of {steps} steps: {tail[0][:300]}")
    return times
