"""engine.dataset (format detection, validation) and engine.train.batches (samplers, the prefetching loader)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.dataset import Dataset, DatasetInfo, Shard, open_dataset
from engine.train.batches import BatchLoader, BatchSampler
from engine.errors import UserError


def all_tokens(shard: Shard) -> np.ndarray:
    return shard.read(0, shard.count)


def batches(sampler: BatchSampler, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [sampler.next() for _ in range(n)]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert np.array_equal(np.asarray(xa), np.asarray(xb))
        assert np.array_equal(np.asarray(ya), np.asarray(yb))


# --------------------------------------------------------------------------- formats


def test_open_ours(tiny_dataset: Path) -> None:
    ds = open_dataset(tiny_dataset)
    assert isinstance(ds, Dataset)
    assert ds.info == DatasetInfo(
        format="gpt2-tui", path=str(tiny_dataset.resolve()), dtype="uint16", vocab_size=64,
        train_tokens=20_000, val_tokens=4_000, tokenizer=None, eot_id=None,
    )  # fmt: skip
    assert ds.train.num_tokens == 20_000 and len(ds.val) == 4_000
    on_disk = np.fromfile(tiny_dataset / "train.bin", dtype="<u2")
    assert np.array_equal(all_tokens(ds.train.shards[0]), on_disk)


def test_open_ours_uint32_and_tokenizer(make_dataset) -> None:
    vocab = 70_000
    train = np.arange(30_000) + 40_000
    root = make_dataset("gpt2-tui", train=train, val=train[:500], vocab_size=vocab, eot_id=69_999)
    (root / "tok.json").write_text("{}")
    car = json.loads((root / "dataset.json").read_text())
    car["tokenizer"] = "tok.json"
    (root / "dataset.json").write_text(json.dumps(car))
    ds = open_dataset(root)
    assert ds.info.dtype == "uint32" and ds.info.eot_id == 69_999
    assert ds.info.tokenizer == str((root / "tok.json").resolve())
    assert (root / "train.bin").stat().st_size == 4 * 30_000
    assert np.array_equal(all_tokens(ds.train.shards[0]), train)


def test_open_nanogpt(make_dataset) -> None:
    train = np.random.default_rng(0).integers(0, 50257, 5000)
    root = make_dataset("nanogpt", train=train, val=train[:1000])
    ds = open_dataset(root)
    assert ds.info.format == "nanogpt" and ds.info.vocab_size == 50257 and ds.info.dtype == "uint16"
    assert (ds.info.train_tokens, ds.info.val_tokens) == (5000, 1000)
    assert ds.info.tokenizer is None and ds.info.eot_id is None
    assert np.array_equal(all_tokens(ds.train.shards[0]), train)
    assert open_dataset(root, vocab_size=50304).info.vocab_size == 50304


def test_open_llmc_shards(make_dataset) -> None:
    a, b = np.arange(3000) % 100, 100 + np.arange(5000) % 100
    root = make_dataset("llmc", train=[a, b], val=[np.arange(800) % 100], vocab_size=50257)
    ds = open_dataset(root)
    assert ds.info.format == "llmc" and ds.info.dtype == "uint16"
    assert (ds.info.train_tokens, ds.info.val_tokens) == (8000, 800)
    assert [s.path.name for s in ds.train.shards] == ["data_train_000001.bin", "data_train_000002.bin"]
    assert np.array_equal(all_tokens(ds.train.shards[1]), b)
    # A window never spans two shards, and both shards get sampled (weighted ~ 3:5).
    x, y = BatchSampler(ds.train, batch_size=400, block_size=64, seed=0).next()
    from_b = (x >= 100).all(axis=1)
    assert ((x < 100).all(axis=1) | from_b).all() and ((y < 100).all(axis=1) | (y >= 100).all(axis=1)).all()
    assert 0.5 < from_b.mean() < 0.75


def test_llmc_header_in_train_bin_counts_as_llmc(tmp_path: Path, writers) -> None:
    writers.llmc_shard(tmp_path / "train.bin", np.arange(2000))
    writers.llmc_shard(tmp_path / "val.bin", np.arange(300))
    ds = open_dataset(tmp_path, preload=False)
    assert ds.info.format == "llmc" and ds.info.train_tokens == 2000
    assert np.array_equal(np.asarray(all_tokens(ds.val.shards[0])), np.arange(300))


# --------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("fmt", ["gpt2-tui", "llmc"])
def test_vectorized_loop_preload_memmap_identical(make_dataset, fmt: str) -> None:
    rng = np.random.default_rng(5)
    if fmt == "llmc":
        root = make_dataset(fmt, train=[rng.integers(0, 64, n) for n in (900, 5000, 2000)],
                            val=[rng.integers(0, 64, 700)])  # fmt: skip
    else:
        root = make_dataset(fmt)
    results = []
    for preload in (True, False):
        ds = open_dataset(root, preload=preload)
        for vectorized in (True, False):
            results.append(batches(BatchSampler(ds.train, 8, 32, seed=42, vectorized=vectorized), 20))
    for other in results[1:]:
        assert_same(results[0], other)
    x, y = results[0][0]
    assert x.dtype == np.int64 and y.dtype == np.int64 and x.shape == y.shape == (8, 32)
    assert x.flags.c_contiguous and y.flags.c_contiguous


def test_windows_are_contiguous_and_y_is_x_shifted(make_dataset) -> None:
    root = make_dataset("gpt2-tui", train=np.arange(30_000), val=np.arange(2_000), vocab_size=65536)
    ds = open_dataset(root)
    for vectorized in (True, False):
        for x, y in batches(BatchSampler(ds.train, 16, 128, seed=1, vectorized=vectorized), 10):
            assert np.array_equal(x, x[:, :1] + np.arange(128))  # x = tokens[o : o + T]
            assert np.array_equal(y, x + 1)  # y = tokens[o + 1 : o + T + 1]
            assert x.min() >= 0 and y.max() <= 29_999


def test_every_window_start_reachable(make_dataset) -> None:
    """Offsets span [0, n - T - 1]: the last full window is drawn, none past the end."""
    root = make_dataset("gpt2-tui", train=np.arange(40), val=np.arange(40), vocab_size=65536)
    x, y = BatchSampler(open_dataset(root).train, 2000, 8, seed=0).next()
    assert set(x[:, 0].tolist()) == set(range(32)) and y.max() == 39


def test_different_seeds_differ(tiny_dataset: Path) -> None:
    ds = open_dataset(tiny_dataset)
    a = BatchSampler(ds.train, 4, 16, seed=1).next()[0]
    b = BatchSampler(ds.train, 4, 16, seed=2).next()[0]
    assert not np.array_equal(a, b)


def test_sampler_state_round_trip(tiny_dataset: Path) -> None:
    ds = open_dataset(tiny_dataset)
    sampler = BatchSampler(ds.train, 4, 16, seed=7)
    batches(sampler, 5)
    state = json.loads(json.dumps(sampler.state()))  # must survive JSON (and TOML: no big ints)
    assert all(not isinstance(v, int) or abs(v) < 2**63 for v in state.values())
    expected = batches(sampler, 6)
    fresh = BatchSampler(ds.train, 4, 16, seed=999, vectorized=False)
    fresh.set_state(state)
    assert_same(batches(fresh, 6), expected)
    assert fresh.batches == sampler.batches == 11


def test_sampler_bad_state_is_user_error(tiny_dataset: Path) -> None:
    sampler = BatchSampler(open_dataset(tiny_dataset).train, 4, 16, seed=7)
    for bad in ({}, {"bit_generator": "MT19937"}, {**sampler.state(), "state": "not a number"}):
        with pytest.raises(UserError) as err:
            sampler.set_state(bad)
        assert "\n" not in str(err.value)


def test_check_block(tiny_dataset: Path, make_dataset) -> None:
    ds = open_dataset(tiny_dataset)
    ds.check_block(3_999)
    with pytest.raises(UserError) as err:
        ds.check_block(4_000)
    msg = str(err.value)
    assert "\n" not in msg and "val" in msg and "4000 tokens" in msg and "--block-size 3999" in msg
    with pytest.raises(UserError):
        BatchSampler(ds.val, 2, 4_000, seed=0)
    root = make_dataset("llmc", train=[np.arange(5000) % 64, np.arange(50) % 64], val=[np.arange(500) % 64])
    with pytest.raises(UserError) as err:
        open_dataset(root, vocab_size=64).check_block(64)
    assert "train" in str(err.value) and "data_train_000002.bin" in str(err.value)


_READER = """
import sys, time
from engine.dataset import DataFailed, open_dataset
from engine.train.batches import BatchSampler
ds = open_dataset(sys.argv[1], preload=False)
print("open", flush=True)
sys.stdin.readline()  # the cutter runs
ok = failed = 0
for vectorized in (True, False):
    sampler = BatchSampler(ds.train, 64, 512, seed=0, vectorized=vectorized)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            sampler.next()
            ok += 1
        except DataFailed:
            failed += 1
print(ok, failed)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_token_file_cut_while_batches_are_read_is_an_error_not_a_crash(make_dataset) -> None:
    """Another process truncates and restores train.bin as fast as it can while a not-preloaded
    sampler builds batches: every cut shows as a DataFailed (the run saves and stops), never as
    a SIGBUS that kills the process (what a memmap read of a page past the new end does)."""
    root = make_dataset("gpt2-tui", train=np.arange(400_000, dtype=np.uint16) % 64)
    train = root / "train.bin"
    whole = train.read_bytes()
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert reader.stdout is not None and reader.stdout.readline() == "open\n"
    cutter = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
        "print('cutting', flush=True)\n"
        "while True:\n"
        "    os.ftruncate(fd, 1000)\n"
        "    os.pwrite(fd, data, 0)\n"
        "    time.sleep(0.001)\n"
    ), str(train)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert cutter.stdout is not None and cutter.stdout.readline() == "cutting\n"
        out, err = reader.communicate("go\n", timeout=45)
    finally:
        cutter.kill()
        cutter.wait()
        reader.kill()
    train.write_bytes(whole)
    assert reader.returncode == 0, (reader.returncode, err[-2000:])  # -7: SIGBUS
    ok, failed = map(int, out.split())
    assert ok > 0 and failed > 0, (ok, failed, "the cutter never caught the reader mid-read: nothing was tested")


# --------------------------------------------------------------------------- loader


@pytest.mark.parametrize("prefetch", [True, False])
def test_loader_matches_sampler(tiny_dataset: Path, prefetch: bool) -> None:
    ds = open_dataset(tiny_dataset)
    expected = batches(BatchSampler(ds.train, 4, 16, seed=3), 5)
    with BatchLoader(BatchSampler(ds.train, 4, 16, seed=3), torch.device("cpu"), prefetch=prefetch) as loader:
        got = [loader.next() for _ in range(5)]
    for x, y in got:
        assert x.dtype == torch.int64 and x.device.type == "cpu" and x.shape == (4, 16)
    assert_same([(x.numpy(), y.numpy()) for x, y in got], expected)


def test_loader_state_resumes_exactly_with_prefetch(tiny_dataset: Path) -> None:
    ds = open_dataset(tiny_dataset)
    old = BatchLoader(BatchSampler(ds.train, 4, 16, seed=11), torch.device("cpu"), prefetch=True)
    for _ in range(3):
        old.next()
    time.sleep(0.1)  # let the thread build ahead: the sampler is now past the next batch
    state = old.state()
    assert old.sampler.batches > state["batches"]
    expected = [old.next() for _ in range(4)]
    old.close()

    new = BatchLoader(BatchSampler(ds.train, 4, 16, seed=0), "cpu", prefetch=True)
    new.next()  # a prefetched batch is in flight; set_state must discard it
    new.set_state(json.loads(json.dumps(state)))
    assert new.state() == state
    got = [new.next() for _ in range(4)]
    new.close()
    assert_same(got, expected)


def test_loader_set_state_rewinds_without_prefetch(tiny_dataset: Path) -> None:
    ds = open_dataset(tiny_dataset)
    loader = BatchLoader(BatchSampler(ds.train, 4, 16, seed=11), "cpu", prefetch=False)
    start = loader.state()
    first = [loader.next() for _ in range(3)]
    loader.set_state(start)
    assert_same([loader.next() for _ in range(3)], first)
    loader.close()


def test_loader_close_is_prompt_when_consumer_stopped(tiny_dataset: Path) -> None:
    loader = BatchLoader(BatchSampler(open_dataset(tiny_dataset).train, 4, 16, seed=0), "cpu")
    loader.next()
    time.sleep(0.2)  # queue full: the producer is waiting to hand over a batch
    thread = loader._thread
    t0 = time.perf_counter()
    loader.close()
    assert time.perf_counter() - t0 < 1.0
    assert thread is not None and not thread.is_alive()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError):
        loader.next()


def test_loader_reraises_producer_errors(tiny_dataset: Path) -> None:
    sampler = BatchSampler(open_dataset(tiny_dataset).train, 4, 16, seed=0)

    def boom() -> None:
        raise OSError("disk gone")

    sampler.next = boom  # type: ignore[method-assign]
    loader = BatchLoader(sampler, "cpu", prefetch=True)
    with pytest.raises(OSError, match="disk gone"):
        loader.next()
    loader.close()
    assert threading.active_count() < 50


# --------------------------------------------------------------------------- bad input


def _sidecar_edit(**changes):
    def make(make_dataset, w) -> Path:
        root = make_dataset("gpt2-tui")
        car = json.loads((root / "dataset.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                del car[key]
            else:
                car[key] = value
        (root / "dataset.json").write_text(json.dumps(car))
        return root

    return make


_DROP = object()


def _write(name: str, data: bytes, base: str = "gpt2-tui"):
    def make(make_dataset, w) -> Path:
        root = make_dataset(base)
        (root / name).write_bytes(data)
        return root

    return make


def _llmc(magic=20240520, version=1, count=None, tokens=np.arange(100)):
    def make(make_dataset, w) -> Path:
        root = make_dataset("llmc", train=[np.arange(2000) % 64], val=[np.arange(500) % 64])
        w.llmc_shard(root / "data_train_000002.bin", tokens, magic=magic, version=version, count=count)
        return root

    return make


def _raw(files: dict[str, bytes]):
    def make(make_dataset, w) -> Path:
        root = make_dataset("nanogpt")
        for f in root.iterdir():
            f.unlink()
        for name, data in files.items():
            (root / name).write_bytes(data)
        return root

    return make


_LLMC_HEADER_1 = np.array([20240520, 1, 1] + [0] * 253, "<i4").tobytes()

BAD = {
    "missing dir": (lambda md, w: md("gpt2-tui").parent / "nope", "does not exist"),
    "a file": (lambda md, w: md("gpt2-tui") / "train.bin", "not a dataset directory"),
    "empty dir": (_raw({}), "expected dataset.json + train.bin + val.bin"),
    "no val": (_raw({"train.bin": b"\0\0" * 100}), "no val file"),
    "odd nanogpt size": (_raw({"train.bin": b"\0" * 201, "val.bin": b"\0\0" * 100}), "not a multiple of 2"),
    "odd ours size": (_write("val.bin", b"\0" * 8001), "not a multiple of 2"),
    "count mismatch": (_write("val.bin", b"\0\0" * 3999), "val_tokens=4000"),
    "id too big ours": (_write("val.bin", np.full(4000, 64, "<u2").tobytes()), "token id 64"),
    "id too big nanogpt": (
        _raw({"train.bin": np.full(100, 60_000, "<u2").tobytes(), "val.bin": b"\0\0" * 100}),
        "--vocab-size 60001",
    ),
    "unknown names": (_raw({"my_train.bin": b"\0\0" * 10, "my_val.bin": b"\0\0" * 10}), "without llm.c headers"),
    "empty split": (_raw({"train.bin": b"\0\0" * 10, "val.bin": b""}), "holds no tokens"),
    "llmc bad magic": (_llmc(magic=1234), "magic 1234"),
    "llmc bad version": (_llmc(version=2), "version 2"),
    "llmc bad count": (_llmc(count=99), "header says 99 tokens"),
    "llmc short": (_write("data_train_000009.bin", b"\0" * 100, base="llmc"), "shorter than"),
    "llmc odd payload": (_write("data_val_000009.bin", _LLMC_HEADER_1 + b"\0\0\0", base="llmc"), "multiple of 2"),
    "sidecar broken": (_write("dataset.json", b"{not json"), "not readable JSON"),
    "sidecar not object": (_write("dataset.json", b"[1, 2]"), "invalid"),
    "sidecar missing key": (_sidecar_edit(eot_id=_DROP), "eot_id"),
    "sidecar extra key": (_sidecar_edit(extra=1), "extra"),
    "sidecar wrong type": (_sidecar_edit(vocab_size="64"), "vocab_size"),
    "sidecar format": (_sidecar_edit(format="nanogpt"), "format"),
    "sidecar version": (_sidecar_edit(version=2), "version"),
    "sidecar int16": (_sidecar_edit(dtype="int16"), "int16"),
    "sidecar unknown dtype": (_sidecar_edit(dtype="float32"), "unknown dtype"),
    "sidecar uint16 big vocab": (_sidecar_edit(vocab_size=70_000), "needs uint32"),
    "sidecar eot outside": (_sidecar_edit(eot_id=64), "eot_id 64"),
    "sidecar tokenizer missing": (_sidecar_edit(tokenizer="tokenizer.json"), "missing"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_user_error(make_dataset, writers, file_tree, tmp_path: Path, case: str) -> None:
    build, needle = BAD[case]
    root = build(make_dataset, writers)
    before = file_tree(tmp_path)
    with pytest.raises(UserError) as err:
        open_dataset(root, vocab_size=64 if "llmc" in case else 50257)
    msg = str(err.value)
    assert "\n" not in msg and needle in msg, msg
    assert file_tree(tmp_path) == before  # nothing written or touched


def test_vocab_size_argument_checked(make_dataset) -> None:
    root = make_dataset("nanogpt")
    with pytest.raises(UserError, match="--vocab-size 70000"):
        open_dataset(root, vocab_size=70_000)


def test_bad_batch_size(tiny_dataset: Path) -> None:
    with pytest.raises(UserError, match="--batch-size"):
        BatchSampler(open_dataset(tiny_dataset).train, 0, 16, seed=0)
