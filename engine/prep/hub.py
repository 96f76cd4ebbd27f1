"""`prepare --hf-dataset`: stream a Hub dataset (or local json/parquet/text/csv files) through
`datasets` into our token format, resumably.

Why streaming: FineWeb-Edu or OpenWebText never has to fit on disk before tokenizing; only
the tokens are written. Documents are tokenized in chunks by `tokenizers`' encode_batch,
which runs on its Rust thread pool (every core), and appended to train.bin / val.bin.

Split: the first document goes to val, then each later document with probability
`val_fraction`, decided by a seeded hash of its index (no shuffle buffer, so the same
stream always splits the same way and a resumed run continues the very same split).
Like `prepare`, ``<|endoftext|>`` precedes every document.

Resume: the work happens in ``.OUT.partial`` beside OUT, with a ``state.json`` saved after
each chunk once the token files are flushed (documents done, tokens per split, the
settings). A rerun with the same settings truncates the token files to the saved counts
(bytes of a chunk cut short are dropped), skips the documents done and continues: the
result is byte-identical to an uninterrupted run. The finished directory is renamed to OUT.

Tokenizer `gpt2`: the Hub's tokenizer.json for GPT-2 read by `tokenizers` (a base
dependency) rather than tiktoken: tiktoken downloads its BPE files at first use from a
host of its own, while tokenizer.json comes through huggingface_hub's cache and its
HF_HUB_OFFLINE, like the weights; offline, pass a local tokenizer.json instead.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import console, files, rundir
from engine.config import SEED_LIMIT
from engine.dataset import FORMAT_NAME, FORMAT_VERSION, SIDECAR, DatasetInfo, Sidecar, dtype_for_vocab, open_dataset
from engine.errors import UserError
from engine.prep.tokenizer import load_tokenizer

EOT = "<|endoftext|>"
LOCAL_BUILDERS = ("json", "parquet", "text", "csv")
STATE = "state.json"
COMMIT_CHARS = 1 << 22  # text per chunk: one encode_batch call, one fsync and one state save


@dataclass(frozen=True)
class HubSource:
    """Where the documents come from: a Hub dataset name (with config and split), or a local
    builder (json, parquet, text, csv) with data_files; and which field holds the text."""

    name: str
    config: str | None = None
    split: str = "train"
    data_files: list[str] = field(default_factory=list)
    text_field: str = "text"


@dataclass
class HubReport:
    """What prepare_hub did, for the CLI's summary line."""

    info: DatasetInfo
    documents: int
    resumed_from: int  # documents already done when this call began (0 = fresh)
    seconds: float


def _need_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("--hf-dataset needs the datasets package; pip install gpt2-tui[datasets]") from None
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its error logs would be a second line (ours names the record)
    return datasets


def resolve_tokenizer(spec: str | Path, cache_dir: Path | None = None) -> Path:
    """`gpt2` (and gpt2-medium...: the same BPE) -> the Hub's tokenizer.json through its
    cache; anything else is a path to a tokenizer.json."""
    from engine.prep import hf

    if str(spec) in hf.HUB_NAMES:
        return hf.hub_tokenizer(str(spec), cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"--tokenizer {spec}: no such file; pass gpt2 or a tokenizer.json (a prepared dataset's works)")
    return path




def _stream(source: HubSource) -> Any:
    """datasets' IterableDataset for `source`; its failures as one line."""
    datasets = _need_datasets()
    local = source.name in LOCAL_BUILDERS
    if local and not source.data_files:
        raise UserError(f"--hf-dataset {source.name} reads local files; pass them with --data-files")
    if local:
        for f in source.data_files:
            if not any(c in f for c in "*?[") and not Path(f).expanduser().exists():
                raise UserError(f"--data-files {f}: no such file; pass existing {source.name} files")
    kwargs: dict[str, Any] = {"split": source.split, "streaming": True}
    if source.data_files:
        kwargs["data_files"] = [str(Path(f).expanduser()) for f in source.data_files]
    if source.name == "text":
        kwargs["sample_by"] = "document"  # one file = one document, as `prepare` does
    try:
        return datasets.load_dataset(source.name, source.config, **kwargs)
    except (FileNotFoundError, ConnectionError, ValueError, OSError) as err:
        why = " ".join(str(err).split())[:200]
        offline = " (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE") else ""
        raise UserError(
            f"--hf-dataset {source.name} cannot be opened{offline}: {why}; check the name, --config and --split, "
            f"or pass local files (--hf-dataset json --data-files ...)"
        ) from None
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds (DatasetNotFoundError...)
        why = " ".join(str(err).split())[:200]
        raise UserError(f"--hf-dataset {source.name} cannot be opened ({type(err).__name__}: {why}); check the name") from None


def _texts(rows: Iterator[dict[str, Any]], source: HubSource) -> Iterator[str | None]:
    """Each row's text (None for a missing value, kept so document indices stay stable)."""
    for row in rows:
        value = row.get(source.text_field) if isinstance(row, dict) else None
        if value is not None and not isinstance(value, str):
            raise UserError(
                f"--text-field {source.text_field} holds {type(value).__name__}, not text; pass the field that holds the text"
            )
        yield value


def _first_row(ds: Any, source: HubSource) -> None:
    """The text field must exist: checked on the first row, before anything is written."""
    try:
        row = next(iter(ds))
    except StopIteration:
        raise UserError(f"--hf-dataset {source.name} split {source.split} is empty; pass another split or files") from None
    except Exception as err:  # noqa: BLE001 - a broken file surfaces here, as datasets' own error
        why = " ".join(str(err).split())[:200]
        raise UserError(f"--hf-dataset {source.name}: its first record cannot be read ({why}); check the files") from None
    fields = list(row) if isinstance(row, dict) else []
    if source.text_field not in fields:
        raise UserError(
            f"--hf-dataset {source.name} has no field {source.text_field!r} (fields: {', '.join(fields)[:200]}); "
            f"pass --text-field with one of them"
        )


def is_val(index: int, val_fraction: float, seed: int) -> bool:
    """Document `index` goes to val: the first always, then a seeded `val_fraction` of the rest."""
    if index == 0:
        return True
    h = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") < val_fraction * 2**64


def _fingerprint(source: HubSource, tokenizer: Path, max_tokens: int | None, val_fraction: float, seed: int) -> dict[str, Any]:
    """What must be equal for a partial prepare to be continued."""
    digest = hashlib.sha256(files.read_bounded(tokenizer, files.TOKENIZER_CAP, follow_links=True)).hexdigest()
    return {"source": asdict(source), "tokenizer_sha256": digest, "max_tokens": max_tokens,
            "val_fraction": val_fraction, "seed": seed}  # fmt: skip


def _save_state(work: Path, state: dict[str, Any]) -> None:
    files.write_text(work / STATE, json.dumps(state, indent=2) + "\n")


def _progress(enabled: bool, total: int | None):  # -> rich Progress, task id
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed or 0:,.0f} tok/s")

    cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,} tokens"),
            Rate(), TimeElapsedColumn(), TimeRemainingColumn()]  # fmt: skip
    bar = Progress(*cols, console=Console(stderr=True), disable=not (enabled and sys.stderr.isatty()))
    return bar, bar.add_task(console.progress_label("tokenizing"), total=total)  # rich shows it: through the printable rule


def prepare_hub(
    source: HubSource,
    out: Path,
    tokenizer: str | Path = "gpt2",
    max_tokens: int | None = None,
    val_fraction: float = 0.005,
    seed: int = 0,
    progress: bool = True,
    cache_dir: Path | None = None,
    commit_chars: int = COMMIT_CHARS,
) -> HubReport:
    """Tokenize `source`'s text field into a gpt2-tui dataset at `out` (resuming a partial one
    left by an interrupted call with the same settings). `max_tokens` caps the total
    (train + val), the last document cut to fit. `cache_dir`: huggingface_hub's, for `gpt2`."""
    t0 = time.perf_counter()
    out = Path(out).expanduser()
    rundir.check_new(out)
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction {val_fraction} is not between 0 and 1; pass e.g. 0.005")
    if max_tokens is not None and max_tokens < 2:
        raise UserError(f"--max-tokens {max_tokens} is too small; pass 2 or more (one token each for train and val)")
    if not 0 <= seed < SEED_LIMIT:
        raise UserError(f"--seed {seed} is out of range; pass 0 to {SEED_LIMIT - 1}")
    tok_path = resolve_tokenizer(tokenizer, cache_dir)
    tok = load_tokenizer(tok_path, keep_special_text=True)  # a literal "<|endoftext|>" in a document stays text
    ds = _stream(source)
    _first_row(ds, source)
    vocab = tok.get_vocab_size()
    eot = tok.token_to_id(EOT)
    dtype = np.dtype(dtype_for_vocab(vocab)).newbyteorder("<")
    fingerprint = _fingerprint(source, tok_path, max_tokens, val_fraction, seed)

    from filelock import FileLock, Timeout

    rundir.make_dir(out.parent)
    work = out.parent / f".{out.name}.partial"
    lock = FileLock(out.parent / f".{out.name}.partial.lock")
    if files.links_in(out.parent, (Path(lock.lock_file).name,)):  # filelock opens it with O_TRUNC: never through a link
        raise UserError(f"{lock.lock_file} is a symbolic link; a prepare writes only its own files: delete it and run the command again")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise UserError(f"another prepare is writing {work}; wait for it, or pass another --out") from None
    try:
        state = _open_work(work, fingerprint, tok_path, dtype)
        done = state["documents"]
        counts = {"train": state["train_tokens"], "val": state["val_tokens"]}
        bar, task = _progress(progress, max_tokens)
        try:
            with bar, files.open_append(work / "train.bin") as ftrain, files.open_append(work / "val.bin") as fval:
                index, counts = _tokenize(ds, source, tok, eot, dtype, state, counts, val_fraction, seed, max_tokens,
                                          commit_chars, work, {"train": ftrain, "val": fval}, bar, task)  # fmt: skip
        except (UserError, _BadRecord) as err:
            files.remove_tree(work)  # the same stream fails the same way: a partial kept would only block the fix
            if isinstance(err, UserError):
                raise
            raise UserError(str(err)) from None
        if counts["train"] == 0 or counts["val"] == 0:
            missing = "train" if counts["train"] == 0 else "val"
            files.remove_tree(work)
            raise UserError(
                f"no {missing} tokens: {index} documents were too few or --max-tokens too small; "
                f"pass more data or a larger --max-tokens"
            )
        sidecar = Sidecar(format=FORMAT_NAME, version=FORMAT_VERSION, dtype=dtype_for_vocab(vocab), vocab_size=vocab,
                          train_tokens=counts["train"], val_tokens=counts["val"], tokenizer="tokenizer.json", eot_id=eot)  # fmt: skip
        files.write_text(work / SIDECAR, sidecar.model_dump_json(indent=2) + "\n")
        files.remove(work / STATE)
        open_dataset(work, preload=False)  # validate before publishing
        try:
            files.rename(work, out)
        except OSError as err:
            raise UserError(f"--out {out} could not be created ({err.strerror}); it may have been filled meanwhile: choose another --out") from None
    finally:
        lock.release()
        files.remove(lock.lock_file)
    info = open_dataset(out, preload=False).info
    return HubReport(info, index, done, time.perf_counter() - t0)


class _BadRecord(Exception):
    """A record the stream could not read (a broken JSON line, a damaged parquet file), as one line."""


def _rows(ds: Any, done: int, source: HubSource) -> Iterator[Any]:
    """The stream's rows after the first `done`; a failure to read one becomes _BadRecord (an
    error the network raises, OSError, stays as it is: a rerun resumes past it)."""
    index = done
    try:
        for row in itertools.islice(iter(ds), done, None):
            yield row
            index += 1
    except (OSError, UserError):
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow, json and datasets raise many kinds
        why = " ".join(str(err).split())[:200]
        raise _BadRecord(f"--hf-dataset {source.name}: record {index + 1} cannot be read ({type(err).__name__}: {why}); "
                         "fix or drop it in the files, then run the command again") from None  # fmt: skip


def _tokenize(ds: Any, source: HubSource, tok: Any, eot: int | None, dtype: np.dtype, state: dict[str, Any],
              counts: dict[str, int], val_fraction: float, seed: int, max_tokens: int | None, commit_chars: int,
              work: Path, outs: dict[str, Any], bar: Any, task: Any) -> tuple[int, dict[str, int]]:  # fmt: skip
    """Encode the stream from the state's document on, appending to the token files and saving
    the state after each chunk; returns the documents done and the tokens per split."""
    from engine.prep.prepare import token_array

    done = state["documents"]
    bar.update(task, completed=sum(counts.values()))
    rows = _rows(ds, done, source)
    vocab = tok.get_vocab_size()
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster
    index = done
    stop = False
    for chunk in _chunked(_texts(rows, source), commit_chars):
        encoded = encode([t or "" for t in chunk], add_special_tokens=False)
        parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
        for text, enc in zip(chunk, encoded):
            if text:  # an empty or missing text is no document (its index still counts)
                ids = ([eot] if eot is not None else []) + enc.ids
                if max_tokens is not None:
                    ids = ids[: max_tokens - sum(counts.values())]
                split = "val" if is_val(index, val_fraction, seed) else "train"
                parts[split].append(token_array(ids, vocab, dtype))
                counts[split] += len(ids)
            index += 1
            if max_tokens is not None and sum(counts.values()) >= max_tokens:
                stop = True
                break
        for split, arrays in parts.items():
            if arrays:
                outs[split].write(np.concatenate(arrays).tobytes())
            outs[split].flush()
            os.fsync(outs[split].fileno())
        _save_state(work, state | {"documents": index, "train_tokens": counts["train"], "val_tokens": counts["val"]})
        bar.update(task, completed=sum(counts.values()))
        if stop:
            break
    return index, counts


def _open_work(work: Path, fingerprint: dict[str, Any], tokenizer: Path, dtype: np.dtype) -> dict[str, Any]:
    """The partial directory's state: a fresh one, or the saved one of an interrupted run with
    the same settings (token files cut back to what its state counted)."""
    foreign = files.not_own_files(work)
    if foreign:  # planted: a link there would be truncated and filled, then published
        raise UserError(f"{work} holds {', '.join(foreign[:3])}, not files of its own (links or special files); "
                        f"a prepare writes only its own files: delete {work} and run the command again")  # fmt: skip
    if work.is_dir() and (work / STATE).is_file():
        try:
            state = files.read_json(work / STATE, files.MiB)
        except (OSError, ValueError):
            state = None
        if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
            raise UserError(
                f"{work} holds an interrupted prepare with other settings; rerun with those settings to finish it, "
                f"or delete {work} to start afresh"
            )
        for split in ("train", "val"):
            files.truncate(work / f"{split}.bin", int(state[f"{split}_tokens"]) * dtype.itemsize)
        return state
    if work.exists():
        files.remove_tree(work)  # a partial that never saved a state holds nothing worth keeping
    files.make_new_dir(work)
    files.copy_file(tokenizer, work / "tokenizer.json", files.TOKENIZER_CAP, follow_links=True)
    for split in ("train", "val"):
        files.atomic_write_bytes(work / f"{split}.bin", b"")
    state = {"fingerprint": fingerprint, "documents": 0, "train_tokens": 0, "val_tokens": 0}
    _save_state(work, state)
    return state


def _chunked(texts: Iterator[str | None], chars: int) -> Iterator[list[str | None]]:
    chunk: list[str | None] = []
    size = 0
    for text in texts:
        chunk.append(text)
        size += len(text or "")
        if size >= chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


BPE_SAMPLE_CHARS = 1 << 26  # text a `--tokenizer bpe` is trained on: the stream's first 64 M characters


def bpe_tokenizer(source: HubSource, vocab_size: int, into: Path, sample_chars: int = BPE_SAMPLE_CHARS) -> Path:
    """`--tokenizer bpe`: a byte-level BPE trained, as `prepare` trains one, on the first
    `sample_chars` of the stream's text, saved as `into`/tokenizer.json. Deterministic for the
    same stream, so an interrupted prepare finds the same tokenizer and resumes."""
    from engine.prep.prepare import train_tokenizer

    ds = _stream(source)
    _first_row(ds, source)
    texts: list[str] = []
    size = 0
    try:
        for text in _texts(_rows(ds, 0, source), source):
            if text:
                texts.append(text)
                size += len(text)
                if size >= sample_chars:
                    break
    except _BadRecord as err:
        raise UserError(str(err)) from None
    path = Path(into) / "tokenizer.json"
    files.atomic_write_bytes(path, train_tokenizer(texts, vocab_size).to_str(pretty=True).encode())  # no link followed
    return path
