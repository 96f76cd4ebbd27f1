"""Red-team findings (issue 12) that are refused before anything is written: one line,
exit 2, the file system as it was. Each case wrote files or gave a traceback before."""

import json
from pathlib import Path

import pytest
import torch

from gpt2_tui import main

MICRO = ["train", "--preset", "micro", "--device", "cpu", "--max-steps", "1"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _refused(capsys, argv: list[str], root: Path, *words: str) -> None:
    before = _tree(root)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert _tree(root) == before


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--device", "cuda"], ["no CUDA GPU"]),
        (["--seed", "-1"], ["train.seed"]),
        (["--seed", str(2**64)], ["train.seed"]),
        (["--lr", "inf"], ["optim.lr", "finite"]),
        (["--lr", "nan"], ["optim.lr", "finite"]),
    ],
)
def test_bad_train_flags_write_nothing(tmp_path, tiny_dataset, capsys, flags, words):
    _refused(capsys, [*MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "run"), *flags], tmp_path, *words)


def test_out_that_holds_user_files_is_refused_and_kept(tmp_path, tiny_dataset, capsys):
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "tokenizer.json").write_text("my own")
    (mine / "checkpoints" / "step_000001.pt").write_bytes(b"my own")
    _refused(capsys, [*MICRO, "--data", str(tiny_dataset), "--out", str(mine)], tmp_path, "not empty")


def test_out_under_a_regular_file_is_one_line(tmp_path, tiny_dataset, capsys):
    (tmp_path / "f").write_text("x")
    _refused(capsys, [*MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "f")], tmp_path, "is a file")


def test_a_sidecar_cannot_name_a_file_outside_its_dataset(tmp_path, tiny_dataset, capsys):
    sidecar = tiny_dataset / "dataset.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps(meta | {"tokenizer": "../../../../../../etc/hostname"}))
    _refused(capsys, [*MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "run")], tmp_path,
             "outside the dataset directory")  # fmt: skip


@pytest.mark.parametrize(
    "state, words",
    [
        ({"model": {}, "optimizer": {}, "step": 1, "config": {}}, ["model is not a dict of tensors"]),
        ({"model": {"w": torch.zeros(1)}, "optimizer": {}, "step": "3", "config": {}}, ["step"]),
        ({"model": {"w": torch.zeros(1)}, "optimizer": [], "step": 3, "config": {}}, ["optimizer"]),
        ({"model": {"w": torch.zeros(1)}, "step": 3, "config": {}}, ["missing optimizer"]),
    ],
)
def test_malformed_checkpoints_are_one_line(tmp_path, capsys, state, words):
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    _refused(capsys, ["sample", str(path)], tmp_path, *words)


def test_sample_on_a_missing_device_says_so(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = tmp_path / "x.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "optimizer": {}, "step": 1, "config": {}}, path)
    _refused(capsys, ["sample", str(path), "--device", "cuda"], tmp_path, "no CUDA GPU")


def test_sample_temperature_nan_is_one_line(tmp_path, capsys):
    _refused(capsys, ["sample", str(tmp_path), "--temperature", "nan"], tmp_path, "--temperature")
