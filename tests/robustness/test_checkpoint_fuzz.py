"""Malformed checkpoints are one line, never a traceback (issue 12 item 7).

(a) In-process: >= 1,000 random and mutated byte strings, all derived from a real checkpoint
    of a 2-step `micro` run (truncations, byte flips anywhere / in data.pkl / in the zip's
    central directory, random bytes, zip members deleted or replaced), fed to the loader
    `engine.train.checkpoint.load`. Each must raise `engine.errors.UserError` with a one-line
    message, or load (a flip inside a tensor's bytes is not detectable without a checksum);
    what loads is then given to `engine.inspect.sample.load_model`, which must build the model or
    raise UserError. Anything else (another exception, a hang) is a failure.
(b) Through the real `gpt2-tui` command: `sample FILE` and `train --resume RUN` (with the run's
    latest checkpoint replaced) on a few corrupted files, and on checkpoints with a missing or
    wrong-typed field (torch.save of an edited dict): exit 2, one line, nothing written, and
    any flag the line advises exists.
"""

from __future__ import annotations

import collections
import io
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import Work, make_work, refusal_problems, train_good_run, tree_diff

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

N_FUZZ = 1200


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A real 2-step micro run made by `gpt2-tui train` (with a tokenizer): good/ in its work dir."""
    return train_good_run(tmp_path_factory.mktemp("good"))


@pytest.fixture(scope="module")
def real_ckpt(good_run: Path) -> bytes:
    latest = (good_run / "checkpoints" / "latest").read_text().strip()
    return (good_run / "checkpoints" / latest).read_bytes()


def _members(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(
                zipfile.ZipInfo(n, date_time=(2024, 1, 1, 0, 0, 0)), data
            )  # no clock: deterministic
    return buf.getvalue()


def _flip(
    rng: np.random.Generator,
    blob: bytes,
    lo: int = 0,
    hi: int | None = None,
    most: int = 8,
) -> bytes:
    b = bytearray(blob)
    hi = len(b) if hi is None else min(hi, len(b))
    for _ in range(int(rng.integers(1, most + 1))):
        i = int(rng.integers(lo, hi))
        b[i] = int(rng.integers(0, 256))
    return bytes(b)


def mutants(blob: bytes, seed: int = 12) -> list[tuple[str, bytes]]:
    """Deterministic malformed variants of a real checkpoint (>= N_FUZZ)."""
    rng = np.random.default_rng(seed)
    members = _members(blob)
    names = list(members)
    pkl = next(n for n in names if n.endswith("data.pkl"))
    out: list[tuple[str, bytes]] = []
    for n in (0, 1, 4, 22, 100, 512, len(blob) // 2, len(blob) - 22, len(blob) - 1):
        out.append((f"truncate@{n}", blob[:n]))
    for _ in range(150):
        out.append(("truncate", blob[: int(rng.integers(0, len(blob)))]))
    for _ in range(250):
        out.append(("flip-anywhere", _flip(rng, blob)))
    for _ in range(60):
        out.append(("flip-head", _flip(rng, blob, 0, 512)))
    for _ in range(120):
        out.append(("flip-central-dir", _flip(rng, blob, len(blob) - 4096)))
    for _ in range(220):
        out.append(
            ("flip-data.pkl", _zip(members | {pkl: _flip(rng, members[pkl], most=4)}))
        )
    for _ in range(40):
        cut = int(rng.integers(0, len(members[pkl])))
        out.append(("truncate-data.pkl", _zip(members | {pkl: members[pkl][:cut]})))
    for _ in range(20):
        out.append(
            (
                "random-data.pkl",
                _zip(members | {pkl: rng.bytes(int(rng.integers(0, 2000)))}),
            )
        )
    for _ in range(80):
        out.append(("random-bytes", rng.bytes(int(rng.integers(0, 6000)))))
    for _ in range(40):
        out.append(
            ("zip-magic+random", b"PK\x03\x04" + rng.bytes(int(rng.integers(0, 3000))))
        )
    for n in names:
        out.append(
            (
                f"delete-member:{n.split('/', 1)[-1]}",
                _zip({k: v for k, v in members.items() if k != n}),
            )
        )
    for _ in range(40):
        keep = [n for n in names if rng.random() < 0.7]
        out.append(("delete-members", _zip({k: members[k] for k in keep})))
    for _ in range(30):
        victim = names[int(rng.integers(0, len(names)))]
        out.append(
            ("random-member", _zip(members | {victim: rng.bytes(len(members[victim]))}))
        )
    assert len(out) >= N_FUZZ - 200, len(out)
    while len(out) < N_FUZZ:
        out.append(("flip-anywhere", _flip(rng, blob, most=32)))
    return out


def test_a_thousand_malformed_checkpoints_each_raise_user_error(
    real_ckpt: bytes, tmp_path: Path
) -> None:
    from engine.train import checkpoint as ckpt
    from engine.inspect import sample
    from engine.errors import UserError

    cases = mutants(real_ckpt)
    assert len(cases) >= 1000
    outcomes: collections.Counter[str] = collections.Counter()
    failures: dict[str, list[str]] = collections.defaultdict(list)
    path = tmp_path / "checkpoints" / "step_000002.pt"
    path.parent.mkdir()
    for i, (kind, data) in enumerate(cases):
        path.write_bytes(data)
        try:
            ckpt.load(path)
        except UserError as err:
            msg = str(err)
            if len(msg.splitlines()) != 1 or not msg.strip():
                failures[f"UserError of {len(msg.splitlines())} lines"].append(
                    f"#{i} {kind}"
                )
            outcomes["UserError"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - what we are looking for
            key = f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
            failures[key].append(f"#{i} {kind}")
            continue
        try:  # it loaded: the weights' consumer must take it or refuse it in one line
            sample.load_model(path)
            outcomes["loaded, model built"] += 1
        except UserError:
            outcomes["loaded, then UserError from load_model"] += 1
        except Exception as err:  # noqa: BLE001
            failures[
                f"load_model: {type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
            ].append(f"#{i} {kind}")
    report = "; ".join(
        f"{k} x{len(v)} (e.g. {', '.join(v[:3])})" for k, v in failures.items()
    )
    print(
        f"{len(cases)} malformed checkpoints: {dict(outcomes)}; failures: {report or 'none'}"
    )
    assert not failures, (
        f"{sum(map(len, failures.values()))} of {len(cases)} not a one-line UserError: {report}"
    )


def test_the_mutants_are_deterministic_and_varied(real_ckpt: bytes) -> None:
    a, b = mutants(real_ckpt), mutants(real_ckpt)
    assert [d for _, d in a] == [d for _, d in b]
    assert len({d for _, d in a}) > 0.95 * len(a)


# ----------------------------------------------------------------------------- through the CLI


@pytest.fixture(scope="module")
def train_help(tmp_path_factory, good_run: Path) -> str:
    w = make_work(tmp_path_factory.mktemp("help"))
    return w.run(["train", "--help"]).out + w.run(["sample", "--help"]).out


def _latest(w: Work) -> Path:
    return (
        w.dir
        / "good"
        / "checkpoints"
        / (w.dir / "good" / "checkpoints" / "latest").read_text().strip()
    )


def _replace_latest(w: Work, data: bytes) -> Path:
    p = _latest(w)
    p.unlink()  # best.pt is a hard link to it: leave best alone
    p.write_bytes(data)
    return p


def _check_refused(
    w: Work, argv: list[str], help_text: str, may_run: bool = False
) -> None:
    before = w.state()
    res = w.run(argv, timeout=30)
    if may_run and res.rc == 0 and "Traceback" not in res.err:
        return
    root = str(w.dir.parent)
    problems = refusal_problems(
        res, tree_diff(before, w.state()).replace(root + "/", "")
    )
    advised = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", res.err)) - {"--"}
    unknown = sorted(f for f in advised if f not in help_text)
    if not problems and unknown:
        problems.append(
            f"the line advises {unknown}, which `gpt2-tui train/sample` does not have"
        )
    assert not problems, (
        f"{' '.join(argv)} -> {', '.join(problems)} | {res.summary().replace(root + '/', '')}"
    )


def _corrupt(real: bytes) -> dict[str, bytes]:
    rng = np.random.default_rng(5)
    members = _members(real)
    pkl = next(n for n in members if n.endswith("data.pkl"))
    return {
        "text": b"this is a text file, not a checkpoint\n",
        "random": rng.bytes(4096),
        "truncated-half": real[: len(real) // 2],
        "empty": b"",
        "no-data.pkl": _zip({k: v for k, v in members.items() if k != pkl}),
        "data.pkl-flipped": _zip(members | {pkl: _flip(rng, members[pkl], most=6)}),
        "central-dir-flipped": _flip(rng, real, len(real) - 2048, most=16),
    }


CORRUPT = [
    "text",
    "random",
    "truncated-half",
    "empty",
    "no-data.pkl",
    "data.pkl-flipped",
    "central-dir-flipped",
]


@pytest.mark.parametrize("how", ["sample-file", "resume-run"])
@pytest.mark.parametrize("name", CORRUPT)
def test_corrupt_checkpoint_through_the_cli(
    name, how, real_ckpt, good_run, tmp_path, train_help
) -> None:
    w = make_work(tmp_path, good_run)
    data = _corrupt(real_ckpt)[name]
    if how == "sample-file":
        (w.dir / "bad.pt").write_bytes(data)
        _check_refused(w, ["sample", "bad.pt", "--max-new-tokens", "3"], train_help)
    else:
        _replace_latest(w, data)
        _check_refused(w, ["train", "--resume", "good", "--max-steps", "4"], train_help)


def _edited(real: bytes) -> dict[str, tuple[dict, bool]]:
    """name -> (edits to the state dict; None value = delete the key, sample may accept it)."""
    state = torch.load(io.BytesIO(real), weights_only=True)
    first = next(iter(state["model"]))
    shape = tuple(state["model"][first].shape)
    return {
        "missing-model": ({"model": None}, False),
        "missing-optimizer": ({"optimizer": None}, True),
        "missing-step": ({"step": None}, True),
        "missing-config": ({"config": None}, False),
        "missing-rng": ({"rng": None}, True),
        "missing-data": ({"data": None}, True),
        "step-is-str": ({"step": "2"}, True),
        "step-negative": ({"step": -1}, True),
        "step-is-float-nan": ({"step": float("nan")}, True),
        "model-is-list": ({"model": [1, 2]}, False),
        "model-value-not-tensor": ({"model": {first: "weights"}}, False),
        "model-wrong-shape": (
            {"model": state["model"] | {first: torch.zeros(shape[0] + 1, *shape[1:])}},
            False,
        ),
        "model-missing-tensor": (
            {"model": {k: v for k, v in state["model"].items() if k != first}},
            False,
        ),
        "optimizer-is-str": ({"optimizer": "adam"}, True),
        "optimizer-param-groups-empty": (
            {"optimizer": {"state": {}, "param_groups": []}},
            True,
        ),
        "config-is-int": ({"config": 5}, False),
        "config-model-is-str": ({"config": state["config"] | {"model": "big"}}, False),
        "config-n-layer-wrong": (
            {
                "config": state["config"]
                | {"model": state["config"]["model"] | {"n_layer": 7}}
            },
            False,
        ),
        "rng-is-int": ({"rng": 5}, True),
        "rng-torch-garbage": (
            {"rng": state["rng"] | {"torch": torch.zeros(3, dtype=torch.uint8)}},
            True,
        ),
        "data-is-int": ({"data": 5}, True),
        "data-is-garbage-json": ({"data": "{not json"}, True),
        "not-a-dict": ({"__replace__": [1, 2, 3]}, False),
    }


EDITS = [
    "missing-model", "missing-optimizer", "missing-step", "missing-config", "missing-rng", "missing-data",
    "step-is-str", "step-negative", "step-is-float-nan", "model-is-list", "model-value-not-tensor",
    "model-wrong-shape", "model-missing-tensor", "optimizer-is-str", "optimizer-param-groups-empty",
    "config-is-int", "config-model-is-str", "config-n-layer-wrong", "rng-is-int", "rng-torch-garbage",
    "data-is-int", "data-is-garbage-json", "not-a-dict",
]  # fmt: skip


def _edit_bytes(real: bytes, name: str) -> tuple[bytes, bool]:
    edits, sample_may_run = _edited(real)[name]
    state = torch.load(io.BytesIO(real), weights_only=True)
    if "__replace__" in edits:
        state = edits["__replace__"]
    else:
        for k, v in edits.items():
            if v is None:
                del state[k]
            else:
                state[k] = v
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue(), sample_may_run


@pytest.mark.parametrize("how", ["sample-file", "resume-run"])
@pytest.mark.parametrize("name", EDITS)
def test_missing_or_wrong_typed_fields_through_the_cli(
    name, how, real_ckpt, good_run, tmp_path, train_help
) -> None:
    """--resume needs every field; sample needs the weights and config only (it may run when
    the optimizer/step/rng/data are missing or odd, but must not traceback)."""
    w = make_work(tmp_path, good_run)
    data, sample_may_run = _edit_bytes(real_ckpt, name)
    if how == "sample-file":
        (w.dir / "edited.pt").write_bytes(data)
        _check_refused(
            w,
            ["sample", "edited.pt", "--max-new-tokens", "3"],
            train_help,
            may_run=sample_may_run,
        )
    else:
        _replace_latest(w, data)
        _check_refused(w, ["train", "--resume", "good", "--max-steps", "4"], train_help,
                       may_run=name in RESUME_MAY_RUN)  # fmt: skip


# --resume takes the config from the run's config.toml: a checkpoint config of the right types
# but other values is not read there (sample reads it, and must refuse the mismatch)
RESUME_MAY_RUN = {"config-n-layer-wrong"}


def test_the_real_checkpoint_itself_samples_and_resumes(
    good_run: Path, tmp_path: Path
) -> None:
    """The control: unedited, both commands work (so the refusals above are the edits' doing)."""
    w = make_work(tmp_path, good_run)
    res = w.run(["sample", str(_latest(w)), "--max-new-tokens", "3"])
    assert res.rc == 0, res.summary()
    res = w.run(["train", "--resume", "good", "--max-steps", "4"])
    assert res.rc == 0, res.summary()
    shutil.rmtree(w.dir / "good")
