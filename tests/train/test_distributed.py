"""Distributed pieces that need no second process: the data split and the launcher's checks.

The runs under real torchrun (gloo, 2 processes) are in test_distributed_torchrun.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import cli
from engine.train import distributed
from engine.run import torchrun
from engine.dataset import open_dataset
from engine.train.batches import BatchSampler


def _split(path, T=16):
    return open_dataset(path).train, T


def test_ranks_split_one_stream_without_overlap(tiny_dataset):
    """Rank r of W trains on batches r, r+W, ... of the lone stream: together exactly the
    batches a 1-process run with W x grad_accum draws, no batch on two ranks."""
    split, T = _split(tiny_dataset)
    W, steps = 3, 4
    lone = BatchSampler(split, 4, T, seed=7)
    expected = [lone.next() for _ in range(W * steps)]
    ranks = [distributed.StridedSampler(split, 4, T, 7, True, r, W) for r in range(W)]
    for j in range(steps):
        for r, s in enumerate(ranks):
            x, y = s.next()
            np.testing.assert_array_equal(x, expected[j * W + r][0])
            np.testing.assert_array_equal(y, expected[j * W + r][1])
    # the stream position is the same on every rank and equal to the lone sampler's
    assert all(s.state() == lone.state() for s in ranks)
    seen = {r: {tuple(s.next()[0][0]) for _ in range(5)} for r, s in enumerate(ranks)}
    assert not seen[0] & seen[1] and not seen[1] & seen[2]


def test_resumed_stream_continues_under_another_world_size(tiny_dataset):
    """A state saved by 2 ranks, loaded by 1 rank: the lone sampler continues the same stream."""
    split, T = _split(tiny_dataset)
    two = distributed.StridedSampler(split, 4, T, 7, True, 0, 2)
    for _ in range(3):
        two.next()
    lone = BatchSampler(split, 4, T, seed=7)
    lone.set_state(two.state())
    reference = BatchSampler(split, 4, T, seed=7)
    for _ in range(6):
        reference.next()
    np.testing.assert_array_equal(lone.next()[0], reference.next()[0])


def test_val_set_is_the_same_for_any_world_size(tiny_dataset):
    split, T = _split(tiny_dataset)
    alone = distributed.val_share(BatchSampler(split, 2, T, seed=3), 4, distributed.Context())
    shares = [
        distributed.val_share(BatchSampler(split, 2, T, seed=3), 4, distributed.Context(rank=r, world_size=2))
        for r in range(2)
    ]
    assert len(shares[0]) == len(shares[1]) == 2
    together = [shares[j % 2][j // 2] for j in range(4)]
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a[0], b[0])
    # an uneven count is rounded up, so every rank (FSDP2: all in lockstep) runs as many batches
    odd = [distributed.val_share(BatchSampler(split, 2, T, seed=3), 3, distributed.Context(rank=r, world_size=2)) for r in range(2)]
    assert len(odd[0]) == len(odd[1]) == 2


def test_worker_command_drops_nproc_and_pins_the_run_dir(tmp_path):
    cmd = torchrun.command(["train", "--nproc", "2", "--preset", "micro", "--lr", "1e-3"], tmp_path / "r", name_dir=True)
    assert cmd == ["-m", "engine.cli", "train", "--preset", "micro", "--lr", "1e-3", "--out", str(tmp_path / "r")]
    assert torchrun.command(["train", "--nproc=4", "--out", "x"], tmp_path, name_dir=False) == [
        "-m", "engine.cli", "train", "--out", "x"]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--nproc", "0"], "--nproc: 0 is out of range"),
        (["--nproc", "2", "--device", "mps"], "no MPS"),
        (["--nproc", "2", "--parallel", "zero3"], "invalid choice"),
        (["--nproc", "2", "--lr", "0"], "optim.lr"),
    ],
)
def test_bad_launch_is_one_line_exit_2_nothing_written(tmp_path, tiny_dataset, capsys, file_tree, flags, expected):
    before = file_tree(tmp_path)
    out = tmp_path / "run"
    try:
        code = cli.main(["train", "--preset", "micro", "--data", str(tiny_dataset), "--out", str(out), *flags])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert file_tree(tmp_path) == before and not out.exists()

