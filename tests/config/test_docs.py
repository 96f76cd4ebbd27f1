"""The docs stay true to the code: docs/cli.md and docs/events.md are what engine.cli.reference
generates (so a new flag or event field cannot land without them), every `train` flag is
documented, the README stays short, and the user-facing pages name topics, not issue numbers."""

import argparse
import re
from pathlib import Path

import pytest

from engine import cli
from engine.cli import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = "out of date: run `python -m engine.cli.reference` and commit docs/cli.md and docs/events.md"


def _subparser(name: str) -> argparse.ArgumentParser:
    parser, _ = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("page, generate", [("cli.md", reference.cli_markdown), ("events.md", reference.events_markdown)])
def test_generated_pages_match_the_code(page, generate):
    assert (DOCS / page).read_text(encoding="utf-8") == generate(), f"docs/{page} is {REGENERATE}"


def test_a_new_flag_changes_the_generated_page(monkeypatch):
    """The check above has teeth: a flag added to the parser without regenerating shows up."""
    real = cli.build_parser

    def with_a_new_flag(*args, **kwargs):
        parser, sub = real(*args, **kwargs)
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        action.choices["train"].add_argument("--brand-new-flag", help="not in the docs yet")
        return parser, sub

    monkeypatch.setattr(cli, "build_parser", with_a_new_flag)
    generated = reference.cli_markdown()
    assert "--brand-new-flag" in generated
    assert (DOCS / "cli.md").read_text(encoding="utf-8") != generated


def test_every_train_flag_is_in_the_cli_page():
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    options = [o for a in _subparser("train")._actions for o in a.option_strings if o not in ("-h", "--help")]
    assert len(options) > 40  # the settings' flags are there, not just the command's own
    missing = [o for o in options if not re.search(rf"`{re.escape(o)}`", page)]
    assert not missing, f"docs/cli.md lacks {missing}: {REGENERATE}"


def test_every_event_type_is_in_the_events_page():
    page = (DOCS / "events.md").read_text(encoding="utf-8")
    for kind in reference.event_types():
        assert f"## {kind.model_fields['event'].default}\n" in page


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail into docs/"


USER_DOCS = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if p.name != "design.md")]
ISSUE = re.compile(r"\bissues?[ -]#?\d+|\(#\d+\)|\bissue\b", re.I)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_headings_name_topics_not_issue_numbers(path):
    in_code = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("#"):
            assert not ISSUE.search(line), f"{path.relative_to(ROOT)}:{n}: heading names an issue: {line!r}"


def test_ci_runs_the_readme_test_command():
    """.ci/run is the README's test command, word for word."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert ci[-1] in readme, f"README.md lacks the command .ci/run runs: {ci[-1]!r}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_the_docs_resolve(path):
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to a missing {target}"
