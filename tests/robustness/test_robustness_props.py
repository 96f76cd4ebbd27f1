"""Property: any config values and any token-file contents either train or get a one-line
error with exit status 2 (nothing written); never a traceback. In-process `engine.cli.main`,
micro model, at most 2 steps, so each example takes about a second."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.train import checkpoint as ckpt
from gpt2_tui import main

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


def _cli(argv: list[str]) -> tuple[int, str]:
    """main() with stdout/stderr captured; argparse's usage errors exit via SystemExit(2)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def _runs_or_one_line_error(argv: list[str], out: Path) -> int:
    code, err = _cli([*argv, "--out", str(out)])
    if code == 0:
        assert ckpt.load(ckpt.CheckpointDir(out / "checkpoints").latest())["step"] >= 1
    else:
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
        # a usage error writes nothing; a stop after set-up (NaN weights) keeps the run directory
        assert not out.exists() or "NaN/Inf" in err, err
    with contextlib.suppress(Exception):  # outside a hypothesis test (the sanity test below)
        event(f"exit {code}")
    return code


def _num(lo: float, hi: float) -> st.SearchStrategy[str]:
    special = st.sampled_from(["0", "-1", "nan", "inf", "1e30", "abc", ""])
    valid = st.floats(lo, hi).map(repr)
    return st.one_of(valid, valid, valid, valid, special)  # mostly in range, so that runs happen too


def _int(lo: int, hi: int) -> st.SearchStrategy[str]:
    valid = st.integers(lo, hi).map(str)
    return st.one_of(valid, valid, valid, valid, st.sampled_from(["-1", "0", "2.5", "x"]))


CONFIG_FLAGS = {
    "--n-layer": _int(1, 3), "--n-head": _int(1, 4), "--n-embd": _int(4, 48), "--context": _int(4, 40),
    "--batch-size": _int(1, 4), "--block-size": _int(2, 40), "--grad-accum": _int(1, 2),
    "--max-steps": _int(1, 2), "--eval-interval": _int(1, 3), "--eval-batches": _int(1, 2),
    "--ckpt-interval": _int(1, 3), "--keep-last": _int(1, 3), "--warmup-steps": _int(0, 3),
    "--log-interval": _int(1, 2), "--max-bad-steps": _int(1, 3),
    "--lr": _num(1e-5, 10.0), "--min-lr": _num(0.0, 1e-3), "--dropout": _num(0.0, 0.99),
    "--grad-clip": _num(0.0, 2.0), "--weight-decay": _num(0.0, 1.0), "--beta2": _num(0.5, 0.999),
}  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("props")
    rng = np.random.default_rng(0)
    rng.integers(0, 64, 4000).astype("<u2").tofile(root / "train.bin")
    rng.integers(0, 64, 1000).astype("<u2").tofile(root / "val.bin")
    return root  # nanoGPT's layout; --vocab-size 64 below


@SETTINGS
@given(st.fixed_dictionaries({}, optional=CONFIG_FLAGS))
def test_any_config_values_run_or_fail_in_one_line(dataset, flags):
    argv = ["train", "--preset", "micro", "--device", "cpu", "--data", str(dataset), "--vocab-size", "64", "--max-steps", "2"]
    for flag, value in flags.items():
        argv.append(f"{flag}={value}")
    with tempfile.TemporaryDirectory() as d:
        _runs_or_one_line_error(argv, Path(d) / "run")


_ids = st.lists(st.integers(0, 70), max_size=300).map(lambda ids: np.array(ids, "<u2").tobytes())
_bytes = st.one_of(_ids, st.binary(max_size=300))


_ids_min = st.lists(st.integers(0, 63), min_size=20, max_size=300)  # below every --vocab-size drawn


def _honest(layout: str, train: list[int], val: list[int]) -> dict[str, bytes]:
    t, v = np.array(train, "<u2").tobytes(), np.array(val, "<u2").tobytes()
    if layout == "nanogpt":
        return {"train.bin": t, "val.bin": v}
    if layout == "llmc":
        head = lambda n: np.array([20240520, 1, n] + [0] * 253, "<i4").tobytes()
        return {"d_train_000001.bin": head(len(train)) + t, "d_val_000000.bin": head(len(val)) + v}
    car = {"format": "gpt2-tui", "version": 1, "dtype": "uint16", "vocab_size": 71, "train_tokens": len(train),
           "val_tokens": len(val), "tokenizer": None, "eot_id": 0}  # fmt: skip
    return {"train.bin": t, "val.bin": v, "dataset.json": json.dumps(car).encode()}


@st.composite
def _dataset(draw) -> dict[str, bytes]:
    """File name -> contents, in one of the three layouts, honest or not."""
    layout = draw(st.sampled_from(["gpt2-tui", "nanogpt", "llmc"]))
    if draw(st.booleans()):  # honest files of real ids: these should train
        return _honest(layout, draw(_ids_min), draw(_ids_min))
    train, val = draw(_bytes), draw(_bytes)
    if layout == "nanogpt":
        return {"train.bin": train, "val.bin": val}
    if layout == "llmc":
        def shard(payload: bytes) -> bytes:
            magic = draw(st.sampled_from([20240520, 20240520, 1234, -1]))
            version = draw(st.sampled_from([1, 1, 2, 0]))
            count = draw(st.one_of(st.just(len(payload) // 2), st.integers(-5, 500)))
            return np.array([magic, version, count] + [0] * 253, "<i4").tobytes() + payload

        return {"d_train_000001.bin": shard(train), "d_val_000000.bin": shard(val)}
    dtype = draw(st.sampled_from(["uint16", "uint16", "uint32", "int16", "float32"]))
    width = 4 if dtype == "uint32" else 2
    if dtype == "uint32" and draw(st.booleans()):
        train = np.frombuffer(train[: len(train) // 2 * 2], "<u2").astype("<u4").tobytes()
        val = np.frombuffer(val[: len(val) // 2 * 2], "<u2").astype("<u4").tobytes()
    sidecar = {
        "format": draw(st.sampled_from(["gpt2-tui", "gpt2-tui", "nanogpt"])),
        "version": draw(st.sampled_from([1, 1, 2])),
        "dtype": dtype,
        "vocab_size": draw(st.sampled_from([71, 64, 70000, 1, 0, -3])),
        "train_tokens": draw(st.one_of(st.just(len(train) // width), st.integers(-1, 300))),
        "val_tokens": draw(st.one_of(st.just(len(val) // width), st.integers(-1, 300))),
        "tokenizer": None,
        "eot_id": draw(st.sampled_from([None, 0, 70, 100000])),
    }
    car = json.dumps(sidecar).encode()
    return {"train.bin": train, "val.bin": val, "dataset.json": draw(st.sampled_from([car, car, car[:-3], b"[]"]))}


@SETTINGS
@given(_dataset(), st.sampled_from(["50257", "71", "64"]))
def test_any_token_files_run_or_fail_in_one_line(files, vocab):
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data"
        data.mkdir()
        for name, content in files.items():
            (data / name).write_bytes(content)
        argv = ["train", "--preset", "micro", "--device", "cpu", "--data", str(data), "--max-steps", "1",
                "--block-size", "8", "--batch-size", "2", "--eval-batches", "1"]  # fmt: skip
        if "dataset.json" not in files:
            argv += ["--vocab-size", vocab]
        _runs_or_one_line_error(argv, Path(d) / "run")


def test_the_properties_can_see_both_outcomes(dataset, tmp_path):
    """Guard against a vacuous property: the same harness sees a run and a one-line error."""
    base = ["train", "--preset", "micro", "--device", "cpu", "--data", str(dataset), "--vocab-size", "64", "--max-steps", "1"]
    assert _runs_or_one_line_error(base, tmp_path / "a") == 0
    assert _runs_or_one_line_error([*base, "--lr=-1"], tmp_path / "b") == 2
