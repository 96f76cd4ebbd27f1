"""`bench --gpu-report`: what can be checked without a GPU.

The refusal without CUDA; the report's files, their JSON and markdown; parts merging into
one report per device and day; a part past its budget; and the real part commands on CPU
(--dry-run, tiniest shapes). The GPU figures themselves come from running it on a GPU box.
"""

import datetime
import sys

import pytest
import torch

from engine.cli import guarded
from bench import gpu_report, run as bench
from bench.common import BenchOptions


def _report(opts: BenchOptions) -> tuple[int, gpu_report.Report]:
    code = guarded(lambda: bench.run(opts))
    stem = f"cpu-dry-run-{datetime.date.today().isoformat()}"
    assert (opts.out / f"{stem}.md").is_file()
    return code, gpu_report.Report.model_validate_json((opts.out / f"{stem}.json").read_text())


def _fake(parts: dict[str, str]):
    """commands() replaced: each part a tiny Python program (or a skip reason) instead of the real tool."""

    def commands(opts, work):
        return {p: code if code.startswith("skipped") else [sys.executable, "-c", code] for p, code in parts.items()}

    return commands


def test_the_flags_are_bench_options():
    from gpt2_tui import build_parser

    parser, _ = build_parser()
    args = vars(parser.parse_args(["bench", "--gpu-report", "--part", "tests", "--part", "memory", "--dry-run", "--budget", "30",
                              "--compile-cache", "warm"]))  # fmt: skip
    opts = BenchOptions.from_flags(args)
    assert (opts.gpu_report, opts.part, opts.dry_run, opts.budget, opts.compile_cache) == (
        True, ["tests", "memory"], True, 30, "warm")  # fmt: skip
    opts = BenchOptions.from_flags(vars(parser.parse_args(["bench", "--gpu-report", "--full", "--no-doctor"])))
    assert (opts.full, opts.no_doctor, opts.part) == (True, True, [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for boxes without CUDA")
@pytest.mark.parametrize(
    "flags, words",
    [
        ({"gpu_report": True}, ["no CUDA GPU here", "--dry-run"]),
        ({"gpu_report": True, "dry_run": True, "preset": "gpt2"}, ["leave --preset out"]),
        ({"gpu_report": True, "dry_run": True, "data": "/no/such/dir"}, ["/no/such/dir"]),
        ({"part": ["tests"]}, ["--part belongs to --gpu-report"]),
        ({"dry_run": True}, ["--dry-run belongs to --gpu-report"]),
        ({"full": True}, ["--full belongs to --gpu-report"]),
        ({"no_doctor": True}, ["--no-doctor belongs to --gpu-report"]),
    ],
)
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, flags, words):
    out = tmp_path / "report"
    assert guarded(lambda: bench.run(BenchOptions(out=out, **flags))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not out.exists()


@pytest.mark.slow
def test_parts_merge_into_one_report_per_device_and_day(tmp_path, monkeypatch, capsys):
    tests_fail = ("print('FAILED tests/gpu/test_gpu.py::test_x - boom'); print('1 failed, 2 passed, 1 skipped in 3.00s');"
                  "import sys; sys.exit(1)")  # fmt: skip
    overhead = ("print('round 0 headless: 1.0 ms/step'); print('config: preset micro'); print('| mode | ms |');"
                "print('|---|---:|'); print('| headless | 1.0 |'); print('| tui | 1.1 |')")  # fmt: skip
    parts = {"tests": tests_fail, "memory": "skipped: needs CUDA", "overhead": overhead}
    monkeypatch.setattr(gpu_report, "commands", _fake(parts))
    opts = BenchOptions(gpu_report=True, dry_run=True, out=tmp_path / "r")

    code, first = _report(opts.model_copy(update={"part": ["tests"]}))
    assert code == 1 and list(first.parts) == ["tests"]  # a failed part: exit 1, still reported
    t = first.parts["tests"]
    assert t.status == "failed (exit 1)" and t.figures == {"failed": 1, "passed": 2, "skipped": 1}
    assert "- FAILED tests/gpu/test_gpu.py::test_x" in t.markdown and "The end of its output" in t.markdown
    assert t.command.startswith("python -c") and t.budget_s == gpu_report.BUDGET_S["tests"]

    assert first.doctor["rows"] and first.doctor_runs
    capsys.readouterr()
    code, merged = _report(opts.model_copy(update={"part": ["overhead", "memory"]}))
    assert code == 0 and set(merged.parts) == {"tests", "memory", "overhead"}
    assert "[doctor] the day's entry reused" in capsys.readouterr().out  # the doctor runs once per box
    assert merged.doctor == first.doctor
    assert merged.parts["tests"] == t  # the earlier part stays as it was
    assert merged.parts["memory"].status == "skipped: needs CUDA"
    o = merged.parts["overhead"]
    assert o.status == "ok" and o.figures == {"tables": [[["mode", "ms"], ["headless", "1.0"], ["tui", "1.1"]]]}
    assert o.markdown.startswith("config: preset micro") and "round 0" not in o.markdown

    parts["tests"] = "print('3 passed in 1.00s')"
    code, again = _report(opts.model_copy(update={"part": ["tests"]}))
    assert code == 0 and again.parts["tests"].figures == {"passed": 3}  # replaced; the others kept
    assert again.parts["overhead"] == o
    md = (opts.out / f"cpu-dry-run-{again.date}.md").read_text()
    assert md.index("## tests") < md.index("## memory") < md.index("## overhead")
    assert "| overhead | ok |" in md and "Command: `python -c" in md and "torch 2." in md


@pytest.mark.slow
def test_a_part_past_its_budget_is_interrupted_and_keeps_what_it_printed(tmp_path, monkeypatch):
    slow = "print('| partial | 1 |', flush=True); import time; time.sleep(120)"
    monkeypatch.setattr(gpu_report, "commands", _fake({"memory": slow}))
    opts = BenchOptions(gpu_report=True, dry_run=True, part=["memory"], budget=2, out=tmp_path / "r")
    code, report = _report(opts)
    m = report.parts["memory"]
    assert code == 0 and m.status == "timed out after 2 s" and m.wall_s < 60
    assert m.figures == {"tables": [[["partial", "1"]]]} and "| partial | 1 |" in m.markdown


@pytest.mark.slow
def test_dry_run_runs_the_real_ladder_and_sweep_commands_on_cpu(tmp_path, tiny_dataset):
    opts = BenchOptions(gpu_report=True, dry_run=True, part=["ladder", "best", "memory"], data=str(tiny_dataset),
                        vocab_size=64, out=tmp_path / "r")  # fmt: skip
    code, report = _report(opts)
    assert code == 0 and report.device == "CPU (dry run)" and report.dry_run
    ladder, best = report.parts["ladder"], report.parts["best"]
    assert ladder.status == best.status == "ok"
    assert ladder.command.startswith("python -m gpt2_tui bench --data") and "--out" not in ladder.command
    assert [r["status"] for r in ladder.figures["rungs"]].count("ran") >= 5
    assert ladder.figures["command"] == ladder.command and "| baseline |" in ladder.markdown
    assert [c["status"] for c in best.figures["candidates"]] == ["ran"] and "**best**" in best.markdown
    assert report.parts["memory"].status.startswith("skipped: ") and "CUDA" in report.parts["memory"].status


def _planted(path, kind: str) -> None:
    import json
    import os

    good = gpu_report.Report(device="CPU (dry run)", torch_version="2", cuda_version=None, device_memory_bytes=None,
                             cpus=2, commit=None, date="2026-01-01", dry_run=True).model_dump(mode="json")  # fmt: skip
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(1_500_000_000)
    elif kind == "link":
        target = path.with_name("elsewhere.json")
        target.write_text(json.dumps(good))
        path.symlink_to(target)
    else:
        doctor = {"rows-int": {"rows": 5}, "row-no-name": {"rows": [{"section": "s", "status": "ok", "detail": ""}]},
                  "nan-seconds": {"rows": [{"section": "s", "name": "n", "status": "ok", "seconds": "NaN"}]}}[kind]
        path.write_text(json.dumps(good | {"doctor": doctor}))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "sparse", "link", "rows-int", "row-no-name", "nan-seconds"])
def test_a_report_file_read_back_is_untrusted_input(tmp_path, kind):
    """Issue 46, class B: the day's report in --out is read through the file boundary (a FIFO never
    blocks, a 1.5 GB sparse file is not read whole, a link is not followed) and validated by the
    Report model, its doctor entry included: each is one line, never a hang or a traceback."""
    from engine.errors import UserError

    path = tmp_path / "cpu-dry-run-2026-01-01.json"
    _planted(path, kind)
    with pytest.raises(UserError) as refused:
        gpu_report.load(path)
    assert "\n" not in str(refused.value) and "GPU report" in str(refused.value)
