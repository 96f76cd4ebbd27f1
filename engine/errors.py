"""Bad user input, with its fix as data: `UserError("what is wrong", {"train.block_size":
"512 or less"})` makes the CLI print one line, the fix as flags ("pass --block-size 512 or
less"; engine.config installs `Refusal.cli`), and exit 2 without a traceback; the form words
the fix as its fields. Each fix is settings changed together; several are alternatives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Say = Callable[[str, Any], str]  # (dotted setting, value) -> one change in some front end's words


class Refusal:
    """A problem and its fixes (each {dotted setting: value}); `also` = advice of no setting."""

    cli: Say = staticmethod(lambda dotted, value: f"{dotted} {value}")  # engine.config: the flags

    def __init__(self, problem: str, *fixes: dict[str, Any], also: str = "") -> None:
        self.problem, self.fixes, self.also = " ".join(problem.split("\n")), fixes, also
        super().__init__(self.problem)

    def words(self, say: Say | None = None, join: str = " ", verb: str = "pass ") -> str:
        """The whole line, each fix worded by `say` (the CLI's flags by default)."""
        say = say or Refusal.cli
        fixes = [verb + join.join(say(d, v) for d, v in fix.items()) for fix in self.fixes]
        advice = ", or ".join(fixes + ([self.also] if self.also else []))
        return f"{self.problem}; {advice}" if advice else self.problem

    def __str__(self) -> str:
        return self.words()


class UserError(Refusal, Exception):
    """Bad input the user can fix: one line naming the problem and the fix."""


class Invalid(Refusal, ValueError):
    """A config validator's refusal: pydantic keeps it (the error's ctx) for the form to word."""
