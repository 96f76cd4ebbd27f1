"""Hostile input through the real `gpt2-tui` console script (issue 12): every subcommand,
a table of inputs that must be refused, plus a hypothesis property over `train`'s flags.

The bar, for every refused input: exit status 2, stderr exactly one non-empty line (no
traceback), and the file system exactly as it was: the working directory and the cache
(paths, file types, modes, sizes, mtimes in ns) are snapshotted before and after.

How the command is run: tests/harness.py's run_cli, a child forked from a warm interpreter
(its comment says why and how); `test_the_fork_runner_matches_the_real_console_script` checks
it agrees with the real console script; GPT2TUI_REAL_EXEC=1 runs every row as a plain
`.venv/bin/gpt2-tui` subprocess instead (slow).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import TRAIN_FAST, make_dataset_dir, make_work, refusal_problems, train_good_run, tree_diff

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

HUGE = str(2**63)  # does not fit an int64
SEED_HUGE = str(2**64)
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _shorten(text: str, root: str) -> str:
    return text.replace(root + "/", "").replace(root, ".")


@pytest.fixture(scope="session")
def good_run(tmp_path_factory) -> Path:
    return train_good_run(tmp_path_factory.mktemp("good"))


# ----------------------------------------------------------------------------- the table


@dataclass
class Case:
    id: str
    argv: list[str]
    setup: Callable[[Path], Callable[[], None] | None] | None = (
        None  # may return a cleanup
    )
    may_run: bool = False  # running cleanly (exit 0, no traceback) is also acceptable
    mention: tuple[
        str, ...
    ] = ()  # the line must mention one of these (case-insensitive)
    avoid: tuple[str, ...] = ()  # ... and none of these
    root_bypasses: bool = False  # a permission case: root reads/writes anyway
    watch: tuple[
        str, ...
    ] = ()  # outside paths whose top level must not change (e.g. "/")
    timeout: float = 6  # a refusal takes ~0.3 s here; a hang or a run that should not start is a failure


def _write(rel: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)

    return setup


def _both(*setups: Callable[[Path], object]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for s in setups:
            s(d)

    return setup


def _symlink_loop(name: str = "loop") -> Callable[[Path], None]:
    return lambda d: os.symlink(name, d / name)


def _user_dir(d: Path) -> None:
    """A directory that is not a run, holding the user's own tokenizer.json and a checkpoint."""
    (d / "mine" / "checkpoints").mkdir(parents=True)
    (d / "mine" / "tokenizer.json").write_text('{"mine": true}\n')
    (d / "mine" / "checkpoints" / "step_000001.pt").write_bytes(
        b"my precious weights\n"
    )


def _chmod(rel: str, mode: int) -> Callable[[Path], Callable[[], None]]:
    def setup(d: Path) -> Callable[[], None]:
        p = d / rel
        p.mkdir(exist_ok=True) if not p.exists() else None
        os.chmod(p, mode)
        return lambda: os.chmod(p, 0o755)

    return setup


def _immutable_dir(d: Path) -> Callable[[], None]:
    """A directory nobody can write in, root included (chattr +i); skip where chattr fails."""
    p = d / "ro"
    p.mkdir()
    if (
        subprocess.run(
            ["chattr", "+i", str(p)], capture_output=True, check=False
        ).returncode
        != 0
    ):
        pytest.skip("chattr +i is not available here")
    return lambda: subprocess.run(
        ["chattr", "-i", str(p)], capture_output=True, check=False
    )


def _dataset(name: str, **sidecar) -> Callable[[Path], None]:
    return lambda d: make_dataset_dir(d / name, **sidecar)


def _train_bin_is_dir(d: Path) -> None:
    make_dataset_dir(d / "dsdir")
    (d / "dsdir" / "train.bin").unlink()
    (d / "dsdir" / "train.bin").mkdir()


def _tokenizer_is_dir(d: Path) -> None:
    make_dataset_dir(d / "dstokdir", tokenizer="tok")
    (d / "dstokdir" / "tok").mkdir()


def _unreadable(rel_ds: str, member: str) -> Callable[[Path], Callable[[], None]]:
    def setup(d: Path) -> Callable[[], None]:
        make_dataset_dir(d / rel_ds)
        p = d / rel_ds / member
        os.chmod(p, 0)
        return lambda: os.chmod(p, 0o644)

    return setup


def _empty_train(d: Path) -> None:
    make_dataset_dir(d / "dsempty")
    (d / "dsempty" / "train.bin").write_bytes(b"")


def _config_from_good(rel: str, **edits: str) -> Callable[[Path], None]:
    """good/config.toml with top-level or section keys replaced (edits: 'section.key' -> TOML value)."""

    def setup(d: Path) -> None:
        text = (d / "good" / "config.toml").read_text()
        for dotted, value in edits.items():
            section, _, key = dotted.rpartition(".")
            pattern = rf"(?m)^{re.escape(key)} = .*$"
            if section:
                head = text.index(f"[{section}]")
                tail = text.find("\n[", head + 1)
                tail = len(text) if tail < 0 else tail
                text = (
                    text[:head]
                    + re.sub(pattern, f"{key} = {value}", text[head:tail], count=1)
                    + text[tail:]
                )
            else:
                text = re.sub(pattern, f"{key} = {value}", text, count=1)
        (d / rel).write_text(text)

    return setup


def _corrupt_latest(d: Path) -> None:
    latest = (d / "good" / "checkpoints" / "latest").read_text().strip()
    p = d / "good" / "checkpoints" / latest
    p.unlink()  # best.pt is a hard link to it: keep best intact
    p.write_bytes(b"PK\x03\x04 not really a checkpoint\n")


BAD_TOML = {
    "syntax": "[model\nn_layer = 2\n",
    "unknown-key": "[model]\nn_layers = 2\n",
    "wrong-type": '[optim]\nlr = "fast"\n',
    "lr-nan": "[optim]\nlr = nan\n",
    "lr-inf": "[optim]\nlr = inf\n",
    "negative-steps": "[train]\nmax_steps = -5\n",
    "seed-2**64": f"[train]\nseed = {SEED_HUGE}\n",
    "seed-negative": "[train]\nseed = -1\n",
    "section-is-array": "model = [1, 2]\n",
    "binary": bytes(range(256)) * 4,
    "deep-nesting": "a = " + "[" * 5000 + "]" * 5000 + "\n",
    "device-cuda": '[speed]\ndevice = "cuda"\n',
}


# What each row starts from; each runs cleanly as it is (test_the_base_commands_run), so a
# refusal is the hostile part's doing.
BASES = {
    "train": ["train", *TRAIN_FAST, "--data", "ds", "--out", "run"],
    "sample": ["sample", "good", "--max-new-tokens", "3"],
    "prepare": ["prepare", "text", "--out", "newds"],
    "estimate": ["estimate", "--preset", "micro", "--data", "ds", "--device", "cpu"],
    "bench": ["bench", "--plain", "--rounds", "1", "--preset", "micro", "--data", "ds", "--device", "cpu",
              "--steps", "1", "--warmup", "1", "--out", "benchout"],  # the ladder takes 90 s even at micro
    "bench-data": ["bench-data", "--data", "ds", "--batch-size", "2", "--block-size", "8", "--iters", "1",
                   "--warmup", "0"],
}  # fmt: skip


def _cases() -> list[Case]:
    T = ["train", *TRAIN_FAST, "--data", "ds"]
    TR = BASES["train"]
    C: list[Case] = []
    add = C.append

    # --- train: set-up errors (issue 12 items 2, 7)
    add(Case("train/device-cuda", [*TR, "--device", "cuda"], mention=("cuda", "gpu")))
    add(Case("train/device-mps", [*TR, "--device", "mps"]))
    add(Case("train/seed=-1", [*TR, "--seed", "-1"], mention=("seed",)))
    add(Case("train/seed=2**64", [*TR, "--seed", SEED_HUGE], mention=("seed",)))
    add(Case("train/seed=2**32", [*TR, "--seed", str(2**32)], may_run=True))
    for v in ("inf", "nan", "-inf", "1e309", "0", "-1"):
        add(Case(f"train/lr={v}", [*TR, "--lr", v], mention=("lr", "learning rate")))
    for v in ("nan", "inf", "-1"):
        add(Case(f"train/min-lr={v}", [*TR, "--min-lr", v]))
    for flag, values in {"--dropout": ("nan", "1", "-0.5"), "--beta1": ("nan", "1", "-0.1"),
                         "--beta2": ("nan", "1.5"), "--weight-decay": ("nan", "inf", "-1"),
                         "--grad-clip": ("nan", "-1")}.items():  # fmt: skip
        for v in values:
            add(Case(f"train/{flag[2:]}={v}", [*TR, flag, v]))
    add(Case("train/grad-clip=inf", [*TR, "--grad-clip", "inf"], may_run=True))
    for v in ("0", "-1", "nan", "inf"):
        add(Case(f"train/eps={v}", [*TR, "--eps", v]))
    add(Case("train/sample-tokens=-1", [*TR, "--sample-tokens", "-1"]))
    add(Case(f"train/sample-tokens={HUGE}", [*TR, "--sample-tokens", HUGE]))

    # every int flag: 0, -1, and a value past int64
    strict_huge = {"--n-layer", "--n-head", "--n-embd", "--context", "--vocab-size", "--batch-size",
                   "--block-size", "--grad-accum", "--max-steps", "--eval-batches"}  # fmt: skip
    lenient_huge = {"--decay-steps", "--eval-interval", "--log-interval", "--ckpt-interval", "--keep-last",
                    "--max-bad-steps"}  # fmt: skip
    for flag in sorted(strict_huge | lenient_huge):
        for v in ("0", "-1", HUGE):
            add(Case(f"train/{flag[2:]}={v}", [*TR, flag, v], may_run=(v == HUGE and flag in lenient_huge)))
    add(Case("train/warmup-steps=-1", [*TR, "--warmup-steps", "-1"]))
    add(Case("train/nproc=0", [*TR, "--nproc", "0"]))
    add(Case("train/nproc=-1", [*TR, "--nproc", "-1"]))
    add(Case("train/n-embd-not-divisible", [*TR, "--n-head", "3", "--n-embd", "32"]))
    add(Case("train/block>context", [*TR, "--block-size", "64", "--context", "32"]))
    add(Case("train/vocab<data", [*TR, "--vocab-size", "8"]))

    # --- train --out (item 3)
    add(Case("train/out=non-run-dir-with-user-files", [*T, "--out", "mine"], setup=_user_dir))
    add(Case("train/out=dir-with-a-file", [*T, "--out", "somedir"], setup=_write("somedir/keep.txt", "keep\n")))
    add(Case("train/out=/", [*T, "--out", "/"], watch=("/",)))
    add(Case("train/out=under-a-file", [*T, "--out", "notes.txt/run"]))
    add(Case("train/out=a-file", [*T, "--out", "notes.txt"]))
    add(Case("train/out=/proc/x", [*T, "--out", "/proc/x"]))
    add(Case("train/out=read-only-dir(0555)", [*T, "--out", "ro/run"], setup=_chmod("ro", 0o555), root_bypasses=True))
    add(Case("train/out=immutable-dir(chattr+i)", [*T, "--out", "ro/run"], setup=_immutable_dir))
    add(Case("train/out=symlink-loop", [*T, "--out", "loop"], setup=_symlink_loop()))
    add(
        Case(
            "train/config-out_dir=/",
            ["train", "--config", "c.toml"],
            setup=_config_from_good(
                "c.toml", out_dir='"/"', **{"train.max_steps": "1"}
            ),
            watch=("/",),
        )
    )

    # --- train --resume
    add(
        Case("train/resume=non-run-dir", ["train", "--resume", "mine"], setup=_user_dir)
    )
    add(Case("train/resume=FILE(text)", ["train", "--resume", "notes.txt"]))
    add(Case("train/resume=missing", ["train", "--resume", "nothere"]))
    add(Case("train/resume+out", ["train", "--resume", "good", "--out", "other"]))
    add(Case("train/resume+device-cuda", ["train", "--resume", "good", "--device", "cuda", "--max-steps", "4"],
             mention=("cuda", "gpu")))  # fmt: skip
    add(Case("train/resume+seed=-1", ["train", "--resume", "good", "--seed", "-1", "--max-steps", "4"]))
    add(Case("train/resume+lr=nan", ["train", "--resume", "good", "--lr", "nan", "--max-steps", "4"]))
    add(Case("train/resume-corrupt-latest", ["train", "--resume", "good", "--max-steps", "4"], setup=_corrupt_latest))
    add(Case("train/resume-config-garbage", ["train", "--resume", "good"],
             setup=_write("good/config.toml", b"\x00\xff garbage [[[")))  # fmt: skip

    # --- train --data (items 6, 7, 8)
    add(Case("train/data=tokenizer-../../etc/passwd", [*TR[:-4], "--data", "evil", "--out", "run"],
             setup=_dataset("evil", tokenizer="../../../../../../../../etc/passwd")))  # fmt: skip
    add(Case("train/data=tokenizer-/etc/passwd", [*TR[:-4], "--data", "evil", "--out", "run"],
             setup=_dataset("evil", tokenizer="/etc/passwd")))  # fmt: skip
    TD = ["train", *TRAIN_FAST, "--out", "run", "--data"]
    add(Case("train/data=symlink-loop", [*TD, "loop"], setup=_symlink_loop(), mention=("loop", "symbolic", "symlink")))
    add(Case("train/data=missing", [*TD, "nothere"]))
    add(Case("train/data=text-file", [*TD, "notes.txt"]))
    add(Case("train/data=empty-dir", [*TD, "empty"], setup=lambda d: (d / "empty").mkdir()))
    add(Case("train/data=train.bin-is-a-dir", [*TD, "dsdir"], setup=_train_bin_is_dir))
    add(Case("train/data=tokenizer-is-a-dir", [*TD, "dstokdir"], setup=_tokenizer_is_dir))
    add(Case("train/data=empty-train.bin", [*TD, "dsempty"], setup=_empty_train))
    add(Case("train/data=sidecar-garbage", [*TD, "dsg"],
             setup=_both(_dataset("dsg"), _write("dsg/dataset.json", "{oops"))))  # fmt: skip
    add(Case("train/data=sidecar-negative-vocab", [*TD, "dsv"],
             setup=_both(_dataset("dsv"), _write("dsv/dataset.json", json.dumps(
                 {"format": "gpt2-tui", "version": 1, "dtype": "uint16", "vocab_size": -5, "train_tokens": 20000,
                  "val_tokens": 4000, "tokenizer": None, "eot_id": None})))))  # fmt: skip
    add(Case("train/data=unreadable-train.bin(000)", [*TD, "dsu"], setup=_unreadable("dsu", "train.bin"),
             root_bypasses=True))  # fmt: skip
    add(Case("train/data=unreadable-tokenizer(000)", [*TD, "dsu"], setup=_unreadable("dsu", "tokenizer.json"),
             root_bypasses=True))  # fmt: skip

    # --- train --config / --preset
    for name, text in BAD_TOML.items():
        add(Case(f"train/config={name}", ["train", "--config", "bad.toml", "--data", "ds", "--out", "run",
                                          "--preset", "micro"], setup=_write("bad.toml", text)))  # fmt: skip
    add(Case("train/config=missing", ["train", "--config", "nothere.toml", "--out", "run"]))
    add(Case("train/config=a-dir", ["train", "--config", "text", "--out", "run"]))
    add(Case("train/preset=unknown", ["train", "--preset", "huge-model", "--out", "run"]))
    add(Case("train/preset=/etc/passwd.toml-like", ["train", "--preset", "notes.toml", "--out", "run"],
             setup=_write("notes.toml", "root:x:0:0:root:/root:/bin/bash\n")))  # fmt: skip

    # --- sample (items 7, 8)
    add(Case("sample/checkpoint=text-file", ["sample", "notes.txt"]))
    add(Case("sample/checkpoint=random-bytes", ["sample", "rand.pt"],
             setup=_write("rand.pt", np.random.default_rng(7).bytes(4096))))  # fmt: skip
    add(Case("sample/checkpoint=zip-magic-garbage", ["sample", "z.pt"],
             setup=_write("z.pt", b"PK\x03\x04" + bytes(300))))  # fmt: skip
    add(Case("sample/temperature=nan", ["sample", "good", "--temperature", "nan"], mention=("temperature",)))
    add(Case("sample/temperature=-1", ["sample", "good", "--temperature", "-1"]))
    add(Case("sample/temperature=0", ["sample", "good", "--temperature", "0"]))
    add(Case("sample/device=cuda", ["sample", "good", "--device", "cuda"], mention=("cuda", "gpu"), avoid=("corrupt",)))
    add(Case("sample/device=bogus", ["sample", "good", "--device", "tpu"]))
    for flag, values in {
        "--max-new-tokens": ("0", "-1", HUGE),
        "--top-k": ("0", "-1"),
    }.items():
        for v in values:
            add(Case(f"sample/{flag[2:]}={v}", ["sample", "good", flag, v]))
    add(Case(f"sample/top-k={HUGE}", ["sample", "good", "--top-k", HUGE, "--max-new-tokens", "3"], may_run=True))
    add(Case("sample/seed=2**64", ["sample", "good", "--seed", SEED_HUGE, "--max-new-tokens", "3"]))
    add(Case("sample/seed=-1", ["sample", "good", "--seed", "-1", "--max-new-tokens", "3"], may_run=True))
    add(
        Case("sample/tokenizer=garbage", ["sample", "good", "--tokenizer", "notes.txt"])
    )
    add(Case("sample/tokenizer=missing", ["sample", "good", "--tokenizer", "nothere.json"]))
    add(Case("sample/tokenizer=a-dir", ["sample", "good", "--tokenizer", "text"]))
    add(Case("sample/path=missing", ["sample", "nothere"]))
    add(Case("sample/path=non-run-dir", ["sample", "mine"], setup=_user_dir))
    add(Case("sample/path=symlink-loop", ["sample", "loop"], setup=_symlink_loop(),
             mention=("loop", "symbolic", "symlink")))  # fmt: skip
    add(Case("sample/run-with-corrupt-latest", ["sample", "good"], setup=_corrupt_latest))

    # --- prepare
    P = BASES["prepare"]
    for flag, values in {"--seed": ("-1", SEED_HUGE), "--vocab-size": ("0", "-1", "10", HUGE),
                         "--val-fraction": ("nan", "inf", "-0.1", "1.5", "1", "0")}.items():  # fmt: skip
        for v in values:
            add(Case(f"prepare/{flag[2:]}={v}", [*P, flag, v], may_run=(flag, v) == ("--val-fraction", "0")))
    add(Case("prepare/out=non-empty-dir", ["prepare", "text", "--out", "mine"], setup=_user_dir))
    add(Case("prepare/out=/", ["prepare", "text", "--out", "/"], watch=("/",)))
    add(Case("prepare/out=under-a-file", ["prepare", "text", "--out", "notes.txt/x"]))
    add(Case("prepare/out=/proc/x", ["prepare", "text", "--out", "/proc/x"]))
    add(Case("prepare/out=immutable-dir", ["prepare", "text", "--out", "ro/x"], setup=_immutable_dir))
    add(Case("prepare/input=missing", ["prepare", "nothere", "--out", "newds"]))
    add(Case("prepare/input=symlink-loop", ["prepare", "loop", "--out", "newds"], setup=_symlink_loop()))
    add(Case("prepare/input=empty-dir", ["prepare", "empty", "--out", "newds"], setup=lambda d: (d / "empty").mkdir()))
    add(Case("prepare/input=binary-only", ["prepare", "bin", "--out", "newds"],
             setup=_write("bin/x.dat", np.random.default_rng(3).bytes(5000))))  # fmt: skip
    add(Case("prepare/tokenizer=garbage", ["prepare", "text", "--out", "newds", "--tokenizer", "notes.txt"]))
    add(Case("prepare/tokenizer=missing", ["prepare", "text", "--out", "newds", "--tokenizer", "nothere.json"]))
    add(Case("prepare/tokenizer=a-dir", ["prepare", "text", "--out", "newds", "--tokenizer", "text"]))

    # --- estimate
    E = BASES["estimate"]
    for v in ("0", "-1", HUGE):
        add(Case(f"estimate/world-size={v}", [*E, "--world-size", v]))
    for v in ("abc", "-1GiB", "0", "nanGiB", "1e400GiB"):
        add(Case(f"estimate/device-memory={v}", [*E, "--device-memory", v]))
    add(Case("estimate/n-layer=0", [*E, "--n-layer", "0"]))
    add(Case("estimate/batch-size=-1", [*E, "--batch-size", "-1"]))
    add(Case("estimate/lr=nan", [*E, "--lr", "nan"]))
    add(Case(f"estimate/context={HUGE}", [*E, "--context", HUGE]))
    add(Case("estimate/data=symlink-loop", [*E[:3], "--data", "loop"], setup=_symlink_loop()))
    add(Case("estimate/data=tokenizer-/etc/passwd", [*E[:3], "--data", "evil"], may_run=True,
             setup=_dataset("evil", tokenizer="/etc/passwd")))  # fmt: skip
    add(Case("estimate/preset=unknown", ["estimate", "--preset", "nope"]))
    for name in ("syntax", "lr-nan", "deep-nesting", "binary"):
        add(Case(f"estimate/config={name}", ["estimate", "--config", "bad.toml"],
                 setup=_write("bad.toml", BAD_TOML[name])))  # fmt: skip

    # --- bench
    B = BASES["bench"]
    for flag, values in {"--steps": ("0", "-1", HUGE), "--warmup": ("-1", HUGE), "--vocab-size": ("0", "-1", HUGE),
                         "--batch-size": ("0", "-1", HUGE), "--block-size": ("0", "-1", HUGE),
                         "--grad-accum": ("0", "-1", HUGE), "--log-interval": ("0", "-1")}.items():  # fmt: skip
        for v in values:
            add(Case(f"bench/{flag[2:]}={v}", [*B, flag, v]))
    for v in ("0", "-1", HUGE):
        add(Case(f"bench/rounds={v}", [*B, "--rounds", v]))
    add(Case("bench/device=cuda", [*B, "--device", "cuda"], mention=("cuda", "gpu")))
    add(Case("bench/out=non-empty-dir", [*B, "--out", "mine"], setup=_user_dir))
    add(Case("bench/out=a-file", [*B, "--out", "notes.txt"]))
    add(Case("bench/out=/proc/x", [*B, "--out", "/proc/x"]))
    add(Case("bench/data=missing", [*B, "--data", "nothere"]))
    add(Case("bench/data=symlink-loop", [*B, "--data", "loop"], setup=_symlink_loop()))
    BL = [
        "bench",
        "--preset",
        "micro",
        "--data",
        "ds",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--out",
        "benchout",
    ]
    add(Case("bench/best-batch-sizes=garbage", [*BL, "--best", "--batch-sizes", "a,b"]))
    add(Case("bench/best-compile-modes=bogus", [*BL, "--best", "--compile-modes", "warp-speed"]))
    add(Case("bench/ladder-steps=0", [*BL, "--steps", "0"]))
    add(Case("bench/config=syntax", ["bench", "--config", "bad.toml", "--out", "benchout"],
             setup=_write("bad.toml", BAD_TOML["syntax"])))  # fmt: skip
    add(
        Case("bench/preset=unknown", ["bench", "--preset", "nope", "--out", "benchout"])
    )

    # --- bench-data (its own parser)
    BD = BASES["bench-data"]
    for flag, values in {"--batch-size": ("0", "-1", HUGE), "--block-size": ("0", "-1", HUGE, "30000"),
                         "--iters": ("0", "-1", HUGE), "--warmup": ("-1", HUGE), "--seed": ("-1", SEED_HUGE),
                         "--vocab-size": ("0", "-1", HUGE)}.items():  # fmt: skip
        for v in values:
            add(Case(f"bench-data/{flag[2:]}={v}", [*BD, flag, v]))
    add(Case("bench-data/batch-size=abc", [*BD, "--batch-size", "abc"]))
    add(Case("bench-data/unknown-flag", [*BD, "--bogus"]))
    add(Case("bench-data/data=missing", [*BD, "--data", "nothere"]))
    add(Case("bench-data/data=symlink-loop", [*BD, "--data", "loop"], setup=_symlink_loop()))
    add(Case("bench-data/data=tokenizer-../etc/passwd", [*BD, "--data", "evil"],
             setup=_dataset("evil", tokenizer="../../../../../../../../etc/passwd")))  # fmt: skip

    # --- attach: must fail before a screen opens
    add(Case("attach/missing", ["attach", "nothere"]))
    add(Case("attach/a-file", ["attach", "notes.txt"]))
    add(Case("attach/non-run-dir", ["attach", "mine"], setup=_user_dir))
    add(Case("attach/config-garbage", ["attach", "good"], setup=_write("good/config.toml", b"\xff\xfe[[[")))
    add(Case("attach/config-invalid", ["attach", "good"], setup=_write("good/config.toml", "[optim]\nlr = -1\n")))
    add(Case("attach/symlink-loop", ["attach", "loop"], setup=_symlink_loop()))
    add(Case("attach/no-run-dir-arg", ["attach"]))

    # --- toggle, compare, runs: read-only on what they are given; toggle writes only to a live run
    for cmd in ("toggle", "compare"):
        extra = ["--compile"] if cmd == "toggle" else []
        add(Case(f"{cmd}/missing", [cmd, "nothere", *extra], mention=("does not exist",)))
        add(Case(f"{cmd}/a-file", [cmd, "notes.txt", *extra], mention=("is a file",)))
        add(Case(f"{cmd}/non-run-dir", [cmd, "mine", *extra], setup=_user_dir))
        add(Case(f"{cmd}/symlink-loop", [cmd, "loop", *extra], setup=_symlink_loop()))
        add(Case(f"{cmd}/no-run-dir-arg", [cmd]))
    add(Case("compare/one-good-one-missing", ["compare", "good", "nothere"], mention=("nothere",)))
    add(Case("compare/events-garbage", ["compare", "good"], setup=_write("good/events.jsonl", b"\xff\xfe[[[\n")))
    add(Case("toggle/no-switch", ["toggle", "good"], mention=("switch",)))
    add(Case("toggle/not-a-switch", ["toggle", "good", "--lr", "1"]))
    add(Case("toggle/finished-run", ["toggle", "good", "--compile"], mention=("resume",)))
    for v in ("0", "-1", HUGE):
        add(Case(f"toggle/batch-size={v}", ["toggle", "good", "--batch-size", v], mention=("batch_size",)))
    add(Case("toggle/grad-accum=0", ["toggle", "good", "--grad-accum", "0"], mention=("grad_accum",)))
    add(Case("toggle/precision=fp64", ["toggle", "good", "--precision", "fp64"]))
    add(Case("runs/missing", ["runs", "nothere"], mention=("not a directory",)))
    add(Case("runs/a-file", ["runs", "notes.txt"], mention=("not a directory",)))

    # --- the bare TUI with --config: must fail before a screen opens
    for name in ("syntax", "unknown-key", "lr-nan", "binary", "deep-nesting"):
        add(Case(f"tui/config={name}", ["--config", "bad.toml"], setup=_write("bad.toml", BAD_TOML[name])))
    add(Case("tui/config=missing", ["--config", "nothere.toml"]))
    add(Case("tui/config=a-dir", ["--config", "text"]))

    # --- argument syntax
    add(Case("cli/unknown-subcommand", ["fly"]))
    add(Case("train/unknown-flag", [*TR, "--warp"]))
    add(Case("train/lr=abc", [*TR, "--lr", "abc"]))
    return C


CASES = _cases()
RUN_FILES = ("config.toml", "events.jsonl", "checkpoints", "tokenizer.json", "writer.pid", "dataset.json",
             "train.bin", "val.bin", "meta.json")  # fmt: skip


def _top(paths: tuple[str, ...]) -> dict[str, set[str]]:
    return {p: set(os.listdir(p)) for p in paths}


def check_case(case: Case, tmp_path: Path, good: Path) -> None:
    if case.root_bypasses and IS_ROOT:
        pytest.skip(
            "running as root: permissions do not stop root (see the chattr +i case)"
        )
    w = make_work(tmp_path, good)
    cleanup = case.setup(w.dir) if case.setup else None
    try:
        before, top_before = w.state(), _top(case.watch)
        res = w.run(case.argv, timeout=30 if case.may_run else case.timeout)
        after, top_after = w.state(), _top(case.watch)
    finally:
        if callable(cleanup):
            cleanup()
        for p in case.watch:  # a run written into / (or the like): take it away again
            for name in _top((p,))[p] - top_before.get(p, set()):
                if name in RUN_FILES:
                    target = Path(p) / name
                    shutil.rmtree(
                        target
                    ) if target.is_dir() and not target.is_symlink() else target.unlink()
    change = tree_diff(before, after)
    for p in case.watch:
        if top_after[p] != top_before[p]:
            change += f"; {p} gained {sorted(top_after[p] - top_before[p])}"
    change = _shorten(change, str(tmp_path))
    problems = refusal_problems(res, change)
    if case.may_run and res.rc == 0 and "Traceback" not in res.err + res.out:
        return
    msg = res.err.strip().lower()
    if not problems and case.mention and not any(m in msg for m in case.mention):
        problems.append(f"the line names none of {case.mention}")
    if not problems and any(a in msg for a in case.avoid):
        problems.append(f"the line says {case.avoid}")
    assert not problems, (
        f"{' '.join(case.argv)} -> {', '.join(problems)} | {_shorten(res.summary(), str(tmp_path))}"
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_in_one_line_and_writes_nothing(
    case: Case, tmp_path: Path, good_run: Path
) -> None:
    check_case(case, tmp_path, good_run)


def test_the_table_covers_every_subcommand() -> None:
    firsts = {c.argv[0] for c in CASES}
    assert {
        "train",
        "estimate",
        "prepare",
        "sample",
        "bench",
        "bench-data",
        "attach",
        "--config",
    } <= firsts


@pytest.mark.parametrize("name", sorted(BASES))
def test_the_base_commands_run(name: str, tmp_path: Path, good_run: Path) -> None:
    w = make_work(tmp_path, good_run)
    res = w.run(BASES[name], timeout=60)
    assert res.rc in ((0, 1) if name == "estimate" else (0,)), res.summary()
    assert "Traceback" not in res.err


def test_the_fork_runner_matches_the_real_console_script(
    tmp_path: Path, good_run: Path
) -> None:
    """The same refusals, forked from the warm runner and exec'd for real, agree."""
    for i, argv in enumerate((["train", "--lr", "abc"], ["sample", "nothere"],
                              ["train", *TRAIN_FAST, "--data", "ds", "--out", "good"])):  # fmt: skip
        w = make_work(tmp_path / str(i), good_run)
        fork, real = w.run(argv, real=False), w.run(argv, real=True)
        assert (fork.rc, fork.err) == (real.rc, real.err), (
            fork.summary(),
            real.summary(),
        )
        assert fork.rc == 2


# ----------------------------------------------------------------------------- hypothesis


def _help_flags(text: str) -> dict[str, list[str] | None]:
    """{flag: choices, or [] when it takes a free value, or None for a switch} from --help."""
    flags: dict[str, list[str] | None] = {}
    body = text.split("options:", 1)[1]
    for m in re.finditer(r"^\s{2}(-[^\n]*?)(?:\s{2,}|\n)", body, re.MULTILINE):
        spec = m.group(1)
        for part in spec.split(", "):
            bits = part.split(" ", 1)
            flag = bits[0]
            if not flag.startswith("--"):
                continue
            if len(bits) == 1:
                flags[flag] = None
            elif bits[1].startswith("{"):
                flags[flag] = bits[1].strip("{}").split(",")
            else:
                flags[flag] = []
    return flags


@pytest.fixture(scope="module")
def train_flags(tmp_path_factory) -> dict[str, list[str] | None]:
    base = tmp_path_factory.mktemp("help")
    w = make_work(base)
    res = w.run(["train", "--help"])
    assert res.rc == 0, res.summary()
    flags = _help_flags(res.out)
    assert {"--lr", "--seed", "--out", "--device", "--max-steps", "--no-bias"} <= set(
        flags
    ), sorted(flags)
    return flags


# never drawn: --help prints and exits; --nproc launches torchrun (slow; huge N = a fork bomb);
# --compile takes minutes on CPU; --headless changes nothing headless
SKIP_FLAGS = {"--help", "--nproc", "--compile", "--headless"}
HOSTILE = ["-1", "0", "nan", "inf", "-inf", "1e309", HUGE, SEED_HUGE, "abc", "", " ", "1e-320", "٣", "0x10",
           "1_000", "/", "/proc/x", "notes.txt", "notes.txt/x", "loop", "mine", "good", "../../../../etc/passwd",
           "-", "--", "\u202e", "a" * 300]  # fmt: skip
SMALL = ["1", "2", "3", "4", "8", "16", "0.5", "1e-3", "0.99", "micro", "ds"]


@st.composite
def _argvs(draw, flags: dict[str, list[str] | None]) -> list[str]:
    names = sorted(
        f for f in flags if f not in SKIP_FLAGS and not f.startswith("--no-compile")
    )
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
    argv = ["train", "--preset", "micro", "--data", "ds", "--device", "cpu", "--out", "run",
            "--max-steps", "1", "--eval-batches", "1"]  # fmt: skip
    for flag in chosen:
        kind = flags[flag]
        if kind is None:
            argv.append(flag)
            continue
        pool = st.sampled_from(kind) if kind else st.sampled_from(SMALL)
        value = draw(st.one_of(pool, st.sampled_from(HOSTILE), st.integers(-(2**70), 2**70).map(str),
                               st.floats(allow_nan=True, allow_infinity=True).map(repr)))  # fmt: skip
        argv.append(f"{flag}={value}" if value.startswith("-") else flag)
        if not value.startswith("-"):
            argv.append(value)
    return argv


@pytest.fixture(scope="module")
def prop_base(tmp_path_factory, good_run) -> Path:
    return tmp_path_factory.mktemp("props")


def test_random_train_argv_runs_or_is_refused_cleanly(
    train_flags, prop_base: Path, good_run: Path
) -> None:
    counter = iter(range(10**6))
    seen: dict[str, int] = {}

    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(_argvs(train_flags))
    def prop(argv: list[str]) -> None:
        base = prop_base / str(next(counter))
        w = make_work(base, good_run)
        (w.dir / "mine").mkdir()
        (w.dir / "mine" / "keep.txt").write_text("keep\n")
        os.symlink("loop", w.dir / "loop")
        before = w.state()
        top = _top(("/",))
        res = w.run(argv, timeout=60)
        for name in (
            _top(("/",))["/"] - top["/"]
        ):  # trained into / : clean it up, report it
            if name in RUN_FILES:
                t = Path("/") / name
                shutil.rmtree(t) if t.is_dir() else t.unlink()
        outcome = (
            "ran" if res.rc == 0 else "refused" if res.rc == 2 else f"exit {res.rc}"
        )
        seen[outcome] = seen.get(outcome, 0) + 1
        shown = _shorten(f"{argv[13:]} -> {res.summary()}", str(base))
        print(shown)
        if res.rc == 0:
            assert "Traceback" not in res.err + res.out, shown
        else:
            change = _shorten(tree_diff(before, w.state()), str(base))
            problems = refusal_problems(res, change)
            assert not problems, f"{shown} | {', '.join(problems)}"
        shutil.rmtree(base, ignore_errors=True)

    prop()
    print(f"random train argv outcomes: {seen}")
    assert seen.get("refused", 0) >= 3, (
        seen
    )  # the strategy must reach the checks, not only run
