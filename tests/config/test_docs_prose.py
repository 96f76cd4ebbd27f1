"""Every user-facing setting is named in the prose docs, not only in the generated docs/cli.md
(issue 39): a setting with a CLI flag (engine.settings.flags) appears as that flag in README.md
or docs/*.md (docs/cli.md and docs/events.md left out: they are generated). And the README, the
training page and the app's page each name Muon, WSD, `compare --target` and `bench --to-loss`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import settings

ROOT = Path(__file__).resolve().parents[2]
GENERATED = {"cli.md", "events.md"}
PROSE = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)]


def named(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def test_every_setting_with_a_flag_is_named_in_the_prose_docs() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PROSE)
    flags = settings.flags()
    assert len(flags) > 40
    negated = {s.flag: "--no-" + s.flag[2:] for s in flags if s.kind in ("bool", "tristate")}
    missing = [s.flag for s in flags if not named(s.flag, text) and not named(negated.get(s.flag, s.flag), text)]
    assert missing == [], f"named only in the generated docs/cli.md: {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/training.md", "docs/tui.md"])
def test_the_main_pages_name_muon_wsd_and_the_time_to_a_loss(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    missing = [w for w in ("Muon", "WSD", "optimizer muon", "--target", "--to-loss") if w not in text]
    assert missing == [], f"{page} does not name {missing}"
