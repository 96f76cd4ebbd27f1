"""Text files -> a byte-level BPE tokenizer -> gpt2-tui token files + dataset.json.

Pre-tokenizing once is what lets training read batches straight from RAM instead of
tokenizing on the fly (reported ~2x). Every file is one document; each document is
preceded by ``<|endoftext|>`` (llm.c's convention), so the model sees where documents
start and sampling can be prompted with EOT alone. Whole documents go to train or val,
chosen by a seeded shuffle, so val text is never seen in training.

Memory follows a piece, not a file: every input is read in blocks and decoded as it is read,
and a document is trained on and encoded in pieces of PIECE_CHARS characters, each ending
where GPT-2's pre-tokenizer never joins (so the tokens are the whole document's).

Writes are all-or-nothing: the dataset is built in a temporary directory beside ``out``
and renamed into place, and every input is checked before anything is written.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import importlib.util
import json
import os
import stat
import sys
import sysconfig
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine import files
from engine.dataset import FORMAT_NAME, FORMAT_VERSION, SIDECAR, DatasetInfo, dtype_for_vocab, open_dataset
from engine import console, rundir
from engine.config import DEFAULT_VOCAB, SEED_LIMIT
from engine.files import cache_root
from engine.errors import UserError
from engine.prep.tokenizer import load_tokenizer
from engine.text import path_text

EOT = "<|endoftext|>"
TEXT_SUFFIXES = frozenset(
    ".txt .text .md .markdown .rst .py .pyi .json .jsonl .toml .yaml .yml .ini .cfg .csv .tsv "
    ".c .h .cc .cpp .hpp .cu .cuh .rs .go .java .js .ts .html .htm .css .xml .tex .sh .sql".split()
)
MAX_GUNZIP_BYTES = 2 << 30  # one input's text, at most (a gzip bomb is read only this far)
READ_BYTES = 1 << 20  # an input is read and decoded in blocks of this many bytes
PIECE_CHARS = 1 << 16  # a document is trained on and encoded in pieces of about this many characters
MAX_CUT_SLACK = PIECE_CHARS // 2  # how far from its mark a document's val tail may start (to end a line)
SKIPPED_NAMED = 10  # skipped files named in a summary; the rest are counted
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", ".tox"})
_ENCODE_CHUNK_CHARS = 1 << 20  # text per encode_batch call: big enough for the thread pool


@dataclass
class Skipped:
    """A file passed over, and why: the user must be able to tell which and fix it."""

    path: Path
    reason: str


@dataclass
class PrepareReport:
    """What `prepare` did, for the CLI's summary line."""

    info: DatasetInfo
    train_docs: int
    val_docs: int
    skipped: list[Skipped]
    seconds: float
    warnings: list[str] = field(default_factory=list)  # one line each: a dataset that will train badly


TINY_TRAIN = 100_000  # train tokens below which a model learns little: said, not refused


def skipped_text(skipped: list[Skipped], limit: int = SKIPPED_NAMED) -> str:
    """'a.bin (binary), notes (not UTF-8) and 3 more': the first `limit` named, the rest counted."""
    text = ", ".join(f"{path_text(s.path)} ({s.reason})" for s in skipped[:limit])
    return text + (f" and {len(skipped) - limit} more" if len(skipped) > limit else "")


# --------------------------------------------------------------------------- progress


Reporter = Callable[[str, "float | None"], None]
"""Told each phase of a build and how far it is: (what, fraction done or None when unknown).
A UI passes one as `progress` to see the build without a terminal (the app's status line)."""


class _Progress:
    """rich's progress on stderr when it is installed (textual brings it) and stderr is a
    terminal: a bar for a known total, else a spinner with the time so far. Otherwise (logs,
    CI, a bare box without rich) a start line and a done line with the time it took; with
    progress off, nothing, and rich is never imported (engine/ runs without it). Never
    stdout: that is the command's result. `enabled` may be a Reporter instead: it is told
    the phase and its fraction (at most every percent), and nothing is printed."""

    def __init__(self, label: str, total: int | None, enabled: bool | Reporter) -> None:
        self.label, self._t0, self._bar = label, time.perf_counter(), None
        self._report, self._total, self._done, self._said = None, total, 0, -1.0
        if callable(enabled):
            self._report, enabled = enabled, False
            self._report(label, None if total is None else 0.0)
        if enabled and sys.stderr.isatty() and importlib.util.find_spec("rich") is not None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn
            from rich.progress import TimeElapsedColumn, TimeRemainingColumn

            text = "[progress.description]{task.description}"
            columns = (text, BarColumn(), TaskProgressColumn(), TimeRemainingColumn()) if total is not None else (
                SpinnerColumn(), text, TimeElapsedColumn())  # fmt: skip
            self._bar = Progress(*columns, console=Console(stderr=True), transient=False)
            # rich reads a description as markup and passes control characters: the label is made printable first
            self._task = self._bar.add_task(console.progress_label(label), total=None if total is None else max(total, 1))
            self._bar.start()
        self.quiet_summary = enabled and self._bar is None
        if self.quiet_summary:
            console.err.line(f"{label}...", flush=True)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)
        if self._report is not None and self._total:
            self._done += n
            fraction = min(1.0, self._done / self._total)
            if fraction - self._said >= 0.01:
                self._said = fraction
                self._report(self.label, fraction)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """Stop the display (and give the cursor back) however the work ended; 'done' only if it did."""
        if self._bar is not None:
            self._bar.stop()
        if self.quiet_summary and kind is None:
            console.err.line(f"{self.label}: done in {time.perf_counter() - self._t0:.1f} s", flush=True)


def _say(message: str, enabled: bool | Reporter) -> None:
    if enabled is True:
        console.err.line(message, flush=True)


# --------------------------------------------------------------------------- inputs


def _wanted(name: str) -> bool:
    """In a directory walk: a text suffix, or none (README, LICENSE: read, then checked like any
    file), or one of those gzipped (notes.txt.gz, corpus.gz)."""
    path = Path(name.lower())
    if path.suffix == ".gz":
        path = Path(path.stem)
    return path.suffix in TEXT_SUFFIXES or not path.suffix


def _collect_files(paths: list[Path]) -> tuple[list[Path], list[Skipped]]:
    """Files named directly are taken as they are; directories are walked for text files, and
    the others found there are returned as skipped. Hidden files and folders are left out unsaid.
    A named input that is neither a regular file nor a directory (a device, a FIFO, a link to
    one, a link loop) is refused in one line: reading it would never end."""
    found: list[Path] = []
    skipped: list[Skipped] = []
    for path in paths:
        path = Path(path).expanduser()
        try:
            st = os.stat(path)  # follows the user's own links
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"input {path} is a symbolic link loop; pass text files or directories") from None
            raise UserError(f"input {path} does not exist; pass existing text files or directories") from None
        if stat.S_ISREG(st.st_mode):
            found.append(path)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"input {path} is not a regular file or a directory (a device, a FIFO or a socket); "
                            "pass text files or directories")  # fmt: skip
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(n for n in filenames if not n.startswith(".")):
                if _wanted(name):
                    found.append(Path(dirpath) / name)
                else:
                    skipped.append(Skipped(Path(dirpath) / name, "not a text type"))
    seen: set[str] = set()
    unique = []
    for file in found:
        key = os.path.realpath(file)  # never raises on a loop (Path.resolve does): the read says why
        if key not in seen:
            seen.add(key)
            unique.append(file)
    return unique, skipped


class _Binary(ValueError):
    """A NUL byte: not text."""


class _TooBig(ValueError):
    """More text than one input may hold."""


@contextmanager
def _raw(file: Path) -> Iterator[BinaryIO]:
    """A regular file's bytes (a device, a FIFO is refused: files.open_regular), gunzipped
    when its name ends in .gz."""
    if file.suffix.lower() == ".gz":
        with files.open_read(file, follow_links=True) as raw, gzip.GzipFile(fileobj=raw) as f:
            yield f  # type: ignore[misc]
    else:
        with files.open_read(file, MAX_GUNZIP_BYTES, follow_links=True) as f:  # the user's corpus: a link is theirs
            yield f


def _decoded(file: Path) -> Iterator[str]:
    """A file's text, decoded block by block as it is read: never the whole file in memory
    (a gzip bomb, a 2 GiB corpus). _Binary, _TooBig, UnicodeDecodeError or the read's error."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    total = 0
    with _raw(file) as f:
        while True:
            block = f.read(READ_BYTES)
            if not block:
                break
            total += len(block)
            if total > MAX_GUNZIP_BYTES:
                raise _TooBig(file)
            if b"\x00" in block:
                raise _Binary(file)
            text = decoder.decode(block)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


@dataclass
class _Doc:
    """One input document: its file, its length in characters, where its val tail starts."""

    path: Path
    chars: int
    cut: int = 0


def _scan(file: Path) -> _Doc | Skipped:
    """A file's length in characters (read through once, in blocks), or why it is not text."""
    chars = 0
    try:
        for text in _decoded(file):
            chars += len(text)
    except _TooBig:
        return Skipped(file, f"unpacks to more than {MAX_GUNZIP_BYTES >> 30} GiB; gunzip it yourself if you mean it")
    except (gzip.BadGzipFile, EOFError, zlib.error):
        return Skipped(file, "not a valid gzip file")
    except _Binary:
        return Skipped(file, "binary")
    except UnicodeDecodeError:
        return Skipped(file, "not UTF-8")
    except OSError as exc:
        return Skipped(file, f"unreadable: {exc.strerror or type(exc).__name__}")
    return _Doc(file, chars) if chars else Skipped(file, "empty")


def _read_corpus(inputs: list[Path]) -> tuple[list[_Doc], list[Skipped]]:
    """UTF-8 text only: binary, undecodable, unreadable and empty files are skipped, with why."""
    docs: list[_Doc] = []
    skipped: list[Skipped] = []
    for file in inputs:
        got = _scan(file)
        (skipped if isinstance(got, Skipped) else docs).append(got)  # type: ignore[arg-type]
    return docs, skipped


def _text_of(doc: _Doc) -> Iterator[tuple[int, str]]:
    """(offset in characters, text) blocks of a document read again; a file that no longer reads
    as it did (changed under prepare) is one line."""
    pos = 0
    try:
        for text in _decoded(doc.path):
            yield pos, text
            pos += len(text)
    except (OSError, ValueError, EOFError, zlib.error) as exc:
        raise UserError(f"{path_text(doc.path)} changed or became unreadable while prepare read it ({type(exc).__name__}); "
                        "run prepare again") from None  # fmt: skip


def _window(doc: _Doc, lo: int, hi: int) -> str:
    """Characters lo..hi of a document (read up to hi, no further)."""
    parts = []
    for pos, text in _text_of(doc):
        if pos + len(text) > lo:
            parts.append(text[max(0, lo - pos): hi - pos])
        if pos + len(text) >= hi:
            break
    return "".join(parts)


def _cut(doc: _Doc, val_fraction: float) -> int:
    """Where a document's held-out tail starts: near (1 - f) of its length, at a line end when
    one is close, else at a space, else right there (BPE does not mind a cut word). Close is
    within f/2 of the length, at most MAX_CUT_SLACK characters: only that window is held."""
    n = doc.chars
    target = round(n * (1 - val_fraction))
    slack = min(max(1, round(n * val_fraction / 2)), MAX_CUT_SLACK)
    lo, hi = max(0, target - slack), min(n, target + slack)
    window = _window(doc, lo, hi)
    for sep in ("\n", " "):
        near = [lo + i + 1 for i in (window.rfind(sep, 0, target - lo), window.find(sep, target - lo, hi - lo)) if i >= 0]
        if near:
            return min(near, key=lambda c: abs(c - target))
    return target


def _split_at(buffer: str) -> int:
    """Where to end a piece of a long document so that tokenizing the pieces gives the tokens
    of the whole: before a line break that follows a non-space (GPT-2's pre-tokenizer never
    joins across one), else before any line break, else at PIECE_CHARS."""
    i = PIECE_CHARS
    while True:
        i = buffer.rfind("\n", PIECE_CHARS // 2, i)
        if i <= 0:
            break
        if not buffer[i - 1].isspace():
            return i
    i = buffer.rfind("\n", PIECE_CHARS // 2, PIECE_CHARS)
    return i if i > 0 else PIECE_CHARS


def _pieces(doc: _Doc, start: int, end: int) -> Iterator[str]:
    """Characters start..end of a document in pieces of about PIECE_CHARS, read as they are
    needed: what the BPE trains on and the encoder encodes, so prepare's memory is a few
    pieces' worth whatever the file's size."""
    buffer = ""
    for pos, text in _text_of(doc):
        if pos + len(text) <= start:
            continue
        buffer += text[max(0, start - pos): end - pos]
        while len(buffer) >= PIECE_CHARS:
            at = _split_at(buffer)
            yield buffer[:at]
            buffer = buffer[at:]
        if pos + len(text) >= end:
            break
    if buffer:
        yield buffer


@dataclass
class _Split:
    """The documents in their seeded order, each with its part for this split (start, end)."""

    parts: list[tuple[_Doc, int, int]]

    @property
    def chars(self) -> int:
        return sum(end - start for _, start, end in self.parts)

    def texts(self) -> Iterator[str]:
        for doc, start, end in self.parts:
            yield from _pieces(doc, start, end)


def split_by_tokens(docs: list[_Doc], val_fraction: float, seed: int) -> tuple[_Split, _Split]:
    """Train and val parts: the last `val_fraction` of every document is held out (as nanoGPT
    holds out the end of its one stream), so one file is a dataset and neither split is one
    accidental file; documents come in a seeded order. The BPE trains on the train parts only."""
    order = np.random.default_rng(seed).permutation(len(docs))
    ordered = [docs[i] for i in order]
    for doc in ordered:
        doc.cut = _cut(doc, val_fraction)
    train = _Split([(d, 0, d.cut) for d in ordered if d.cut > 0])
    val = _Split([(d, d.cut, d.chars) for d in ordered if d.cut < d.chars])
    if not train.parts or not val.parts:
        size = sum(d.chars for d in docs)
        raise UserError(f"the text is too short to hold out {val_fraction:.0%} of it for val ({size} characters); "
                        "pass more text (or a larger --val-fraction)")  # fmt: skip
    return train, val


def report_warnings(info: DatasetInfo, asked_vocab: int | None) -> list[str]:
    """What makes a dataset train badly, one line each: said after a build that succeeded."""
    out = []
    if info.train_tokens < info.val_tokens:
        out.append(f"warning: train ({info.train_tokens:,} tokens) is smaller than val ({info.val_tokens:,}); "
                   "pass a smaller --val-fraction")  # fmt: skip
    if info.train_tokens < TINY_TRAIN:
        out.append(f"warning: train holds only {info.train_tokens:,} tokens (under {TINY_TRAIN:,}): a model "
                   "memorizes so little text rather than learning from it; pass more text")  # fmt: skip
    if asked_vocab is not None and info.vocab_size < asked_vocab / 2:
        out.append(f"warning: asked for a vocab of {asked_vocab} ids, the text gave {info.vocab_size}: "
                   f"pass --vocab-size {info.vocab_size} (or more text)")  # fmt: skip
    return out




MAX_WORD = 256  # characters: a longer pre-tokenized word is cut in pieces this long


def _pre_tokenizer():  # -> tokenizers.pre_tokenizers.PreTokenizer
    """GPT-2's byte-level split, then every word cut to at most MAX_WORD characters: BPE
    training is quadratic in a word's length (1 MB of one letter took minutes), and no
    merge is worth learning from a run that long. Ordinary words are untouched."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        pre_tokenizers.Split(Regex(rf"[\s\S]{{1,{MAX_WORD}}}"), behavior="isolated"),
    ])  # fmt: skip


def train_tokenizer(texts: Iterable[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """A byte-level BPE of `vocab_size` entries (EOT among them) trained on `texts` (prepare_hub
    uses it too). Trained on a worker thread while this (main) thread waits in short slices: the
    Rust training does not return to Python until it ends, so waiting here is what lets
    Ctrl-C or SIGTERM (engine.cli.cmd_prepare) stop prepare at once. The abandoned worker is
    a daemon: it dies with the process."""
    import threading

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bars write stray newlines to stdout, TTY or not (tokenizers 0.23)
    )
    failed: list[BaseException] = []

    def work() -> None:
        try:
            length = len(texts) if isinstance(texts, list) else None
            tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
        except BaseException as err:  # handed to the waiting thread
            failed.append(err)

    worker = threading.Thread(target=work, name="bpe-training", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)  # a signal's handler runs between these waits
    if failed:
        raise failed[0]
    return tokenizer


# --------------------------------------------------------------------------- encoding


def token_array(ids: list[int], vocab: int, dtype: str | np.dtype) -> np.ndarray:
    """Token ids as the token file's dtype; a tokenizer whose ids reach past its own vocab (a
    hand-edited tokenizer.json) is one line, never a uint16 overflow (prepare_hub uses it too)."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (int(arr.max()) >= vocab or int(arr.min()) < 0):
        bad = int(arr.max()) if int(arr.max()) >= vocab else int(arr.min())
        raise UserError(f"the tokenizer gave token id {bad}, outside its vocab of {vocab} ids: its tokenizer.json is "
                        "inconsistent; pass another tokenizer (or none, to train one)")  # fmt: skip
    return arr.astype(dtype)


def _chunks(split: _Split) -> Iterator[list[tuple[bool, str]]]:
    """(starts a document, text) pieces, about _ENCODE_CHUNK_CHARS of text per chunk."""
    chunk: list[tuple[bool, str]] = []
    size = 0
    for doc, start, end in split.parts:
        first = True
        for text in _pieces(doc, start, end):
            chunk.append((first, text))
            first = False
            size += len(text)
            if size >= _ENCODE_CHUNK_CHARS:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def _encode_to_file(tokenizer, split: _Split, eot_id: int | None, dtype: str, file: Path, bar: _Progress) -> int:
    """Encode a split's documents, piece by piece in chunks (encode_batch runs on the Rust
    thread pool), and append them to a token file, EOT before each document. Returns the
    number of tokens written."""
    # Documents are text, never control tokens: a literal "<|endoftext|>" in a file (this
    # very module has one) must stay text, not become an EOT that splits the document.
    tokenizer.encode_special_tokens = True
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: faster
    vocab = tokenizer.get_vocab_size()
    prefix = [] if eot_id is None else [eot_id]
    written = 0
    with files.open_new(file) as f:  # in the build's own temp directory
        for chunk in _chunks(split):
            encodings = encode([text for _, text in chunk], add_special_tokens=False)
            ids = token_array([i for (first, _), enc in zip(chunk, encodings) for i in (prefix if first else []) + enc.ids],
                              vocab, dtype)  # fmt: skip
            f.write(ids.tobytes())
            written += len(ids)
            bar.update(sum(len(t) for _, t in chunk))
    return written


# --------------------------------------------------------------------------- prepare


def prepare_report(
    paths: list[Path],
    out: Path,
    vocab_size: int | None = DEFAULT_VOCAB,
    tokenizer: Path | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
    progress: bool | Reporter = True,
) -> PrepareReport:
    """Tokenize text files into a gpt2-tui dataset at `out`, with document counts and timing
    (for the CLI summary).

    Without `tokenizer` a byte-level BPE of `vocab_size` entries is trained on the train
    documents (val stays unseen); with one, that tokenizer.json is used and copied.
    """
    t0 = time.perf_counter()
    out = Path(out).expanduser()
    # Every check happens before anything is written.
    rundir.check_new(out)
    if not paths:
        raise UserError("no input given; pass text files or directories to prepare")
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction {val_fraction} is not between 0 and 1; pass e.g. 0.05")
    if not 0 <= seed < SEED_LIMIT:
        raise UserError(f"--seed {seed} is out of range; pass 0 to {SEED_LIMIT - 1}")
    if tokenizer is None:
        if vocab_size is None:
            raise UserError("neither --vocab-size nor --tokenizer given; pass one of them")
        if not 257 <= vocab_size <= 2**32:
            raise UserError(
                f"--vocab-size {vocab_size} is out of range; pass 257 (256 bytes + {EOT}) or more"
            )
        tok = None
    else:
        tok = load_tokenizer(tokenizer)
    inputs, passed_over = _collect_files(paths)
    docs, unread = _read_corpus(inputs)
    skipped = passed_over + unread
    if not docs:
        named = f": {skipped_text(skipped, 3)}" if skipped else ""
        raise UserError(
            f"no readable UTF-8 text among the inputs ({len(skipped)} files skipped{named}); "
            f"pass text files (.txt .md .py ...) or directories holding them"
        )
    train, val = split_by_tokens(docs, val_fraction, seed)

    rundir.make_dir(out.parent)
    files.sweep_dead_builds(out)
    tmp = files.build_dir_name(out)
    try:
        files.make_new_dir(tmp)  # not mkdtemp: its 0700 mode would make a shared cache unreadable to others
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write in {out.parent} ({exc.strerror}); choose another --out") from None
    try:
        if tok is None:
            # tokenizers' own bars (show_progress) also write newlines to stdout; the training
            # releases the GIL, so rich's spinner thread keeps ticking meanwhile
            with _Progress(f"training a {vocab_size}-token BPE on {len(train.parts)} documents", None, progress):
                tok = train_tokenizer(train.texts(), vocab_size)
            files.atomic_write_bytes(tmp / "tokenizer.json", tok.to_str(pretty=True).encode())  # no link followed
        else:
            files.copy_file(Path(tokenizer).expanduser(), tmp / "tokenizer.json", files.TOKENIZER_CAP, follow_links=True)
        vocab = tok.get_vocab_size()
        eot_id = tok.token_to_id(EOT)
        if eot_id is None:
            _say(f"note: the tokenizer has no {EOT} token; documents are joined without one", progress)
        dtype = dtype_for_vocab(vocab)
        with _Progress("encoding", train.chars + val.chars, progress) as bar:
            counts = {
                name: _encode_to_file(tok, split, eot_id, dtype, tmp / f"{name}.bin", bar)
                for name, split in (("train", train), ("val", val))
            }
        sidecar = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "dtype": dtype,
            "vocab_size": vocab,
            "train_tokens": counts["train"],
            "val_tokens": counts["val"],
            "tokenizer": "tokenizer.json",
            "eot_id": eot_id,
        }
        files.write_text(tmp / SIDECAR, json.dumps(sidecar, indent=2) + "\n")
        open_dataset(tmp, preload=False)  # validate before publishing
        try:
            files.rename(tmp, out)  # atomic; replaces `out` only if it is an empty directory
        except OSError as exc:
            raise UserError(
                f"--out {out} could not be created ({exc.strerror}); it may have been filled "
                f"meanwhile: choose another --out"
            ) from exc
    finally:
        if tmp.exists():
            files.remove_tree(tmp)
    info = open_dataset(out, preload=False).info
    return PrepareReport(
        info=info,
        train_docs=len(train.parts),
        val_docs=len(val.parts),
        skipped=skipped,
        seconds=time.perf_counter() - t0,
        warnings=report_warnings(info, vocab_size if tokenizer is None else None),
    )


# --------------------------------------------------------------------------- default dataset


def stdlib_files() -> list[Path]:
    """The running Python's standard-library *.py sources, minus tests and vendored tools."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return found


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock shared by processes and threads, on every OS (filelock, which torch brings)."""
    from filelock import FileLock

    with FileLock(lock_path):
        yield


def default_dataset(cache_dir: Path | None = None, progress: bool | Reporter = True) -> Path:
    """The embedded demo corpus (this Python's stdlib source, BPE 8192), built once, cached.

    Safe when several processes ask at once: the first builds under a lock while the
    others wait, then find it done. measured: 6.0 s on 2 cores, quiet (11 MB, 598 files, ~2.9 M
    tokens); later calls return at once.
    """
    name = f"stdlib-py{sys.version_info.major}{sys.version_info.minor}-v{DEFAULT_VOCAB}"
    return _cached_build(cache_root(cache_dir) / name, stdlib_files, progress)


def _cached_build(target: Path, sources_of: Callable[[], list[Path]], progress: bool | Reporter) -> Path:
    """Build `target` from `sources_of()` unless it already exists; the check is repeated under
    the lock so concurrent callers build it once."""
    if (target / SIDECAR).is_file():
        return target
    try:
        files.make_dir(target.parent)
    except OSError as exc:
        raise UserError(
            f"cannot create the cache directory {target.parent} ({exc.strerror}); "
            f"set GPT2_TUI_CACHE to a writable directory"
        ) from exc
    with _locked(target.parent / f"{target.name}.lock"):
        if not (target / SIDECAR).is_file():
            sources = sources_of()
            if not sources:
                raise UserError(
                    f"the Python standard library source was not found at "
                    f"{sysconfig.get_paths()['stdlib']}; pass --data DIR with a prepared dataset"
                )
            _say(f"building the default dataset in {target} (once)...", progress)
            prepare_report(sources, target, vocab_size=DEFAULT_VOCAB, seed=0, progress=progress)
    return target


# --------------------------------------------------------------------------- CLI
