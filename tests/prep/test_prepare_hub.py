"""Issue 24: `prepare --hf-dataset` through datasets' streaming path, offline, on local files
the tests write; checked against encoding the same texts directly with `tokenizers`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.prep import hub as ph
from engine.dataset import open_dataset
from engine.errors import UserError


@pytest.fixture(autouse=True)
def _needs_datasets() -> None:
    """datasets, imported when a test here runs, never at collection (offline: conftest)."""
    pytest.importorskip("datasets")

EOT = "<|endoftext|>"


def _docs(n: int = 60) -> list[str]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, size=int(rng.integers(5, 80)))) + f" ({i})." for i in range(n)]
    docs[7] = f"a literal {EOT} inside a document stays text"
    docs[11] = "ünïcödé ✓ and 日本語"
    return docs


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE with <|endoftext|>, GPT-2's kind of tokenizer, trained here (offline)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator(_docs(), trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "docs.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(_docs()):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


def _expected(tok_file: Path, docs: list[str], val_fraction: float = 0.005, seed: int = 0) -> dict[str, list[int]]:
    """Each document encoded on its own, EOT before it, in stream order, per split."""
    tok = Tokenizer.from_file(str(tok_file))
    tok.encode_special_tokens = True
    eot = tok.token_to_id(EOT)
    out: dict[str, list[int]] = {"train": [], "val": []}
    for i, text in enumerate(docs):
        out["val" if ph.is_val(i, val_fraction, seed) else "train"] += [eot] + tok.encode(text, add_special_tokens=False).ids
    return out


def _tokens(d: Path, split: str) -> list[int]:
    return np.fromfile(d / f"{split}.bin", dtype="<u2").tolist()


def test_streamed_json_equals_direct_encoding(jsonl: Path, tok_file: Path, tmp_path: Path) -> None:
    src = ph.HubSource("json", data_files=[str(jsonl)])
    report = ph.prepare_hub(src, tmp_path / "ds", tokenizer=tok_file, val_fraction=0.1, progress=False, commit_chars=500)
    want = _expected(tok_file, _docs(), val_fraction=0.1)
    assert _tokens(tmp_path / "ds", "train") == want["train"]
    assert _tokens(tmp_path / "ds", "val") == want["val"]
    assert len(want["val"]) > 0 and len(want["train"]) > 0
    info = open_dataset(tmp_path / "ds", preload=False).info
    assert (info.format, info.vocab_size, info.eot_id) == ("gpt2-tui", 400, 0)
    assert (info.train_tokens, info.val_tokens) == (len(want["train"]), len(want["val"]))
    assert report.documents == 60 and report.resumed_from == 0
    assert (tmp_path / "ds" / "tokenizer.json").read_bytes() == tok_file.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no partial, no lock left


def test_max_tokens_cuts_the_stream_exactly(jsonl: Path, tok_file: Path, tmp_path: Path) -> None:
    src = ph.HubSource("json", data_files=[str(jsonl)])
    ph.prepare_hub(src, tmp_path / "ds", tokenizer=tok_file, max_tokens=500, val_fraction=0.1, progress=False, commit_chars=300)
    train, val = _tokens(tmp_path / "ds", "train"), _tokens(tmp_path / "ds", "val")
    assert len(train) + len(val) == 500
    want = _expected(tok_file, _docs(), val_fraction=0.1)
    assert train == want["train"][: len(train)] and val == want["val"][: len(val)]


def test_interrupted_prepare_resumes_to_the_same_bytes(
    jsonl: Path, tok_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = ph.HubSource("json", data_files=[str(jsonl)])
    kw = dict(tokenizer=tok_file, val_fraction=0.1, progress=False, commit_chars=400)
    ph.prepare_hub(src, tmp_path / "whole", **kw)
    real_save = ph._save_state
    calls = []

    def interrupted(work: Path, state: dict) -> None:
        calls.append(state["documents"])
        if len(calls) == 4:  # after chunk 3's tokens hit the files, before its state is saved: a torn chunk
            raise KeyboardInterrupt
        real_save(work, state)

    monkeypatch.setattr(ph, "_save_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ph.prepare_hub(src, tmp_path / "cut", **kw)
    partial = tmp_path / ".cut.partial"
    saved = json.loads((partial / "state.json").read_text())
    assert 0 < saved["documents"] < 60 and not (tmp_path / "cut").exists()
    assert (partial / "train.bin").stat().st_size > 2 * saved["train_tokens"]  # the torn chunk's bytes are there
    monkeypatch.setattr(ph, "_save_state", real_save)
    report = ph.prepare_hub(src, tmp_path / "cut", **kw)
    assert report.resumed_from == saved["documents"]
    for name in ("train.bin", "val.bin", "dataset.json", "tokenizer.json"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    # other settings over a partial are refused, not mixed in
    monkeypatch.setattr(ph, "_save_state", interrupted)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        ph.prepare_hub(src, tmp_path / "mix", **kw)
    monkeypatch.setattr(ph, "_save_state", real_save)
    with pytest.raises(UserError, match="interrupted prepare with other settings"):
        ph.prepare_hub(src, tmp_path / "mix", **(kw | {"seed": 5}))


def test_missing_text_field_is_one_line_and_writes_nothing(jsonl: Path, tok_file: Path, tmp_path: Path) -> None:
    src = ph.HubSource("json", data_files=[str(jsonl)], text_field="content")
    with pytest.raises(UserError) as err:
        ph.prepare_hub(src, tmp_path / "ds", tokenizer=tok_file, progress=False)
    assert str(err.value) == "--hf-dataset json has no field 'content' (fields: id, text); pass --text-field with one of them"
    assert list(tmp_path.iterdir()) == []


def test_bad_sources_are_one_line(tok_file: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="reads local files; pass them with --data-files"):
        ph.prepare_hub(ph.HubSource("json"), tmp_path / "a", tokenizer=tok_file, progress=False)
    with pytest.raises(UserError, match="--data-files .*nope.jsonl: no such file"):
        ph.prepare_hub(ph.HubSource("json", data_files=[str(tmp_path / "nope.jsonl")]), tmp_path / "a", tokenizer=tok_file)
    with pytest.raises(UserError, match="^--hf-dataset no-such-user/no-such-dataset cannot be opened") as err:
        ph.prepare_hub(ph.HubSource("no-such-user/no-such-dataset"), tmp_path / "a", tokenizer=tok_file)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="--tokenizer missing.json: no such file"):
        ph.prepare_hub(ph.HubSource("json", data_files=["x"]), tmp_path / "a", tokenizer="missing.json")
    assert list(tmp_path.iterdir()) == []


def test_parquet_and_text_files(tok_file: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _docs(20)
    pq.write_table(pa.table({"body": docs}), tmp_path / "d.parquet")
    ph.prepare_hub(ph.HubSource("parquet", data_files=[str(tmp_path / "d.parquet")], text_field="body"),
                   tmp_path / "pq", tokenizer=tok_file, val_fraction=0.2, progress=False)  # fmt: skip
    want = _expected(tok_file, docs, val_fraction=0.2)
    assert _tokens(tmp_path / "pq", "train") == want["train"] and _tokens(tmp_path / "pq", "val") == want["val"]
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, d in enumerate(docs[:5]):
        (texts / f"{i}.txt").write_text(d + "\nsecond line\n", encoding="utf-8")
    files = [str(texts / f"{i}.txt") for i in range(5)]
    ph.prepare_hub(ph.HubSource("text", data_files=files), tmp_path / "tx", tokenizer=tok_file, val_fraction=0.2, progress=False)
    want = _expected(tok_file, [d + "\nsecond line\n" for d in docs[:5]], val_fraction=0.2)
    assert _tokens(tmp_path / "tx", "train") + _tokens(tmp_path / "tx", "val") == want["train"] + want["val"]


def test_gpt2_tokenizer_from_the_hub_cache_offline(
    jsonl: Path, tok_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tokenizer gpt2` is the Hub's tokenizer.json via huggingface_hub's cache: laid out here
    as a past download leaves it (a stand-in BPE file: the real one needs the network once)."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the Hugging Face cache .*or pass --tokenizer PATH/tokenizer.json"):
        ph.prepare_hub(ph.HubSource("json", data_files=[str(jsonl)]), tmp_path / "ds", cache_dir=tmp_path / "hub")
    assert not (tmp_path / "ds").exists()
    repo = tmp_path / "hub" / "models--openai-community--gpt2"
    commit = "1" * 40
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "tokenizer.json").write_bytes(tok_file.read_bytes())
    ph.prepare_hub(ph.HubSource("json", data_files=[str(jsonl)]), tmp_path / "ds", cache_dir=tmp_path / "hub", progress=False)
    want = _expected(tok_file, _docs())
    assert _tokens(tmp_path / "ds", "train") == want["train"]
