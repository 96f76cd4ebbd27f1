"""Only what is ours is removed (issue 46, class A): a build's dead `.OUT.tmp-PID-SPACE-HEX`
directory is swept only when it is a directory this user owns, named in this host's and pid
namespace's space (a pid means our process only there) and its process is gone. Every other
entry of every pattern the product cleans is planted beside it and must survive untouched:
another user's (in a shared sticky directory, root included), another machine's or container's
on a shared volume, a link, a plain file, a live build, an older name without a space."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import files
from harness import tree_state


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _plant(d: Path) -> Path:
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"half a build")
    return d


@pytest.mark.slow  # starts a process (a pid that is surely dead)
@pytest.mark.parametrize("out_name", ["ds", "hf-out"])  # prepare's and export's --out: one name rule
def test_a_sweep_removes_only_its_own_dead_builds(tmp_path: Path, out_name: str) -> None:
    out, dead = tmp_path / out_name, _dead_pid()
    ours = _plant(files.build_dir_name(out, dead))
    keep = [
        _plant(files.build_dir_name(out)),  # a live build: this process
        _plant(tmp_path / ours.name.replace(files._pid_space(), "0123abcd")),  # another host's or container's
        _plant(tmp_path / f".{out_name}.tmp-{dead}-89abcdef"),  # an older name, no space: whose, unknown
        _plant(files.build_dir_name(tmp_path / "other", dead)),  # another output's
    ]
    target = _plant(tmp_path / "elsewhere")
    link = files.build_dir_name(out, dead)
    link.symlink_to(target, target_is_directory=True)  # a link named as ours: never followed nor removed
    plain = files.build_dir_name(out, dead)
    plain.write_bytes(b"not a directory")
    keep += [link, plain, target]
    if os.geteuid() == 0:  # root in a shared sticky directory: another user's dead build, named as ours
        theirs = _plant(files.build_dir_name(out, dead))
        os.chown(theirs, 12345, 12345)
        os.chown(theirs / "model.safetensors", 12345, 12345)
        keep.append(theirs)
    before = tree_state(*keep)
    files.sweep_dead_builds(out)
    assert not ours.exists()
    assert tree_state(*keep) == before
