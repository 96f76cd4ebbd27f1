"""Shared fixtures: small on-disk datasets in every supported format, and a private cache.

`make_dataset(fmt, train, val, ...)` writes real files the way nanoGPT, llm.c or
`gpt2-tui prepare` would; `tiny_dataset` is a ready-made gpt2-tui dataset of random ids
that trainer tests can use without tokenizing anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest


LLMC_MAGIC = 20240520
# Each test's area, for `pytest -m AREA` (registered in pyproject.toml): the folder under tests/
# that holds its file. A test skipped for want of CUDA is also gpu.
TESTS = Path(__file__).resolve().parent
AREAS = ("train", "run", "prep", "inspect", "config", "tui", "robustness", "gpu", "bench")
NEEDS_CUDA = "needs a CUDA GPU"


def area(path: Path) -> str:
    """The area of the test file at `path`: its first folder under tests/."""
    parts = Path(path).resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in AREAS:
        raise pytest.UsageError(f"{path}: a test file belongs in one of tests/{{{','.join(AREAS)}}}/")
    return parts[0]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(area(item.path))
        if any(m.kwargs.get("reason") == NEEDS_CUDA for m in item.iter_markers("skipif")):
            item.add_marker("gpu")


def write_gpt2tui(
    root: Path,
    train: np.ndarray,
    val: np.ndarray,
    vocab_size: int,
    eot_id: int | None = None,
    tokenizer: str | None = None,
) -> Path:
    """A gpt2-tui dataset dir: dataset.json + train.bin + val.bin (dtype from the vocab)."""
    root.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    on_disk = {"uint16": "<u2", "uint32": "<u4"}[dtype]
    np.asarray(train).astype(on_disk).tofile(root / "train.bin")
    np.asarray(val).astype(on_disk).tofile(root / "val.bin")
    sidecar = {
        "format": "gpt2-tui",
        "version": 1,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "train_tokens": int(len(train)),
        "val_tokens": int(len(val)),
        "tokenizer": tokenizer,
        "eot_id": eot_id,
    }
    (root / "dataset.json").write_text(json.dumps(sidecar))
    return root


def write_nanogpt(root: Path, train: np.ndarray, val: np.ndarray) -> Path:
    """nanoGPT's layout: raw uint16 train.bin / val.bin, nothing else."""
    root.mkdir(parents=True, exist_ok=True)
    np.asarray(train).astype("<u2").tofile(root / "train.bin")
    np.asarray(val).astype("<u2").tofile(root / "val.bin")
    return root


def write_llmc_shard(path: Path, tokens: np.ndarray, magic: int = LLMC_MAGIC, version: int = 1,
                     count: int | None = None) -> Path:  # fmt: skip
    """One llm.c shard: 256 int32 header (magic, version, token count) + uint16 tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = np.zeros(256, dtype="<i4")
    header[:3] = [magic, version, len(tokens) if count is None else count]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens).astype("<u2").tobytes())
    return path


def write_llmc(root: Path, shards: dict[str, np.ndarray]) -> Path:
    """A directory of llm.c shards, e.g. {"x_train_000001.bin": ids, "x_val_000000.bin": ids}."""
    for name, tokens in shards.items():
        write_llmc_shard(root / name, tokens)
    return root


def random_tokens(n: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab_size, size=n, dtype=np.int64)


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., Path]:
    """Factory: make_dataset("gpt2-tui" | "nanogpt" | "llmc", train=..., val=..., ...) -> dir.

    train/val are token arrays (for "llmc" they may be lists of arrays, one per shard);
    by default random ids of vocab_size (64 unless given).
    """
    counter = iter(range(10**6))

    def make(
        fmt: str = "gpt2-tui",
        train: np.ndarray | Sequence[np.ndarray] | None = None,
        val: np.ndarray | Sequence[np.ndarray] | None = None,
        vocab_size: int = 64,
        name: str | None = None,
        **sidecar: object,
    ) -> Path:
        root = tmp_path / (name or f"{fmt}-{next(counter)}")
        train = random_tokens(20_000, vocab_size, 1) if train is None else train
        val = random_tokens(4_000, vocab_size, 2) if val is None else val
        if fmt == "gpt2-tui":
            return write_gpt2tui(root, train, val, vocab_size, **sidecar)  # type: ignore[arg-type]
        if fmt == "nanogpt":
            return write_nanogpt(root, train, val)
        if fmt == "llmc":
            trains = train if isinstance(train, list) else [train]
            vals = val if isinstance(val, list) else [val]
            shards = {f"data_train_{i:06d}.bin": t for i, t in enumerate(trains, 1)}
            shards.update({f"data_val_{i:06d}.bin": v for i, v in enumerate(vals)})
            return write_llmc(root, shards)
        raise ValueError(f"unknown format {fmt}")

    return make


@pytest.fixture
def writers() -> SimpleNamespace:
    """The raw file writers (gpt2tui, nanogpt, llmc, llmc_shard, random_tokens), as a fixture
    so that tests need not import conftest."""
    return SimpleNamespace(
        gpt2tui=write_gpt2tui, nanogpt=write_nanogpt, llmc=write_llmc,
        llmc_shard=write_llmc_shard, random_tokens=random_tokens,
    )  # fmt: skip


@pytest.fixture
def tiny_dataset(make_dataset: Callable[..., Path]) -> Path:
    """A gpt2-tui dataset dir: vocab 64, 20,000 random train / 4,000 val tokens, no tokenizer."""
    return make_dataset("gpt2-tui", name="tiny")


def bigram_tokens(n: int, vocab_size: int, seed: int = 0, keep: float = 0.9) -> np.ndarray:
    """A noisy bigram chain: next = (5 * t + 1) % V with probability `keep`, else uniform.
    Its best loss is far below ln V, so "the loss falls" is a real claim, not a coin flip."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, vocab_size, size=n)
    follow = rng.random(n) < keep
    out = np.empty(n, dtype=np.int64)
    out[0] = noise[0]
    for i in range(1, n):
        out[i] = (5 * out[i - 1] + 1) % vocab_size if follow[i] else noise[i]
    return out


@pytest.fixture
def structured_dataset(make_dataset: Callable[..., Path]) -> Path:
    """A gpt2-tui dataset dir like tiny_dataset (vocab 64, 20,000 / 4,000 tokens) whose tokens
    follow a noisy bigram chain: a model that learns lowers its loss well below ln 64."""
    return make_dataset("gpt2-tui", train=bigram_tokens(20_000, 64, 1), val=bigram_tokens(4_000, 64, 2),
                        name="structured")  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point GPT2_TUI_CACHE at a session temp dir so no test touches ~/.cache/gpt2-tui."""
    cache = tmp_path_factory.mktemp("gpt2-tui-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2_TUI_CACHE", str(cache))
        yield cache


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of everything under root: to assert nothing changed."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def file_tree() -> Callable[[Path], dict[str, tuple[int, int]]]:
    """tree_snapshot as a fixture (not named `snapshot`: that is syrupy's, for the TUI SVGs)."""
    return tree_snapshot


def cli_fails(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    """Run the in-process CLI: it must exit 2 with one stderr line naming the problem."""
    from gpt2_tui import main

    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def micro_config(data: Path, **flags):
    """The micro preset on CPU in fp32 over `data`, with dotted overrides: a run's config for
    tests that build the engine directly."""
    from engine.config import resolve

    return resolve("micro", None, {"data.path": str(data), "speed.device": "cpu", "speed.precision": "fp32"} | flags)


def run_events(run_dir: Path) -> list:
    """A run's events, every line readable (a test run writes no bad line)."""
    from engine import rundir
    from engine.events import read_events

    events, problems = read_events(run_dir / rundir.EVENTS)
    assert problems == []
    return events
