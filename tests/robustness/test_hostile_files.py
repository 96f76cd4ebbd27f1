"""Hostile files around a run, a dataset or a model: planted links where the loggers and a
resumed `prepare --hf-dataset` write, devices and link loops among prepare's inputs, damaged
model and dataset files, an allocation that fails in the first eval, wrong-typed TOML, a
killed export. Each is one line and exit 2 (or the documented behaviour), and the file system
outside the command's own output is left as it was (docs/reliability.md, "Hostile files")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import MICRO, cli_fails, python_c, random_tokens, tree_snapshot, write_gpt2tui
from engine import files
from engine.errors import UserError
from gpt2_tui import main


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("data")
    return write_gpt2tui(tmp / "tiny", random_tokens(20_000, 64, 1), random_tokens(4_000, 64, 2), vocab_size=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """A micro run with a checkpoint at step 2 (copied by each test that changes it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", "2", "--ckpt-interval", "2",
                 "--eval-interval", "2", "--eval-batches", "1"]) == 0  # fmt: skip
    return run


def _victim(tmp_path: Path) -> tuple[Path, Path]:
    """A directory outside the run holding one file: what a planted link points at."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.bin").write_bytes(b"precious" * 100)
    return outside, outside / "victim.bin"


# ---------------------------------------------------------------- links where the loggers write


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["csv", "tensorboard", "wandb"])
def test_a_planted_logger_link_in_the_run_dir_is_refused_before_a_byte_is_written(
    logger: str, trained: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    if logger != "csv":
        pytest.importorskip(logger)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    outside, victim = _victim(tmp_path)
    name = {"csv": "metrics.csv", "tensorboard": "tensorboard", "wandb": "wandb"}[logger]
    (run / name).symlink_to(victim if logger == "csv" else outside)
    before_out, before_run = tree_snapshot(outside), tree_snapshot(run)
    cli_fails(capsys, ["train", "--resume", str(run), "--max-steps", "4", "--log", logger], name, "symbolic link")
    assert tree_snapshot(outside) == before_out
    assert tree_snapshot(run) == before_run  # refused before the run wrote anything


# ---------------------------------------------------------------- prepare --hf-dataset: a planted .partial


def _tokenizer(tmp_path: Path) -> Path:
    from engine.prep.prepare import train_tokenizer

    path = tmp_path / "tok.json"
    train_tokenizer(["hello world, the quick brown fox. " * 50], 300).save(str(path))
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("plant", ["symlinked train.bin", "hard-linked train.bin", "the .partial a link"])
def test_a_resumed_partial_holding_links_is_refused_and_nothing_outside_is_written(
    plant: str, tmp_path: Path, capsys
) -> None:
    pytest.importorskip("datasets")
    from engine.prep import hub

    tok = _tokenizer(tmp_path)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"text": f"document {i} " * 30} for i in range(200)])
    outside, victim = _victim(tmp_path)
    out = tmp_path / "made" / "ds"
    out.parent.mkdir()
    source = hub.HubSource("json", None, "train", [str(rows)], "text")
    state = {"fingerprint": hub._fingerprint(source, tok, None, 0.05, 0), "documents": 1, "train_tokens": 2,
             "val_tokens": 0}  # fmt: skip  (the CLI's settings: this state is resumed, not refused as another's)
    work = out.parent / f".{out.name}.partial"
    home = outside / "partial" if plant == "the .partial a link" else work
    home.mkdir()
    (home / "state.json").write_text(json.dumps(state))
    (home / "val.bin").write_bytes(b"")
    shutil.copy(tok, home / "tokenizer.json")
    if plant == "symlinked train.bin":
        (home / "train.bin").symlink_to(victim)
    elif plant == "hard-linked train.bin":
        os.link(victim, home / "train.bin")
    else:
        (home / "train.bin").write_bytes(b"\0\0\0\0")
        work.symlink_to(home)
    before = tree_snapshot(outside)
    cli_fails(capsys, ["prepare", "--hf-dataset", "json", "--data-files", str(rows), "--tokenizer", str(tok),
                       "--out", str(out)], ".partial", "link", "delete")  # fmt: skip
    assert tree_snapshot(outside) == before
    assert victim.read_bytes() == b"precious" * 100
    assert not out.exists()


# ---------------------------------------------------------------- prepare's inputs


def test_a_device_among_prepares_inputs_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["prepare", str(tmp_path / "zero.txt"), "--out", str(tmp_path / "ds")], "not a regular file")
    assert tree_snapshot(tmp_path) == before


def test_a_device_inside_an_input_directory_is_skipped_not_read(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("ordinary text, line after line.\n" * 400)
    (corpus / "zero.txt").symlink_to("/dev/zero")
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "ds"), "--vocab-size", "300"]) == 0
    assert "zero.txt (unreadable" in capsys.readouterr().out


def test_a_symlink_loop_among_prepares_inputs_is_one_line_or_skipped(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("ordinary text, line after line.\n" * 400)
    (corpus / "loop.txt").symlink_to(corpus / "loop.txt")
    (tmp_path / "named").symlink_to(tmp_path / "named")
    cli_fails(capsys, ["prepare", str(tmp_path / "named"), "--out", str(tmp_path / "x")], "loop")
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "ds"), "--vocab-size", "300"]) == 0
    assert "loop.txt (unreadable" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


def test_a_tokenizer_whose_ids_pass_its_vocab_is_one_line_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    tok = json.loads(_tokenizer(tmp_path).read_text())
    vocab = tok["model"]["vocab"]
    vocab["o"] = 70_000  # a hand-edited id past the vocab, and past uint16
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(tok))
    (tmp_path / "in.txt").write_text("odd zoo, oboe moon: ooo. " * 50)  # words its merges do not cover: a lone "o"
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["prepare", str(tmp_path / "in.txt"), "--tokenizer", str(bad), "--out", str(tmp_path / "ds")],
              "outside its vocab")  # fmt: skip
    assert tree_snapshot(tmp_path) == before
    from engine.prep.prepare import token_array  # and where ids are written, whatever the tokenizer said

    with pytest.raises(UserError, match="outside its vocab of 300"):
        token_array([1, 70_000], 300, "uint16")


def test_a_long_document_is_encoded_in_pieces_with_the_tokens_of_the_whole(tmp_path: Path, monkeypatch) -> None:
    """prepare's memory follows a piece, not the file: a document longer than PIECE_CHARS is
    read, trained on and encoded piece by piece, and gives the very tokens of the whole."""
    from tokenizers import Tokenizer

    from engine.prep import prepare as prep

    monkeypatch.setattr(prep, "PIECE_CHARS", 2048)
    monkeypatch.setattr(prep, "MAX_CUT_SLACK", 1024)
    monkeypatch.setattr(prep, "READ_BYTES", 4096)
    text = "".join(f"def f{i}(x):\n    return x * {i}  # café {i}\n\n" for i in range(3000))
    (tmp_path / "big.py").write_text(text)
    doc = prep._scan(tmp_path / "big.py")
    doc.cut = prep._cut(doc, 0.05)
    pieces = list(prep._pieces(doc, 0, doc.chars))
    assert "".join(pieces) == text and len(pieces) > 10 and max(map(len, pieces)) <= 2048
    info = prep.prepare_report([tmp_path / "big.py"], tmp_path / "ds", vocab_size=400, progress=False).info
    tok = Tokenizer.from_file(info.tokenizer)
    tok.encode_special_tokens = True
    ids = np.concatenate([np.fromfile(tmp_path / "ds" / f"{s}.bin", dtype="<u2")[1:] for s in ("train", "val")])
    assert tok.decode(ids.tolist()) == text
    assert ids.tolist() == tok.encode(text[: doc.cut]).ids + tok.encode(text[doc.cut:]).ids


# ---------------------------------------------------------------- a bad record deep in a stream, --text-field


def test_a_broken_record_deep_in_a_local_jsonl_is_one_line_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    pytest.importorskip("datasets")
    tok = _tokenizer(tmp_path)
    # 2.4 kB lines: the 5000th is past datasets' first 10 MiB block, so the stream has begun
    lines = [json.dumps({"text": f"document {i} " + "about foxes " * 200}) for i in range(6000)]
    lines[4999] = '{"text": "broken'  # the 5000th line
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(lines) + "\n")
    made = tmp_path / "made"
    made.mkdir()
    cli_fails(capsys, ["prepare", "--hf-dataset", "json", "--data-files", str(rows), "--tokenizer", str(tok),
                       "--out", str(made / "ds")], "cannot be read")  # fmt: skip
    assert list(made.iterdir()) == []  # no .partial, no lock file


def test_a_refused_text_field_leaves_no_partial_to_block_the_corrected_command(tmp_path: Path, capsys) -> None:
    pytest.importorskip("datasets")
    tok = _tokenizer(tmp_path)
    rows = [{"title": f"t{i}", "body": f"document {i} about foxes " * 20} for i in range(50)]
    rows[3]["title"] = 7  # --text-field title: the 4th row holds a number
    data = _jsonl(tmp_path / "rows.jsonl", rows)
    made = tmp_path / "made"
    made.mkdir()
    argv = ["prepare", "--hf-dataset", "json", "--data-files", str(data), "--tokenizer", str(tok), "--out", str(made / "ds")]
    cli_fails(capsys, [*argv, "--text-field", "title"], "--text-field title")
    assert list(made.iterdir()) == []
    assert main([*argv, "--text-field", "body"]) == 0


# ---------------------------------------------------------------- model and dataset files


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.make_tiny_gpt2 import make

    return make(tmp_path_factory.mktemp("hf") / "tiny", vocab_size=300)


@pytest.mark.parametrize("key, value", [("n_layer", "2"), ("n_embd", float("inf")), ("n_head", 2.5),
                                        ("layer_norm_epsilon", "small"), ("vocab_size", True)])  # fmt: skip
def test_an_hf_config_with_a_non_number_where_a_number_belongs_is_one_line(
    key: str, value: object, tiny_gpt2: Path, tmp_path: Path, capsys
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_gpt2, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg[key] = value
    (model / "config.json").write_text(json.dumps(cfg))  # inf is written as Infinity, which json reads back
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["estimate", "--init-from", str(model), "--device", "cpu"], key)
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("dims", [3, 1])
def test_safetensors_with_a_tensor_of_the_wrong_rank_is_one_line_and_no_run_dir(
    dims: int, tiny_gpt2: Path, tmp_path: Path, capsys
) -> None:
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_gpt2, model)
    state = load_file(str(model / "model.safetensors"))
    key = next(k for k in state if k.endswith("h.0.attn.c_attn.weight"))
    w = state[key]
    state[key] = w.reshape(2, w.shape[0] // 2, w.shape[1]).contiguous() if dims == 3 else w.flatten().contiguous()
    save_file({k: v.contiguous() for k, v in state.items() if not k.endswith("lm_head.weight")}, str(model / "model.safetensors"))
    ds = write_gpt2tui(tmp_path / "ds", random_tokens(20_000, 300, 1), random_tokens(4_000, 300, 2), vocab_size=300)
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["train", "--init-from", str(model), "--data", str(ds), "--device", "cpu", "--precision", "fp32",
                       "--batch-size", "2", "--max-steps", "1", "--out", str(tmp_path / "run")], "c_attn.weight")  # fmt: skip
    assert tree_snapshot(tmp_path) == before


def test_a_dataset_json_nested_100k_deep_or_a_device_is_one_line(data: Path, tmp_path: Path, capsys) -> None:
    for name, plant in (("deep", lambda p: p.write_text("[" * 100_000 + "]" * 100_000)),
                        ("zero", lambda p: p.symlink_to("/dev/zero"))):  # fmt: skip
        ds = tmp_path / name
        shutil.copytree(data, ds)
        (ds / "dataset.json").unlink()
        plant(ds / "dataset.json")
        before = tree_snapshot(tmp_path)
        cli_fails(capsys, ["train", *MICRO, "--data", str(ds), "--max-steps", "1", "--out", str(tmp_path / "run")],
                  "dataset.json")  # fmt: skip
        assert tree_snapshot(tmp_path) == before


# ---------------------------------------------------------------- a CPU allocation that fails in the first eval


@pytest.mark.slow
def test_a_cpu_out_of_memory_in_the_first_eval_is_one_line_and_no_run_dir(
    data: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    from engine.train.evaluation import Evaluation

    def evaluate(self, parts, at) -> float:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip

    monkeypatch.setattr(Evaluation, "run", evaluate)
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["train", *MICRO, "--data", str(data), "--max-steps", "2", "--out", str(tmp_path / "run"),
                       "--log", "csv"], "out of memory")  # fmt: skip
    assert tree_snapshot(tmp_path) == before
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- export killed, TOML typed


_EXPORT_TERM = """
import os, signal, sys
from engine import files
real = files.write_text
def write_text(path, text):
    real(path, text)
    os.kill(os.getpid(), signal.SIGTERM)  # mid-export: its temp directory holds files now
files.write_text = write_text
from engine.errors import UserError
from gpt2_tui import main
sys.exit(main(["export", sys.argv[1], "--hf", sys.argv[2]]))
"""


@pytest.mark.slow
def test_sigterm_during_export_leaves_no_temp_dir_and_a_dead_ones_is_swept(trained: Path, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    out = tmp_path / "hf"
    res = python_c(_EXPORT_TERM, trained, out, timeout=300)
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # the temp directory went with the interrupt
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = files.build_dir_name(tmp_path / "hf", int(dead.stdout))  # what a kill -9 mid-export leaves
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    assert main(["export", str(trained), "--hf", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("toml, key", [("[model]\nn_layer = true\n", "model.n_layer"),
                                       ('[train]\nbatch_size = "8"\n', "train.batch_size"),
                                       ('[data]\npreload = "off"\n', "data.preload")])  # fmt: skip
def test_a_config_file_value_of_the_wrong_type_is_one_line(toml: str, key: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "c.toml").write_text(toml)
    before = tree_snapshot(tmp_path)
    cli_fails(capsys, ["estimate", "--preset", "micro", "--config", str(tmp_path / "c.toml")], key)
    assert tree_snapshot(tmp_path) == before


@pytest.mark.slow
def test_typed_flags_still_work_and_a_runs_config_toml_is_read_strictly(trained: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "c.toml").write_text("[train]\nbatch_size = 4\n[optim]\nlr = 1\n[data]\npreload = false\n")
    assert main(["estimate", "--preset", "micro", "--config", str(tmp_path / "c.toml"), "--batch-size", "8",
                 "--no-preload", "--n-layer", "2"]) in (0, 1)  # fmt: skip
    capsys.readouterr()
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    text = (run / "config.toml").read_text()
    hand_edited = re.sub(r"^batch_size = (\d+)$", r'batch_size = "\1"', text, count=1, flags=re.M)
    assert hand_edited != text
    (run / "config.toml").write_text(hand_edited)
    before = tree_snapshot(run)
    cli_fails(capsys, ["train", "--resume", str(run), "--max-steps", "4"], "train.batch_size", "string")
    assert tree_snapshot(run) == before
