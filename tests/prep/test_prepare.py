"""engine.prep.prepare: text -> tokenizer -> token files, the CLI hooks, and the default dataset."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import engine.prep.prepare as prep
from engine.dataset import open_dataset
from engine.errors import UserError
from engine.prep.prepare import default_dataset, prepare_report
from gpt2_tui import main


def prepare(*args, **kwargs):
    """prepare_report (same arguments), for the tests that need only the dataset's DatasetInfo."""
    return prepare_report(*args, **kwargs).info


DOCS = {
    "a.txt": "The quick brown fox jumps over the lazy dog.\n" * 20,
    "b.md": "# Title\n\nSome *markdown* with unicode: héllo wörld ✓ 日本語 🙂\n" * 10,
    "sub/c.py": "def f(x):\n    return x * 2  # doubled\n\n" * 15,
    "sub/deeper/d.rst": "Section\n=======\n\nText with  double  spaces and\ttabs.\n" * 12,
    "e.txt": "  leading spaces, trailing spaces  \n\n\n" * 8 + "a literal <|endoftext|> stays text",
    "f.json": json.dumps({"key": [1, 2, 3], "name": "value"}) * 10,
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for name, text in DOCS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / "binary.txt").write_bytes(b"\x00\x01\xff\xfe" * 50)  # a text suffix, binary content
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8
    (root / "image.bin").write_bytes(b"\x89PNG" * 10)  # not a text suffix: never read
    return root


def split_docs(ids: np.ndarray, eot: int) -> list[np.ndarray]:
    """Token stream -> documents (each document is preceded by EOT)."""
    assert ids[0] == eot
    cuts = np.flatnonzero(ids == eot)
    return [ids[a + 1 : b] for a, b in zip(cuts, list(cuts[1:]) + [len(ids)])]


def rejoined(train_docs: list[str], val_docs: list[str], originals: list[str]) -> list[str]:
    """Each document as its train head + its val tail (issue 22: split by tokens, the tail held
    out); every val piece is some document's tail."""
    val = list(val_docs)
    out = []
    for head in train_docs:
        orig = next(o for o in originals if o.startswith(head) and (o == head or o[len(head):] in val))
        if orig != head:
            val.remove(orig[len(head):])
        out.append(orig)
    assert val == [], val  # no val text that is not a tail of a train head
    return out


def test_prepare_round_trip(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    info = prepare([corpus], out, vocab_size=300, val_fraction=0.2, seed=0, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "tokenizer.json", "train.bin", "val.bin"]
    car = json.loads((out / "dataset.json").read_text())
    assert car == {
        "format": "gpt2-tui", "version": 1, "dtype": "uint16", "vocab_size": info.vocab_size,
        "train_tokens": info.train_tokens, "val_tokens": info.val_tokens,
        "tokenizer": "tokenizer.json", "eot_id": 0,
    }  # fmt: skip
    assert info.format == "gpt2-tui" and info.dtype == "uint16" and info.eot_id == 0
    assert 257 <= info.vocab_size <= 300
    assert info.tokenizer == str((out / "tokenizer.json").resolve())
    assert (out / "train.bin").stat().st_size == 2 * info.train_tokens

    tok = Tokenizer.from_file(info.tokenizer)
    assert tok.token_to_id("<|endoftext|>") == 0
    tok.encode_special_tokens = True  # as prepare encodes documents: "<|endoftext|>" is text
    for text in DOCS.values():
        assert tok.decode(tok.encode(text).ids) == text
    # The files hold exactly the documents, EOT-separated: each one's head in train, its tail in val.
    train_docs, val_docs = (
        [tok.decode(d.tolist()) for d in split_docs(np.fromfile(out / f"{split}.bin", dtype="<u2"), 0)]
        for split in ("train", "val")
    )
    assert len(train_docs) == 6 and 1 <= len(val_docs) <= 6  # every document gives train its head
    assert sorted(rejoined(train_docs, val_docs, list(DOCS.values()))) == sorted(DOCS.values())
    assert 0.1 < info.val_tokens / (info.train_tokens + info.val_tokens) < 0.3  # about 20% of the tokens


def test_prepare_is_deterministic_and_seeded(corpus: Path, tmp_path: Path) -> None:
    a = prepare([corpus], tmp_path / "a", vocab_size=300, val_fraction=0.5, seed=1, progress=False)
    b = prepare([corpus], tmp_path / "b", vocab_size=300, val_fraction=0.5, seed=1, progress=False)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (a.train_tokens, a.val_tokens) == (b.train_tokens, b.val_tokens)
    splits = {
        (tmp_path / "a" / "val.bin").read_bytes(),
        *(
            (tmp_path / f"s{s}" / "val.bin").read_bytes()
            for s in range(2, 5)
            if prepare([corpus], tmp_path / f"s{s}", vocab_size=300, val_fraction=0.5, seed=s, progress=False)
        ),
    }
    assert len(splits) > 1  # another seed, another order of the documents


def test_prepare_with_given_tokenizer(corpus: Path, tmp_path: Path) -> None:
    first = prepare([corpus], tmp_path / "one", vocab_size=300, progress=False)
    tok_file = Path(first.tokenizer)
    second = prepare([corpus], tmp_path / "two", tokenizer=tok_file, progress=False)
    assert (tmp_path / "two" / "tokenizer.json").read_bytes() == tok_file.read_bytes()
    assert second.vocab_size == first.vocab_size
    assert (tmp_path / "two" / "train.bin").read_bytes() == (tmp_path / "one" / "train.bin").read_bytes()


def test_prepare_uint32_for_big_vocab(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.add_tokens([f"word{i}" for i in range(70_000)])
    tok.save(str(tmp_path / "big.json"))
    (corpus / "g.txt").write_text("word69999 word5 word12345 " * 5)
    info = prepare([corpus], tmp_path / "out", tokenizer=tmp_path / "big.json", progress=False)
    assert info.dtype == "uint32" and info.vocab_size > 65536
    ds = open_dataset(tmp_path / "out")
    ids = np.concatenate([s.read(0, s.count) for s in (ds.train.shards[0], ds.val.shards[0])])
    assert ids.max() >= 65536


def test_existing_out_is_refused_and_untouched(corpus: Path, tmp_path: Path, file_tree) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = file_tree(tmp_path)
    with pytest.raises(UserError) as err:
        prepare([corpus], out, vocab_size=300, progress=False)
    assert "\n" not in str(err.value) and "choose a new or empty directory" in str(err.value)
    assert file_tree(tmp_path) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare([corpus], empty, vocab_size=300, progress=False)  # an empty directory is fine
    assert (empty / "dataset.json").is_file()


def _bad_cases(corpus: Path, tmp_path: Path) -> dict[str, tuple[dict, str]]:
    one = tmp_path / "one"
    one.mkdir()
    (one / "only.txt").write_text("x")  # one character: no tail to hold out (issue 22: one file is fine)
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "x.bin").write_bytes(b"\0\1")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    return {
        "missing input": (dict(paths=[tmp_path / "nope"]), "does not exist"),
        "too short": (dict(paths=[one]), "too short to hold out"),
        "no text": (dict(paths=[nothing]), "no readable UTF-8 text"),
        "no paths": (dict(paths=[]), "no input"),
        "val fraction 0": (dict(val_fraction=0.0), "--val-fraction"),
        "val fraction 1": (dict(val_fraction=1.0), "--val-fraction"),
        "vocab too small": (dict(vocab_size=100), "--vocab-size 100"),
        "broken tokenizer": (dict(tokenizer=broken), "cannot be loaded"),
        "missing tokenizer": (dict(tokenizer=tmp_path / "nope.json"), "does not exist"),
        "out is a file": (dict(out=broken), "is a file"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing input", "too short", "no text", "no paths", "val fraction 0", "val fraction 1",
     "vocab too small", "broken tokenizer", "missing tokenizer", "out is a file"],
)  # fmt: skip
def test_bad_input_is_one_line_user_error(corpus: Path, tmp_path: Path, file_tree, case: str) -> None:
    kwargs, needle = _bad_cases(corpus, tmp_path)[case]
    args = dict(paths=[corpus], out=tmp_path / "new" / "data", vocab_size=300, progress=False) | kwargs
    before = file_tree(tmp_path)
    with pytest.raises(UserError) as err:
        prepare(**args)
    msg = str(err.value)
    assert "\n" not in msg and needle in msg, msg
    assert file_tree(tmp_path) == before  # not even the parent of --out was created


def test_crash_leaves_no_half_dataset(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_encode_to_file", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare([corpus], tmp_path / "out" / "data", vocab_size=300, progress=False)
    assert list((tmp_path / "out").iterdir()) == []  # no data dir, no temp dir left behind


def test_cli_arguments(corpus: Path, tmp_path: Path, capsys) -> None:
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "d"), "--vocab-size", "300", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "d") in out and "train" in out and "3 files skipped" in out
    from engine.cli import build_parser

    parser, _ = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["prepare", str(corpus), "--out", "x", "--vocab-size", "300", "--tokenizer", "t.json"])
    defaults = parser.parse_args(["prepare", str(corpus), "--out", "x"])
    assert (defaults.vocab_size, defaults.tokenizer, defaults.val_fraction, defaults.seed) == (8192, None, 0.05, 0)


def test_cached_build_is_built_once_under_concurrency(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = prep.prepare_report

    def counting(*args, **kwargs):
        calls.append(1)
        time.sleep(0.3)  # widen the race window
        return real(*args, **kwargs)

    monkeypatch.setattr(prep, "prepare_report", counting)
    files = sorted(p for p in corpus.rglob("*") if p.is_file())
    target = tmp_path / "cache" / "demo"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(prep._cached_build(target, lambda: files, False)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target] * 3 and len(calls) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["demo", "demo.lock"]


@pytest.mark.slow
def test_default_dataset_builds_once_and_is_reused(tmp_path: Path, monkeypatch, file_tree) -> None:
    monkeypatch.setenv("GPT2_TUI_CACHE", str(tmp_path / "cache"))
    path = default_dataset(progress=False)
    assert path.parent == tmp_path / "cache" and path.name.startswith("stdlib-py") and path.name.endswith("-v8192")
    before = file_tree(path)
    t0 = time.perf_counter()
    assert default_dataset(progress=False) == path
    assert time.perf_counter() - t0 < 0.5
    assert file_tree(path) == before
    info = open_dataset(path).info
    assert info.vocab_size == 8192 and info.dtype == "uint16" and info.eot_id == 0
    assert info.train_tokens > 1_000_000 and info.val_tokens > 10_000
    tok = Tokenizer.from_file(info.tokenizer)
    tok.encode_special_tokens = True
    text = Path(prep.__file__).read_text()
    assert tok.decode(tok.encode(text).ids) == text
    # An explicit cache_dir wins over the environment.
    assert default_dataset(cache_dir=tmp_path / "cache", progress=False) == path


def test_extensionless_and_gzipped_text_is_read_and_every_skip_is_named(tmp_path: Path, capsys) -> None:
    import gzip

    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    kept = {
        "README": "A readme without a suffix, plain UTF-8 text.\n" * 5,
        "sub/notes.txt.gz": "gzipped notes, to be read as text\n" * 5,
        "sub/corpus.gz": "a gzipped file whose inner name has no suffix\n" * 5,
        "a.txt": "ordinary text file\n" * 5,
    }
    for name, text in kept.items():
        data = text.encode()
        (root / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    (root / "sub" / "broken.gz").write_bytes(b"not gzip at all")
    (root / "image.png").write_bytes(b"\x89PNG\r\n" * 10)
    (root / "tool").write_bytes(b"\x7fELF\x00\x00\x01" * 10)  # extensionless, binary
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "empty.md").write_text("")
    out = tmp_path / "data"
    assert main(["prepare", str(root), "--out", str(out), "--vocab-size", "300", "--val-fraction", "0.25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "5 files skipped" in lines[0]
    assert lines[1] == (
        f"skipped 5 files: {root / 'image.png'} (not a text type), {root / 'empty.md'} (empty), "
        f"{root / 'latin1.txt'} (not UTF-8), {root / 'tool'} (binary), "
        f"{root / 'sub' / 'broken.gz'} (not a valid gzip file)"
    )  # those of a type not read, then those read and found wanting, in walk order
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    train_docs, val_docs = (
        [tok.decode(d.tolist()) for d in split_docs(np.fromfile(out / f"{split}.bin", dtype="<u2"), 0)]
        for split in ("train", "val")
    )
    assert sorted(rejoined(train_docs, val_docs, list(kept.values()))) == sorted(kept.values())


def test_a_gzip_that_unpacks_past_the_bound_is_skipped_not_read_whole(tmp_path: Path, capsys, monkeypatch) -> None:
    """A gzip bomb (1 KiB of zeros' worth here, the bound lowered to match) is named as such;
    the file is read only up to the bound."""
    import gzip

    from engine.prep import prepare as prep

    monkeypatch.setattr(prep, "MAX_GUNZIP_BYTES", 4096)
    root = tmp_path / "in"
    root.mkdir()
    for i in range(2):
        (root / f"{i}.txt").write_text(f"ordinary text file {i}\n" * 50)
    (root / "bomb.txt.gz").write_bytes(gzip.compress(b"x" * 100_000))
    out = tmp_path / "data"
    assert main(["prepare", str(root), "--out", str(out), "--vocab-size", "300", "--val-fraction", "0.25"]) == 0
    said = capsys.readouterr().out
    assert f"{root / 'bomb.txt.gz'} (unpacks to more than" in said


def test_skipped_list_is_capped_and_names_are_one_safe_line(tmp_path: Path, capsys) -> None:
    root = tmp_path / "in"
    root.mkdir()
    for i in range(2):
        (root / f"doc{i}.txt").write_text(f"document {i}\n" * 20)
    for i in range(12):
        (root / f"blob{i:02d}.bin").write_bytes(b"\x00")
    (root / "a\nb\x1b[2J.bin").write_bytes(b"\x00")
    assert main(["prepare", str(root), "--out", str(tmp_path / "d"), "--vocab-size", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("skipped 13 files: ")
    assert lines[1].count("(not a text type)") == prep.SKIPPED_NAMED and lines[1].endswith(" and 3 more")
    assert f"{root}/a\\nb\\x1b[2J.bin (not a text type)" in lines[1]  # sorted first; escaped, not raw


def test_no_text_error_names_what_was_skipped(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "x.bin").write_bytes(b"\0\1")
    (root / "y.txt").write_bytes(b"\0\1")
    with pytest.raises(UserError) as err:
        prepare([root], tmp_path / "out", vocab_size=300, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and f"2 files skipped: {root / 'x.bin'} (not a text type), {root / 'y.txt'} (binary)" in msg


def test_bpe_training_says_when_it_starts_and_how_long_it_took(corpus: Path, tmp_path: Path, capsys) -> None:
    """stderr is no terminal here: a start line and a done line with the time (never on stdout)."""
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "d"), "--vocab-size", "300"]) == 0
    got = capsys.readouterr()
    assert re.search(r"^training a 300-token BPE on \d+ documents\.\.\.$", got.err, re.M), got.err
    assert re.search(r"^training a 300-token BPE on \d+ documents: done in \d+\.\d s$", got.err, re.M), got.err
    assert "BPE" not in got.out and got.out.startswith("wrote ")
