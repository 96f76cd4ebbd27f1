"""Shared fixtures: small on-disk datasets in every supported format, and a private cache.
The plain helpers they use, and every other shared helper, are in tests/harness.py: a test
imports those from there (`from harness import ...`), never from conftest or another test.

`make_dataset(fmt, train, val, ...)` writes real files the way nanoGPT, llm.c or
`gpt2-tui prepare` would; `tiny_dataset` is a ready-made gpt2-tui dataset of random ids
that trainer tests can use without tokenizing anything.
"""

from __future__ import annotations

import os

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.register_assert_rewrite("harness")  # its asserts explain themselves as a test's do
from harness import (  # noqa: E402
    TrainedRuns, bigram_tokens, random_tokens, tree_snapshot, write_gpt2tui, write_llmc, write_llmc_shard, write_nanogpt,
)  # fmt: skip

# datasets reads this once, at its import, wherever a test first imports it: never the network here
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")



def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-native", default=None, metavar="LIST",
        help="take this CPU to do these half precisions natively (none, bf16, bf16,fp16), whatever it "
        "is: the suite on each side of every CPU-dependent branch (engine.device.CPU_NATIVE_ENV)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    forced = config.getoption("--cpu-native")
    if forced is not None:  # in the environment, so every child process the tests start sees it too
        os.environ["GPT2_TUI_CPU_NATIVE"] = forced


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
        if "trained_runs" in getattr(item, "fixturenames", ()):  # the trained layer: never a unit test
            item.add_marker("trained")
            item.add_marker("slow")
        if any(m.kwargs.get("reason") == NEEDS_CUDA for m in item.iter_markers("skipif")):
            item.add_marker("gpu")


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


@pytest.fixture
def structured_dataset(make_dataset: Callable[..., Path]) -> Path:
    """A gpt2-tui dataset dir like tiny_dataset (vocab 64, 20,000 / 4,000 tokens) whose tokens
    follow a noisy bigram chain: a model that learns lowers its loss well below ln 64."""
    return make_dataset("gpt2-tui", train=bigram_tokens(20_000, 64, 1), val=bigram_tokens(4_000, 64, 2),
                        name="structured")  # fmt: skip


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """The table of trained runs (tests/harness.py TRAINED_RUNS): each trained once a session,
    a copy for each test that asks. A test that uses it is in the trained layer: marked slow."""
    return TrainedRuns(tmp_path_factory.mktemp("trained-runs"))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point GPT2_TUI_CACHE at a session temp dir so no test touches ~/.cache/gpt2-tui."""
    cache = tmp_path_factory.mktemp("gpt2-tui-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2_TUI_CACHE", str(cache))
        yield cache


@pytest.fixture
def file_tree() -> Callable[[Path], dict[str, tuple[int, int]]]:
    """tree_snapshot as a fixture (not named `snapshot`: that is syrupy's, for the TUI SVGs)."""
    return tree_snapshot


# ----------------------------------------------------------------------------- the layers by cost
# `slow` is given from measured durations: every test's seconds (setup + call + teardown, so a
# module fixture's cost lands on the test that first asked for it) and whether it is marked slow
# are written to the file GPT2_TUI_DURATIONS names; .ci/slow_check.py reads it after the suite
# and names each unmarked test over its limit.
# A unit test never trains and never starts a process: what each test did is recorded beside its
# seconds (`trains`: a training step ran, on any thread; `spawns`: a child process was started), and
# .ci/slow_check.py fails a test that did either without the slow mark.
# A fixture shared by a module or the session is set up by whichever test asks first: what it does is
# recorded against the fixture too (`fixtures_that`), so every test that uses it is judged by it.
# The record goes to .pytest_cache/gpt2-tui-durations.json (GPT2_TUI_DURATIONS names another file).
DURATIONS_ENV = "GPT2_TUI_DURATIONS"
DURATIONS = TESTS.parent / ".pytest_cache" / "gpt2-tui-durations.json"
_durations: dict[str, dict[str, object]] = {}
_fixtures_that: dict[str, set[str]] = {"trains": set(), "spawns": set()}
_running: list[str] = []  # the test being set up, run or torn down
_setting_up: list[str] = []  # the fixtures being set up, innermost last


def _row(nodeid: str, slow: bool) -> dict[str, object]:
    return _durations.setdefault(nodeid, {"seconds": 0.0, "slow": slow, "trains": False, "spawns": False})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    info = getattr(item, "_fixtureinfo", None)  # each fixture the test uses, named where it is defined
    defs = info.name2fixturedefs.items() if info is not None else ()
    _row(item.nodeid, item.get_closest_marker("slow") is not None)["fixtures"] = [
        _fixture_key(d[-1]) for _, d in defs if d
    ]
    _running[:] = [item.nodeid]
    try:
        return (yield)
    finally:
        _running.clear()


def _fixture_key(fixturedef: pytest.FixtureDef) -> str:
    """A fixture as where it is defined and its name: two modules' `run` fixtures are two fixtures."""
    return f"{fixturedef.baseid}::{fixturedef.argname}"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> object:
    _setting_up.append(_fixture_key(fixturedef))
    try:
        return (yield)
    finally:
        _setting_up.pop()


def _did(what: str) -> None:
    if _running and _running[0] in _durations:
        _durations[_running[0]][what] = True
    _fixtures_that[what].update(_setting_up)


def _recording(cls: type, method: str, what: str) -> None:
    """cls.method, wrapped to record `what` for the running test (once a session)."""
    import functools

    inner = getattr(cls, method)

    @functools.wraps(inner)
    def wrapper(*args: object, **kwargs: object) -> object:
        _did(what)
        return inner(*args, **kwargs)

    setattr(cls, method, wrapper)


@pytest.fixture(autouse=True, scope="session")
def _record_what_tests_do() -> None:
    import platform
    import subprocess

    import harness
    from engine.train.trainer import Trainer

    platform.processor()  # `uname -p`, once a process, cached: whichever test asked first would "spawn"

    _recording(Trainer, "train_step", "trains")
    _recording(subprocess.Popen, "__init__", "spawns")
    _recording(harness._Server, "run", "spawns")  # the warm runner forks a child per command


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _row(report.nodeid, "slow" in report.keywords)
    row["seconds"] = float(row["seconds"]) + report.duration  # type: ignore[arg-type]
    if report.outcome == "skipped":
        row["skipped"] = True


def pytest_sessionfinish(session: pytest.Session) -> None:
    import json

    out = Path(os.environ.get(DURATIONS_ENV) or DURATIONS)
    if _durations and not hasattr(session.config, "workerinput"):
        out.parent.mkdir(parents=True, exist_ok=True)
        fixtures = {what: sorted(names) for what, names in _fixtures_that.items()}
        Path(out).write_text(json.dumps({"tests": _durations, "fixtures_that": fixtures}, indent=0, sort_keys=True))
