"""The slow mark by measurement: read the durations a pytest run wrote (tests/conftest.py, the
file GPT2_TUI_DURATIONS names) and name every test not marked slow that took over LIMIT_S, ran a
training step or started a process (a unit test does neither).

    python .ci/slow_check.py [DURATIONS.json]   (default: .pytest_cache/gpt2-tui-durations.json)

Each such test is named with its seconds. The exit status is 1 when one trained, started a
process or took over FAIL_S (a margin of 2x over the limit, so that a loaded CI box does not fail
a 5.5 s unit test), else 0. The ten slowest tests of each
layer are printed too: where the suite's time goes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LIMIT_S = 5.0  # a unit test takes at most this on the 2-core CI box (README, "Tests")
FAIL_S = 2 * LIMIT_S


DEFAULT = Path(__file__).resolve().parent.parent / ".pytest_cache" / "gpt2-tui-durations.json"  # tests/conftest.py's


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python .ci/slow_check.py [DURATIONS.json]", file=sys.stderr)
        return 2
    path = Path(argv[0]) if argv else DEFAULT
    if not path.is_file():
        print(f"{path}: no durations recorded; run the tests first (tests/conftest.py writes them)", file=sys.stderr)
        return 2
    recorded = json.loads(path.read_text())
    rows: dict[str, dict] = recorded["tests"]
    by_fixture: dict[str, list[str]] = recorded["fixtures_that"]  # a shared fixture's work is its users' too
    unit = {k: v["seconds"] for k, v in rows.items() if not v["slow"]}
    slow = {k: v["seconds"] for k, v in rows.items() if v["slow"]}
    for name, layer in (("unit (not slow)", unit), ("slow", slow)):
        total = sum(layer.values())
        print(f"{name}: {len(layer)} tests, {total:.0f} s; the ten slowest:")
        for k, s in sorted(layer.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {s:7.1f} s  {k}")
    over = sorted(((s, k) for k, s in unit.items() if s > LIMIT_S), reverse=True)
    for s, k in over:
        print(f"not marked slow but took {s:.1f} s (over {LIMIT_S:.0f} s): {k}")
    did = {k: [w for w in ("trains", "spawns") if rows[k].get(w) or set(rows[k].get("fixtures", ())) & set(by_fixture[w])]
           for k in unit}  # fmt: skip
    for k, what in sorted(did.items()):
        if what:
            print(f"not marked slow but {' and '.join(what)}: {k}")
    bad = [k for s, k in over if s > FAIL_S] + [k for k, what in did.items() if what]
    if bad:
        print(f"{len(bad)} unit test(s) (not marked slow) trained, started a process or took over {FAIL_S:.0f} s: "
              "mark them slow (pytest.mark.slow), read a trained run from the table, or make them cheaper",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
