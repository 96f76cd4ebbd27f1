"""The dataset on disk: its formats, read and validated, and nothing about batches.

Three formats are read (detected from the directory):

- ``gpt2-tui`` (ours): ``dataset.json`` sidecar + ``train.bin`` + ``val.bin`` of raw
  little-endian ``uint16`` (vocab <= 65536) or ``uint32`` token ids.
- ``nanogpt``: ``train.bin`` + ``val.bin`` of raw ``uint16``, no sidecar; the vocabulary
  comes from the caller (GPT-2's 50257 by default).
- ``llmc``: llm.c shards ``*train*.bin`` / ``*val*.bin``, each a 256-int32 header (magic
  20240520, version 1, token count) followed by ``uint16`` tokens; several train shards
  form one logical split.

Everything a user can get wrong is checked in `open_dataset` and reported as a one-line
`UserError`, so the trainer never starts on data it would crash on hours later. A foundation:
engine.prep writes this format, engine.train.batches samples it, the estimator and doctor read it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import files
from engine import config as _  # noqa: F401  (the flags its refusals' fixes are worded with)
from engine.errors import UserError
from engine.text import path_text, program

LLMC_MAGIC = 20240520
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
SIDECAR = "dataset.json"
FORMAT_NAME = "gpt2-tui"
FORMAT_VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_SCAN_CHUNK = 1 << 24  # tokens per chunk when scanning a split for out-of-vocab ids
_EXPECTED = (
    "expected dataset.json + train.bin + val.bin (gpt2-tui), train.bin + val.bin (nanoGPT) "
    "or *train*.bin + *val*.bin shards (llm.c)"
)


def dtype_for_vocab(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id of a vocabulary (never int16)."""
    return "uint16" if vocab_size <= 65536 else "uint32"


class DatasetInfo(BaseModel):
    """What a dataset directory holds; enough for the model and the UI to size themselves."""

    format: Literal["gpt2-tui", "nanogpt", "llmc"]
    path: str
    dtype: str
    vocab_size: int
    train_tokens: int
    val_tokens: int
    tokenizer: str | None  # absolute path, or None when the dataset carries none
    eot_id: int | None


class Sidecar(BaseModel):
    """The ``dataset.json`` of our format. Strict: a typo or a wrong type is an error."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal["gpt2-tui"]  # FORMAT_NAME
    version: Literal[1]  # FORMAT_VERSION
    dtype: str
    vocab_size: int = Field(ge=2)
    train_tokens: int = Field(ge=0)
    val_tokens: int = Field(ge=0)
    tokenizer: str | None
    eot_id: int | None = Field(ge=0)


# --------------------------------------------------------------------------- token files


class DataFailed(UserError):
    """A token file changed under a running (not preloaded) run: the trainer saves and stops."""


@dataclass
class Shard:
    """One file of tokens: where they start in it, how many, and (if preloaded) the array."""

    path: Path
    offset: int  # bytes of header before the first token
    count: int
    dtype: np.dtype
    data: np.ndarray | None = None

    def windows(self, offsets: np.ndarray, width: int) -> np.ndarray:
        """(len(offsets), width) tokens, row i starting at token offsets[i]: a gather from the
        RAM copy, else one positioned read per row from a file opened afresh."""
        if self.data is not None:
            return sliding_window_view(self.data, width)[offsets]
        out = np.empty((len(offsets), width), dtype=self.dtype)
        with self._opened() as fd:
            for row, start in zip(out, offsets.tolist()):
                self._read_into(fd, row, start)
        return out

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count): a view of the RAM copy, or read from the file now."""
        if self.data is not None:
            return self.data[start : start + count]
        out = np.empty(count, dtype=self.dtype)
        with self._opened() as fd:
            self._read_into(fd, out, start)
        return out

    @contextmanager
    def _opened(self) -> Iterator[int]:
        """The file, opened for this read only. Reads are pread, never a memmap: a file cut
        under a mapping kills the process (SIGBUS) where a short read is an error we can
        handle; the run saves and stops. O_NONBLOCK: a file swapped for a FIFO cannot block."""
        try:
            fd = files.open_regular(self.path, follow_links=True)  # the user's dataset: a link is theirs
        except files.Refused:
            raise DataFailed(self._shrunk("no longer a regular file")) from None
        except OSError as err:
            raise DataFailed(self._shrunk(err.strerror or str(err))) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _read_into(self, fd: int, out: np.ndarray, start: int) -> None:
        """Fill `out` with the tokens from `start` on; a short read is a DataFailed."""
        view = memoryview(out).cast("B")
        pos, done = self.offset + start * self.dtype.itemsize, 0
        try:
            while done < len(view):
                got = os.preadv(fd, [view[done:]], pos + done)
                if got == 0:
                    raise DataFailed(self._shrunk(f"ends before byte {pos + len(view)}"))
                done += got
        except OSError as err:
            raise DataFailed(self._shrunk(err.strerror or str(err))) from None

    def _shrunk(self, what: str) -> str:
        return (f"{self.path} changed under the run ({what}): it was truncated, replaced or removed "
                "while training read it; restore it, then continue the run with --resume")  # fmt: skip

    def load(self) -> None:
        data = np.empty(self.count, dtype=self.dtype)
        try:
            with files.open_read(self.path, offset=self.offset, follow_links=True) as f:
                got = f.readinto(memoryview(data).cast("B"))
        except OSError as err:
            raise UserError(f"cannot read {self.path} ({err.strerror or err}); check the file and retry") from None
        self.data = data[: got // self.dtype.itemsize]
        if len(self.data) != self.count:
            raise UserError(f"{self.path} was truncated while being read; check the file and retry")


class TokenSplit:
    """One split (train or val): one or more shards sampled as a single token stream."""

    def __init__(self, name: str, shards: list[Shard]) -> None:
        self.name = name
        self.shards = shards

    @property
    def preload(self) -> bool:
        """True once every shard is in RAM."""
        return all(s.data is not None for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.count for s in self.shards)

    def __len__(self) -> int:
        return self.num_tokens

    def check_block(self, block_size: int) -> None:
        """Every shard must hold a whole window (block_size + 1 tokens): windows never span
        two files, and a short shard would otherwise surface as a numpy error mid-run."""
        if block_size < 1:
            raise UserError(f"block size {block_size} is not positive", {"train.block_size": "1 or more"})
        shortest = min(self.shards, key=lambda s: s.count)
        if shortest.count < block_size + 1:
            where = f" in {shortest.path.name}" if len(self.shards) > 1 else ""
            fixes = [{"train.block_size": f"{shortest.count - 1} or less"}] if shortest.count >= 2 else []
            raise UserError(f"the {self.name} split has {shortest.count} tokens{where}, fewer than "
                         f"block size {block_size} + 1", *fixes, also="use more data")  # fmt: skip


class Dataset:
    """An opened, validated dataset: `info` plus the `train` and `val` splits."""

    def __init__(self, info: DatasetInfo, train: TokenSplit, val: TokenSplit) -> None:
        self.info = info
        self.train = train
        self.val = val

    def check_block(self, block_size: int) -> None:
        """UserError unless both splits can yield a window of block_size + 1 tokens."""
        self.train.check_block(block_size)
        self.val.check_block(block_size)


# --------------------------------------------------------------------------- open + validate


def not_a_dataset(path: Path) -> UserError:
    """A file given as the dataset, and what to do instead: its directory, when it is one file
    of a dataset; else tokenize it once (`prepare` is a shell step) and give the result."""
    if path.suffix == ".bin" or path.name == SIDECAR:
        return UserError(f"{path_text(path.name)} is one file of a dataset, not a dataset directory: "
                         "give the directory that holds it", {"data.path": path_text(path.parent)})  # fmt: skip
    out = path.with_name(path.stem + "-tokens")
    return UserError(
        f"{path_text(path)} is a text file, not a tokenized dataset: tokenize it once, in a shell: "
        f"`{program()} prepare {path_text(path)} --out {path_text(out)}`, then use the result",
        {"data.path": path_text(out)},
    )


def check_dir(root: Path) -> list[Path]:
    """A dataset path that is a readable directory (its entries), or one line saying what it is
    instead; cheap enough for the estimator, which does not open token files."""
    if root.is_symlink() and not root.exists():
        raise UserError(f"dataset path {root} is a symbolic link that leads nowhere (a loop or a missing target)",
                     {"data.path": "the dataset directory itself"})  # fmt: skip
    if not root.exists():
        raise UserError(f"dataset directory {root} does not exist (make one with `{program()} prepare TEXT... --out DIR`)",
                     {"data.path": "an existing directory"})  # fmt: skip
    if not root.is_dir():
        raise not_a_dataset(root)
    try:
        return list(root.iterdir())
    except OSError as exc:
        raise UserError(f"cannot read dataset directory {root} ({exc.strerror}); check its permissions") from exc


def open_dataset(path: str | Path, vocab_size: int = 50257, preload: bool = True) -> Dataset:
    """Detect the format of a dataset directory, validate it fully, and open it.

    vocab_size applies to nanoGPT and llm.c files, which do not record one; our format
    carries its own in dataset.json. With preload the token files are read into RAM.
    """
    root = Path(path).expanduser()
    names = {p.name for p in check_dir(root)}
    root = root.resolve()

    if SIDECAR in names:
        info, train, val = _open_ours(root)
    else:
        train_files = sorted(p for p in root.glob("*train*.bin") if p.is_file())
        val_files = sorted(p for p in root.glob("*val*.bin") if p.is_file())
        if not train_files and not val_files:
            raise UserError(
                f"{root} is not a recognised dataset: {_EXPECTED}; "
                f"make one with `{program()} prepare TEXT... --out DIR`"
            )
        if not train_files or not val_files:
            missing = "train" if not train_files else "val"
            raise UserError(
                f"{root} has no {missing} file ({_EXPECTED}); add the {missing} split "
                f"or prepare the dataset again"
            )
        candidates = train_files + val_files
        if any(_has_llmc_magic(p) for p in candidates):
            info, train, val = _open_llmc(root, train_files, val_files, vocab_size)
        elif {"train.bin", "val.bin"} <= names:
            info, train, val = _open_nanogpt(root, vocab_size)
        else:
            raise UserError(
                f"{root} holds {', '.join(p.name for p in candidates)} without llm.c headers "
                f"(magic {LLMC_MAGIC}); nanoGPT files must be named train.bin and val.bin"
            )

    for split in (train, val):
        if split.num_tokens == 0:
            raise UserError(f"the {split.name} split of {root} holds no tokens; prepare the dataset again")
        if preload:
            for shard in split.shards:
                shard.load()
        _check_ids(split, info)
    return Dataset(info, train, val)


def _open_ours(root: Path) -> tuple[DatasetInfo, TokenSplit, TokenSplit]:
    sidecar_path = root / SIDECAR
    try:
        raw = files.read_json(sidecar_path, files.MiB, follow_links=True)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{sidecar_path} is not readable JSON ({exc}); fix it or prepare the dataset again"
        ) from exc
    if isinstance(raw, dict) and raw.get("dtype") == "int16":
        raise UserError(
            f"{sidecar_path} says dtype int16, which cannot hold ids above 32767; "
            f"token files must be uint16 or uint32: prepare the dataset again"
        )
    try:
        car = Sidecar.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'top level'}: {e['msg']}" for e in exc.errors()
        )
        raise UserError(f"{sidecar_path} is invalid ({problems}); fix it or prepare the dataset again") from exc
    if car.dtype not in DTYPES:
        raise UserError(
            f"{sidecar_path} has unknown dtype {car.dtype!r}; it must be uint16 or uint32: "
            f"fix it or prepare the dataset again"
        )
    if car.dtype == "uint16" and car.vocab_size > 65536:
        raise UserError(
            f"{sidecar_path} says dtype uint16 with vocab_size {car.vocab_size} > 65536; "
            f"such a vocabulary needs uint32: prepare the dataset again"
        )
    if car.eot_id is not None and car.eot_id >= car.vocab_size:
        raise UserError(
            f"{sidecar_path} has eot_id {car.eot_id} outside vocab_size {car.vocab_size}; "
            f"fix it or prepare the dataset again"
        )
    tokenizer = None
    if car.tokenizer is not None:
        tok_path = (root / car.tokenizer).resolve()
        if not tok_path.is_relative_to(root.resolve()):
            raise UserError(
                f"{sidecar_path} names tokenizer {car.tokenizer}, outside the dataset directory; "
                "put the tokenizer.json inside it and name it relative to it"
            )
        if not tok_path.is_file():
            raise UserError(
                f"{sidecar_path} names tokenizer {car.tokenizer}, which is missing; "
                f'put it back or set "tokenizer" to null'
            )
        tokenizer = str(tok_path)
    dtype = DTYPES[car.dtype]
    splits = []
    for name, expected in (("train", car.train_tokens), ("val", car.val_tokens)):
        file = root / f"{name}.bin"
        if not file.is_file():
            raise UserError(f"{root} has {SIDECAR} but no {name}.bin; prepare the dataset again")
        count = _raw_count(file, 0, dtype)
        if count != expected:
            raise UserError(
                f"{SIDECAR} says {name}_tokens={expected} but {file} holds {count} tokens; "
                f"the dataset is incomplete or corrupt: prepare it again"
            )
        splits.append(TokenSplit(name, [Shard(file, 0, count, dtype)]))
    info = DatasetInfo(
        format="gpt2-tui",
        path=str(root),
        dtype=car.dtype,
        vocab_size=car.vocab_size,
        train_tokens=car.train_tokens,
        val_tokens=car.val_tokens,
        tokenizer=tokenizer,
        eot_id=car.eot_id,
    )
    return info, splits[0], splits[1]


def _open_nanogpt(root: Path, vocab_size: int) -> tuple[DatasetInfo, TokenSplit, TokenSplit]:
    _check_vocab_arg(vocab_size, 65536)
    dtype = DTYPES["uint16"]
    train, val = (
        TokenSplit(name, [Shard(file, 0, _raw_count(file, 0, dtype), dtype)])
        for name, file in (("train", root / "train.bin"), ("val", root / "val.bin"))
    )
    info = DatasetInfo(
        format="nanogpt", path=str(root), dtype="uint16", vocab_size=vocab_size,
        train_tokens=train.num_tokens, val_tokens=val.num_tokens, tokenizer=None, eot_id=None,
    )  # fmt: skip
    return info, train, val


def _open_llmc(
    root: Path, train_files: list[Path], val_files: list[Path], vocab_size: int
) -> tuple[DatasetInfo, TokenSplit, TokenSplit]:
    _check_vocab_arg(vocab_size, 65536)
    train = TokenSplit("train", [_llmc_shard(p) for p in train_files])
    val = TokenSplit("val", [_llmc_shard(p) for p in val_files])
    info = DatasetInfo(
        format="llmc", path=str(root), dtype="uint16", vocab_size=vocab_size,
        train_tokens=train.num_tokens, val_tokens=val.num_tokens, tokenizer=None, eot_id=None,
    )  # fmt: skip
    return info, train, val


def _check_vocab_arg(vocab_size: int, limit: int) -> None:
    if not 2 <= vocab_size <= limit:
        raise UserError(f"--vocab-size {vocab_size} is out of range for uint16 token files; pass 2..{limit}")


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); check the file and its permissions") from exc


def _raw_count(path: Path, offset: int, dtype: np.dtype) -> int:
    """Tokens in a file after its header; the size must be a whole number of tokens."""
    payload = _file_size(path) - offset
    if payload % dtype.itemsize:
        raise UserError(
            f"{path} is {payload} bytes after its header, not a multiple of {dtype.itemsize} "
            f"({dtype.name} tokens): the file is truncated or not a token file; prepare it again"
        )
    return payload // dtype.itemsize


def _read_header(path: Path) -> np.ndarray | None:
    try:
        with files.open_read(path, follow_links=True) as f:
            head = f.read(LLMC_HEADER_BYTES)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); check the file and its permissions") from exc
    if len(head) < LLMC_HEADER_BYTES:
        return None
    return np.frombuffer(head, dtype="<i4")


def _has_llmc_magic(path: Path) -> bool:
    header = _read_header(path)
    return header is not None and int(header[0]) == LLMC_MAGIC


def _llmc_shard(path: Path) -> Shard:
    header = _read_header(path)
    if header is None:
        raise UserError(
            f"{path} is shorter than the {LLMC_HEADER_BYTES}-byte llm.c header; "
            f"the shard is truncated: regenerate it"
        )
    if int(header[0]) != LLMC_MAGIC:
        raise UserError(
            f"{path} has magic {int(header[0])}, not llm.c's {LLMC_MAGIC}; "
            f"remove it from the directory or regenerate it with llm.c's scripts"
        )
    if int(header[1]) != LLMC_VERSION:
        raise UserError(
            f"{path} is llm.c format version {int(header[1])}; only version {LLMC_VERSION} "
            f"(uint16 GPT-2 tokens) is supported: regenerate it with the GPT-2 tokenizer"
        )
    dtype = DTYPES["uint16"]
    count = _raw_count(path, LLMC_HEADER_BYTES, dtype)
    if int(header[2]) != count:
        raise UserError(
            f"{path} header says {int(header[2])} tokens but the file holds {count}; "
            f"the shard is truncated or corrupt: regenerate it"
        )
    return Shard(path, LLMC_HEADER_BYTES, count, dtype)


def _check_ids(split: TokenSplit, info: DatasetInfo) -> None:
    """Scan the whole split in chunks: one bad id would otherwise crash (or, on CUDA,
    silently corrupt) the embedding lookup at some random step."""
    for shard in split.shards:
        largest = 0
        for start in range(0, shard.count, _SCAN_CHUNK):
            largest = max(largest, int(shard.read(start, min(_SCAN_CHUNK, shard.count - start)).max()))
        if largest >= info.vocab_size:
            problem = f"{shard.path} holds token id {largest}, not below vocab size {info.vocab_size}"
            if info.format == "gpt2-tui":
                raise UserError(problem, also=f"{SIDECAR} is wrong or the file is corrupt: prepare the dataset again")
            raise UserError(problem, {"model.vocab_size": f"{largest + 1} (or the tokenizer's real vocabulary size)"})
