"""Under torchrun a step makes no host sync either (issue 37): 2 CPU processes over gloo, the
micro preset, AdamW and Muon. The device is drained only at the last step; a logged step's
numbers (the guard's counters, the loss averaged over the ranks) are read a step later, by
every rank at the same step, and its step times gathered over the ranks then; the ranks
agree on requests at rank 0's cadence, not every step. Run as a script under torchrun
(`python -m torch.distributed.run ... this_file.py worker OUT DATA`) it is the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a torchrun launch: not in the fast inner loop

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=0"]
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy")  # a tensor's value reaching the host
STEPS, EVERY = 12, 4


def test_two_ranks_sync_only_at_the_last_step_with_adamw_and_muon(tmp_path, tiny_dataset):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([*TORCHRUN, __file__, "worker", str(tmp_path), str(tiny_dataset)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for optimizer in ("adamw", "muon"):
        for rank in (0, 1):
            seen = json.loads((tmp_path / f"{optimizer}-{rank}.json").read_text())
            assert seen["syncs"] == [STEPS], seen  # the last step's only (the old loop drained every step)
            # a host read only where a logged step's numbers are read (the step after it, on every
            # rank alike) and at the last step; the process's first boundary agrees on requests,
            # then none for far longer than these runs (AGREE_EVERY_S set high: every step before)
            reading = {s for s, n in seen["reads"].items() if n and int(s) > 0}
            assert reading == {str(EVERY + 1), str(2 * EVERY + 1), str(STEPS)}, seen
            assert seen["agrees"] in ([0], []), seen
        events = [json.loads(line) for line in (tmp_path / optimizer / "events.jsonl").read_text().splitlines()]
        steps = [e for e in events if e["event"] == "step"]
        assert [e["step"] for e in steps] == [EVERY, 2 * EVERY, STEPS]
        assert all(len(e["rank_step_times"]) == 2 and min(e["rank_step_times"]) > 0 for e in steps)
        assert events[-1]["event"] == "run_finished" and events[-1]["reason"] == "completed"


def _worker(out: Path, data: Path) -> None:
    """Each rank counts, per step (a step runs from its train_step to the next one's), its
    device drains, host reads of tensor values and agreements on requests."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch

    from engine.run.owner import start
    from engine.train import distributed, trainer
    from harness import QUIET, micro_config

    distributed.AGREE_EVERY_S = 3600.0  # the cadence rank 0 picks: at its cap after the first agreement
    at = [0]
    seen: dict = {}

    def counting(name, original):
        def counted(self, *a, **kw):
            seen[name][at[0]] += 1
            return original(self, *a, **kw)

        return counted

    for name in READS:
        setattr(torch.Tensor, name, counting("reads", getattr(torch.Tensor, name)))
    trainer.Trainer._sync = counting("syncs", trainer.Trainer._sync)
    train_step, agree = trainer.Trainer.train_step, distributed.agree

    def step(self, lr):
        at[0] = self.step + 1
        return train_step(self, lr)

    def agreeing(*a, **kw):
        seen["agrees"][at[0]] += 1
        return agree(*a, **kw)

    trainer.Trainer.train_step, distributed.agree = step, agreeing
    ctx = distributed.init("cpu")
    for optimizer in ("adamw", "muon"):
        seen.update(reads=Counter(), syncs=Counter(), agrees=Counter())
        at[0] = 0
        config = micro_config(data, **QUIET, **{"train.max_steps": STEPS, "train.log_interval": EVERY,
                                                "optim.optimizer": optimizer})  # fmt: skip
        assert start(config, out / optimizer).run() == "completed"
        counts = {"reads": dict(seen["reads"]), "syncs": sorted(seen["syncs"]), "agrees": sorted(seen["agrees"])}
        (out / f"{optimizer}-{ctx.rank}.json").write_text(json.dumps(counts))
    distributed.shutdown()
    distributed.leave(0)  # as the CLI's workers leave: before the interpreter's teardown


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(Path(sys.argv[2]), Path(sys.argv[3]))
