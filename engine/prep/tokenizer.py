"""The one way a tokenizer.json is loaded: a file that is missing or not one is one line. Its
bytes are read through engine.files under TOKENIZER_CAP, then parsed (`from_str`): the library
never opens a path itself."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine import files, text
from engine.errors import UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def load_tokenizer(path: Path, keep_special_text: bool = False) -> Tokenizer:
    """`keep_special_text`: a literal "<|endoftext|>" in a document stays text when encoded
    (preparing a dataset), instead of becoming the separator id."""
    from tokenizers import Tokenizer  # imported here: the app's first paint never waits for it

    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"tokenizer {path} does not exist (or is not a file); pass a tokenizer.json")
    try:  # read under the cap first: the library, given the path, would read a sparse giant whole
        data = files.read_text(path, files.TOKENIZER_CAP, follow_links=True)
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else "not UTF-8 text"
        raise UserError(f"tokenizer {path} cannot be read ({text.path_text(why)}); pass a tokenizer.json") from None
    try:
        tok = Tokenizer.from_str(data)
    except Exception as err:  # noqa: BLE001 - the Rust side raises a bare Exception for bad JSON
        reason = " ".join(str(err).split())[:160]
        raise UserError(f"tokenizer {path} cannot be loaded: it cannot be read as one ({reason}); pass a "
                        "tokenizer.json saved by the `tokenizers` library") from None  # fmt: skip
    ids = tok.get_vocab(with_added_tokens=True).values()
    size = tok.get_vocab_size(with_added_tokens=True)
    if ids and max(ids) >= size:  # token files are sized by the vocab: such an id would overflow them
        raise UserError(f"tokenizer {path} gives token id {max(ids)}, outside its vocab of {size} ids: it is inconsistent "
                        "(hand-edited?); pass a tokenizer.json saved by the `tokenizers` library")  # fmt: skip
    if keep_special_text:
        tok.encode_special_tokens = True
    return tok
