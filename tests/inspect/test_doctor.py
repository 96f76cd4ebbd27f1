"""`gpt2-tui doctor` on CPU: the table, --json, and a missing piece named in one line (issue 20).

The real command through the real CLI; the short runs are real micro runs on this CPU. A
missing compiler is simulated the way a box lacks one: $CXX names a program that is not there.
"""

from __future__ import annotations

import json

import pytest

from engine import device
from engine.cli import main
from harness import force_cpu_native


@pytest.fixture(autouse=True)
def _fresh_compiler_checks():
    device._compiler_problem.cache_clear()
    yield
    device._compiler_problem.cache_clear()


@pytest.mark.slow
def test_doctor_on_cpu_exits_0_with_its_table(capsys):
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].split()[:3] == ["section", "check", "status"]
    for check in ("torch", "torch.compile", "Python.h", "compile cache", "CUDA", "eager fp32", "bf16 autocast",
                  "fp16 + GradScaler", "fused AdamW", "pinned + prefetch"):  # fmt: skip
        assert any(line.split("  ")[1:2] and check in line for line in out.splitlines()), (check, out)
    runs = [line for line in out.splitlines() if line.startswith("runs")]
    assert any("eager fp32" in line and " ok " in line for line in runs), runs
    assert any("pinned + prefetch" in line and "needs a GPU" in line for line in runs), runs  # says what needs one
    assert out.rstrip().endswith("no problems found")


def test_doctor_json_parses_and_names_a_missing_compiler_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    code = main(["doctor", "--json", "--no-runs"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["ok"] is False
    compile_row = next(r for r in data["rows"] if r["name"] == "torch.compile")
    assert compile_row["status"] == "problem" and compile_row["fix"]
    [problem] = data["problems"]
    assert "no-such-g++" in problem and "fix:" in problem and "\n" not in problem
    assert {"section", "name", "status", "detail", "fix", "seconds"} <= set(data["rows"][0])


def test_doctor_table_lists_each_problem_with_its_fix(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    assert main(["doctor", "--no-runs"]) == 1
    lines = capsys.readouterr().out.splitlines()
    problems = [line for line in lines if line.startswith("problem: ")]
    assert len(problems) == 1 and "no-such-g++" in problems[0] and "fix:" in problems[0], lines


@pytest.mark.slow
def test_doctor_says_when_this_cpu_emulates_bf16(monkeypatch):
    """Issue 22 item 10: a CPU whose torch probes say no avx512_bf16 and no AMX (an AVX2 box)
    emulates bf16 at a few hundredths of fp32: doctor says so, with the measured matmul."""
    from engine.inspect import doctor

    force_cpu_native(monkeypatch, "none")
    (row,) = [r for r in doctor.machine_rows() if r.name == "CPU bf16"]
    assert "no native bf16" in row.detail and "fp32" in row.detail and "ms" in row.detail


def test_doctor_runs_what_breaks_first_on_a_new_gpu():
    """The rows a new GPU box most needs: flash attention where SDPA really takes its flash kernel
    (16-bit), grad checkpointing, a compiled run with an eval inside, compile with checkpointing,
    a CUDA-graph mode, two ranks; on a CPU the GPU-only ones say why they are not run."""
    from engine.inspect.doctor import _switches

    on_gpu = dict(_switches(cuda=True, include_compile=False, gpus=2))
    assert on_gpu["flash attention"] == {"model.attention": "flash", "speed.precision": "bf16"}
    assert on_gpu["grad checkpointing"] == {"model.grad_checkpointing": True}
    assert on_gpu["torch.compile (+ eval)"] == {"speed.compile": True}
    assert on_gpu["compile + grad checkpointing"]["model.grad_checkpointing"] is True
    assert on_gpu["CUDA graphs (reduce-overhead)"]["speed.compile_mode"] == "reduce-overhead"
    assert "--nproc 2" in on_gpu["two ranks (DDP)"]
    on_cpu = dict(_switches(cuda=False, include_compile=False))
    assert on_cpu["CUDA graphs (reduce-overhead)"].startswith("needs a GPU")
    assert on_cpu["two ranks (DDP)"].startswith("needs 2 GPUs")
    assert isinstance(on_cpu["grad checkpointing"], dict)  # runs here too


def test_doctor_compiles_in_bf16_and_with_the_gemm_autotuner():
    """A first GPU run trains compiled in bf16 (TF32 on), and max-autotune's GEMM autotuner read
    the TF32 flags torch refused to mix (issue 37): both are doctor rows, one a CPU runs too."""
    from engine.inspect.doctor import _switches

    on_gpu = dict(_switches(cuda=True, include_compile=False, gpus=1))
    assert on_gpu["torch.compile bf16"] == {"speed.compile": True, "speed.precision": "bf16"}
    assert on_gpu["compile max-autotune (bf16)"] == {"speed.compile": True, "speed.precision": "bf16",
                                                     "speed.compile_mode": "max-autotune-no-cudagraphs"}  # fmt: skip
    on_cpu = dict(_switches(cuda=False, include_compile=True))
    assert on_cpu["torch.compile bf16"] == {"speed.compile": True, "speed.precision": "bf16"}
    assert on_cpu["compile max-autotune (bf16)"].startswith("needs a GPU")
    assert dict(_switches(cuda=False, include_compile=False))["torch.compile bf16"].startswith("left out on CPU")
