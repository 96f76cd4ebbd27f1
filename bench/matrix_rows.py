"""A pytest plugin for the GPU report's switch-matrix item: the riskiest cases first (risk), a row on disk after each.

    pytest -p bench.matrix_rows --rows-out FILE tests/train/test_switch_matrix.py -k cuda_combination

The short window has time for the compiled combinations (the ones a first GPU run is most
likely to break) and, after them, the eager ones as far as the item's budget reaches. Which
cases exist stays the test file's business: this only orders them (stable, riskiest first)
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


def _combo(item: pytest.Item) -> dict[str, Any]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    combo = params.get("combo")
    return combo if isinstance(combo, dict) else {}


def compiled(item: pytest.Item) -> bool:
    """Whether a parametrized case trains with torch.compile (its combo's speed.compile)."""
    return bool(_combo(item).get("speed.compile"))


def risk(combo: dict[str, Any]) -> int:
    """A case's place in the short window, the riskiest first (what a first GPU run most likely
    breaks): 0 max-autotune (autotuned kernels), 1 CUDA graphs (reduce-overhead), 2 any other
    compiled case, 3 eager."""
    if not combo.get("speed.compile"):
        return 3
    mode = str(combo.get("speed.compile_mode", "default"))
    return 0 if mode.startswith("max-autotune") else 1 if mode == "reduce-overhead" else 2


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rows-out", metavar="FILE", help="JSON file rewritten after every case (bench.matrix_rows)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: risk(_combo(item)))  # stable: the file's order within each group


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
