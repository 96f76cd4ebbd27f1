"""Issue 20, finding 8: the guard's verdict is one verdict across ranks.

Two CPU processes under torchrun (gloo). Rank 1 alone sees a finite loss spike at step 3
(+100 on its loss, gradients untouched); with --max-bad-steps 1 that is a divergence stop.
Both ranks must agree that step 3 was bad and stop together (save, eval and their
collectives on both), instead of rank 1 entering the stop alone while rank 0 trains on
and the two hang in mismatched collectives. Run as a script under torchrun, this file is
the worker: it wraps the model's forward on rank 1, then runs the real CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=0"]
SPIKE_STEP = 3


def _worker(argv: list[str]) -> int:
    import torch

    from engine.cli import main
    from engine.train.model import GPT

    if os.environ.get("RANK") == "1":
        real, calls = GPT.forward, {"n": 0}

        def forward(self, idx, targets=None):
            logits, loss = real(self, idx, targets)
            if torch.is_grad_enabled() and loss is not None:
                calls["n"] += 1
                if calls["n"] == SPIKE_STEP:
                    loss = loss + 100.0
            return logits, loss

        GPT.forward = forward
    return main(argv)


@pytest.mark.slow
def test_a_spike_on_one_rank_stops_every_rank_together(tmp_path, tiny_dataset):
    from engine import rundir
    from engine.events import read_events

    out = tmp_path / "run"
    args = ["train", "--preset", "micro", "--device", "cpu", "--data", str(tiny_dataset), "--max-steps", "8",
            "--log-interval", "1", "--eval-interval", "100", "--ckpt-interval", "100", "--max-bad-steps", "1",
            "--out", str(out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([*TORCHRUN, __file__, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=150)  # fmt: skip
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the ranks hung (mismatched collectives after a one-rank stop): {str(err.stderr)[-2000:]}")
    events, _ = read_events(out / rundir.EVENTS)
    steps = [e.step for e in events if e.event == "step"]
    warnings = [e.message for e in events if e.event == "warning"]
    tail = proc.stderr[-3000:]
    # rank 0 stopped at the spike too: at the step after it, where every rank reads its numbers
    # (one step late, as a GPU does: engine/train/readings.py), the spike's step named in the warning
    assert steps and max(steps) == SPIKE_STEP + 1, (steps, tail)
    assert any(f"step {SPIKE_STEP}" in w and "skipped" in w for w in warnings), (warnings, tail)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout, tail


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(_worker(sys.argv[1:]))
