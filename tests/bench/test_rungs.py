"""The ladder's table (bench/rungs.py) against the settings it names: every live switch is
climbed by a rung or exempted with a reason, every rung names a real setting with a value that
setting takes, and the engine's settings carry no ladder knowledge of their own (issue 36)."""

from __future__ import annotations

import pytest

from bench import rungs
from bench.names import LOSS_RUNG_NAMES, RUNG_NAMES
from engine.config import RunConfig
from engine.settings import all_settings, switches
from harness import accepts

SETTINGS = {s.dotted for s in all_settings()}
META_KEYS = {"form", "live", "flag", "label", "blank", "metavar"}  # engine.config._meta's


def unaccounted(live: tuple[str, ...], ladder: tuple[rungs.Rung, ...], exempt: dict[str, str]) -> list[str]:
    """The live switches no rung climbs and no exemption names."""
    climbed = {name for r in ladder for name in r.changes}
    return [s for s in live if s not in climbed and s not in exempt]


def test_every_live_switch_is_a_rung_or_exempt_with_a_reason():
    assert unaccounted(switches(), rungs.RUNGS, rungs.EXEMPT) == []
    climbed = {name for r in rungs.RUNGS for name in r.changes}
    assert not climbed & set(rungs.EXEMPT), "a switch the ladder climbs is also listed as exempt"
    assert set(rungs.EXEMPT) <= set(switches()), "an exemption names no live switch: drop it"
    assert all(reason.strip() for reason in rungs.EXEMPT.values())


def test_a_new_live_switch_without_a_rung_is_caught():
    planted = (*switches(), "speed.new_switch")
    assert unaccounted(planted, rungs.RUNGS, rungs.EXEMPT) == ["speed.new_switch"]


@pytest.mark.parametrize("rung", rungs.RUNGS + rungs.LOSS_RUNGS, ids=lambda r: r.name)
def test_every_rung_names_real_settings_with_values_they_take(rung: rungs.Rung):
    assert rung.changes and rung.label and rung.why
    for dotted, value in rung.changes.items():
        assert dotted in SETTINGS, f"rung {rung.name}: {dotted} is no setting"
        if (dotted, value) != ("speed.precision", rungs.AMP):  # the device's half precision, decided by the ladder
            assert accepts(dotted, value), f"rung {rung.name}: {dotted} does not take {value!r}"


def test_the_baseline_sets_each_climbed_switch_to_a_value_it_takes():
    climbed = {name for r in rungs.RUNGS for name in r.changes}
    assert set(rungs.BASELINE) == climbed  # each rung is measured against the switch off
    for dotted, value in rungs.BASELINE.items():
        assert dotted in SETTINGS and accepts(dotted, value), (dotted, value)
    assert not {name for r in rungs.LOSS_RUNGS for name in r.changes} & set(switches())  # not speed


def test_rung_names_are_unique_and_what_skip_takes():
    names = ["baseline", *(r.name for r in rungs.RUNGS)]
    assert names == RUNG_NAMES and len(set(names + LOSS_RUNG_NAMES)) == len(names) + len(LOSS_RUNG_NAMES)


def test_the_engine_settings_carry_no_ladder_knowledge():
    for section, field in RunConfig.model_fields.items():
        sub = field.annotation
        for name, info in getattr(sub, "model_fields", {}).items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            assert set(extra) <= META_KEYS, f"{section}.{name} carries {set(extra) - META_KEYS}"
