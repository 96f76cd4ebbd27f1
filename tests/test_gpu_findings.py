"""Issue 20, findings 4, 9 and 10: the CUDA branches of the device checks, the FSDP2 policy and
the estimator's budget, shown on CPU with the one torch/host call involved faked as a GPU box
answers it. (1-3, 5, 6, 8, 12, 13 are in test_gpu_path*.py; what only a GPU can show is in
docs/gpu/README.md.)"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig

import pytest
import torch

from engine import device
from engine.config import resolve

# ---------------------------------------------------------------- 4: Triton's compiler on CUDA


@pytest.fixture
def triton_here(monkeypatch):
    """A CUDA box with Triton installed (only its presence is asked)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    monkeypatch.delenv("CC", raising=False)
    device._compiler_problem.cache_clear()
    yield
    device._compiler_problem.cache_clear()


def test_4_triton_without_gcc_or_clang_is_one_line_naming_them(triton_here, monkeypatch):
    """Triton uses $CC, else gcc, else clang; plain `cc` does not count."""
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a: None if name in ("gcc", "clang") else real(name, *a))
    why = device.compile_reason(True) or ""
    assert "gcc" in why and "clang" in why and "$CC" in why and "\n" not in why, why


def test_4_triton_needs_python_headers_on_cuda_too(triton_here, monkeypatch, tmp_path):
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: real(*a, **k) | {"include": str(tmp_path)})
    monkeypatch.setenv("CC", shutil.which("python3") or "python3")  # a program that runs `--version`
    why = device.compile_reason(True) or ""
    assert "Python.h" in why and "CUDA" in why, why


def test_4_a_cc_from_the_environment_is_the_one_checked(triton_here, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    why = device.compile_reason(True) or ""
    assert "no-such-cc" in why and "$CC" in why, why
