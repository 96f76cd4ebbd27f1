"""The `gpt2-tui` command: real runs, and every bad input as one line, exit 2, nothing written."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import cli_fails
from gpt2_tui import main

MICRO = ["--preset", "micro", "--device", "cpu", "--precision", "fp32"]


_fails = cli_fails  # exit 2, one stderr line naming the problem


@pytest.fixture
def trained(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--max-steps", "4",
                 "--ckpt-interval", "2"]) == 0
    capsys.readouterr()
    return run


@pytest.mark.slow
def test_train_resume_and_sample_end_to_end(tmp_path, make_dataset, capsys):
    from engine.prep.prepare import prepare_report

    text = tmp_path / "text"
    text.mkdir()
    for i in range(6):
        (text / f"doc{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + 1\n" * 40)
    data = tmp_path / "data"
    prepare_report([text], data, vocab_size=300, progress=False).info
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(data), "--out", str(run), "--max-steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "step      6/6" in out and "run completed at step 6" in out
    assert main(["train", "--resume", str(run), "--max-steps", "8"]) == 0
    assert "run completed at step 8" in capsys.readouterr().out
    assert (run / "tokenizer.json").is_file()
    assert not (run / "writer.pid").exists()  # claimed while training, released at the end
    assert main(["sample", str(run), "--prompt", "def ", "--max-new-tokens", "20", "--seed", "1"]) == 0
    sample = capsys.readouterr().out
    assert sample.startswith("def ") and len(sample) > 10
    ckpt = run / "checkpoints" / "step_000008.pt"
    assert main(["sample", str(ckpt), "--prompt", "def ", "--max-new-tokens", "20", "--seed", "1"]) == 0
    assert capsys.readouterr().out == sample  # same seed, same weights, same text


def test_missing_data_path(tmp_path, capsys):
    _fails(capsys, ["train", *MICRO, "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r")], "nope")
    assert not (tmp_path / "r").exists()


def test_token_file_not_a_multiple_of_token_size(tmp_path, make_dataset, capsys):
    data = make_dataset("nanogpt")
    with open(data / "train.bin", "ab") as f:
        f.write(b"\x01")
    _fails(capsys, ["train", *MICRO, "--data", str(data), "--out", str(tmp_path / "r")], "train.bin")
    assert not (tmp_path / "r").exists()


def test_token_ids_above_vocab(tmp_path, make_dataset, capsys):
    data = make_dataset("nanogpt")  # ids up to 63
    _fails(capsys, ["train", *MICRO, "--data", str(data), "--vocab-size", "32", "--out", str(tmp_path / "r")],
           "--vocab-size")
    assert not (tmp_path / "r").exists()


def test_dataset_shorter_than_one_block(tmp_path, make_dataset, capsys):
    data = make_dataset("gpt2-tui", val=np.arange(20) % 64)
    _fails(capsys, ["train", *MICRO, "--data", str(data), "--out", str(tmp_path / "r")], "val")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--preset", "gpt5"], ["unknown preset", "nano"]),
        (["--lr", "0"], ["optim.lr"]),
        (["--lr", "-0.0003"], ["optim.lr"]),
        (["--batch-size", "0"], ["train.batch_size"]),
        (["--block-size", "64"], ["above the model's context", "--block-size 32"]),
    ],
)
def test_invalid_settings(tmp_path, tiny_dataset, capsys, flags, words):
    _fails(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "r"), *flags], *words)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags", [["--batch-size", "four"], ["--attention", "fast"], ["--bogus"]])
def test_usage_errors_are_one_line(tmp_path, capsys, flags):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *MICRO, "--out", str(tmp_path / "r"), *flags])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and flags[0] in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_out_dir_holding_a_run_is_never_overwritten(trained, tiny_dataset, capsys, file_tree):
    before = file_tree(trained)
    _fails(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(trained)], "--resume")
    assert file_tree(trained) == before


@pytest.mark.slow
def test_resume_with_another_model_shape(trained, capsys, file_tree):
    before = file_tree(trained)
    _fails(capsys, ["train", "--resume", str(trained), "--n-layer", "3"], "another model shape")
    assert file_tree(trained) == before


@pytest.mark.slow
def test_truncated_checkpoint(trained, capsys, file_tree):
    latest = trained / "checkpoints" / "step_000004.pt"
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 2])
    before = file_tree(trained)
    _fails(capsys, ["train", "--resume", str(trained)], "truncated or corrupt")
    _fails(capsys, ["sample", str(latest)], "truncated or corrupt")
    assert file_tree(trained) == before


def test_pickle_that_is_not_a_checkpoint_is_refused_unexecuted(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"model": Payload()}))
    _fails(capsys, ["sample", str(evil)], "not a gpt2-tui checkpoint")
    plain = tmp_path / "plain.pt"
    import torch

    torch.save({"weights": torch.zeros(2)}, plain)
    _fails(capsys, ["sample", str(plain)], "not a gpt2-tui checkpoint")
    assert not marker.exists()


@pytest.mark.slow
def test_installed_console_script_reports_one_line_and_exit_2(tmp_path):
    exe = Path(sys.executable).with_name("gpt2-tui")
    assert exe.exists(), "pip install -e . installs the gpt2-tui console script"
    res = subprocess.run([str(exe), "train", "--preset", "nano", "--lr", "-1", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "optim.lr" in res.stderr
    assert not (tmp_path / "r").exists()
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "train" in res.stdout and "sample" in res.stdout


@pytest.mark.slow
def test_default_dataset_is_the_stdlib_corpus_and_the_model_learns_it(tmp_path, capsys):
    """No --data: the embedded corpus is prepared once (session cache) and trained on."""
    import tomllib

    from engine.events import read_events

    run = tmp_path / "run"
    assert main(["train", *MICRO, "--out", str(run), "--max-steps", "40", "--eval-interval", "40",
                 "--batch-size", "8", "--log-interval", "1"]) == 0
    config = tomllib.loads((run / "config.toml").read_text())
    assert Path(config["data"]["path"]).name.startswith("stdlib-py")
    assert config["model"]["vocab_size"] == 8192
    events = read_events(run / "events.jsonl")[0]
    first = next(e.loss for e in events if e.event == "step")
    evals = [e.val_loss for e in events if e.event == "eval"]
    assert first > 8.5  # ~ln(8192) at init
    assert evals[-1] < first - 1.5  # real text: the model learns
