"""The one way a tokenizer.json is loaded: a file that is not one is a one-line error."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from engine.errors import UserError


def load_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for broken JSON
        raise UserError(f"tokenizer {path} cannot be read ({str(err).splitlines()[0][:120]}); give a tokenizer.json") from None
