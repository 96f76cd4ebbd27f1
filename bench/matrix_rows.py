"""A pytest plugin for the GPU report's switch-matrix item: compiled cases first, a row on disk after each.

    pytest -p bench.matrix_rows --rows-out FILE tests/train/test_switch_matrix.py -k cuda_combination

The short window has time for the compiled combinations (the ones a first GPU run is most
likely to break) and, after them, the eager ones as far as the item's budget reaches. Which
cases exist stays the test file's business: this only orders them (stable, compiled first)
and writes FILE (JSON: every collected case, then each finished one with its outcome and
seconds) after every case, so a run interrupted at its budget keeps what it finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.files import atomic_write_bytes

_STATE: dict[str, Any] = {"collected": [], "rows": []}


def compiled(item: pytest.Item) -> bool:
    """Whether a parametrized case trains with torch.compile (its combo's speed.compile)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    combo = params.get("combo")
    return isinstance(combo, dict) and bool(combo.get("speed.compile"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rows-out", metavar="FILE", help="JSON file rewritten after every case (bench.matrix_rows)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not compiled(item))  # stable: the file's order within each group


def _write(config: pytest.Config) -> None:
    out = config.getoption("--rows-out")
    if out:
        atomic_write_bytes(Path(out), json.dumps(_STATE, indent=1).encode())


def pytest_collection_finish(session: pytest.Session) -> None:
    _STATE["collected"] = [{"case": item.nodeid.split("::")[-1], "compiled": compiled(item)} for item in session.items]
    _write(session.config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One row per case: its call's outcome, or its setup's when that failed or skipped it."""
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        line = ""
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            line = next((ln for ln in reversed(text) if ln.startswith("E ")), text[-1] if text else "")[:200]
        _STATE["rows"].append({"case": report.nodeid.split("::")[-1], "outcome": report.outcome,
                               "seconds": round(report.duration, 2), "error": line.strip()})  # fmt: skip
        _write(_CONFIG[0])


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]
