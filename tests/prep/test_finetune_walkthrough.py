"""Issue 24 through the real CLI: the "fine-tune GPT-2 on your text" walk-through of docs/training.md
runs end to end offline, and each capability's bad input is one line, exit 2, nothing
written (unknown model, no network, no text field, export over a non-empty directory, a
logger not installed, a shape flag that contradicts the weights)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT, cli_process

pytestmark = pytest.mark.slow  # see pyproject.toml's markers: not in the fast inner loop

BIN = Path(sys.executable).parent
TRAIN = ["--device", "cpu", "--batch-size", "4", "--block-size", "32", "--max-steps", "2", "--warmup-steps", "1"]


@pytest.fixture(scope="module")
def transformers():
    """The optional libraries the walk-through needs, imported when it runs, not at collection."""
    pytest.importorskip("safetensors")
    pytest.importorskip("datasets")
    return pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _needs_hf(transformers) -> None:
    """Every test here skips where one of them is missing."""


def _env(tmp: Path, **more: str) -> dict[str, str]:
    """Offline, with an empty Hugging Face home of the test's own."""
    home = tmp / "hf-home"
    home.mkdir(exist_ok=True)
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(home),
                        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT),
                        "WANDB_MODE": "offline", "WANDB_SILENT": "true"}  # fmt: skip
    return env | more


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(args: list[str], cwd: Path, env: dict[str, str], match: str) -> str:
    """The command exits 2 with one line matching `match`, and `cwd` is as it was."""
    before = _tree(cwd)
    done = cli_process(*args, cwd=cwd, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(match, lines[0]), lines[0]
    assert _tree(cwd) == before
    return lines[0]


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/training.md's walk-through, line by line as printed, in an empty directory."""
    text = (ROOT / "docs" / "training.md").read_text()
    block = text.split("<!-- walkthrough -->", 1)[1].split("<!-- /walkthrough -->", 1)[0]
    script = block.split("```bash\n", 1)[1].split("```", 1)[0]
    work = tmp_path_factory.mktemp("walkthrough")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=_env(work), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (work / "stdout.txt").write_text(done.stdout)
    return work


def test_the_walkthrough_fine_tunes_the_pretrained_weights_and_transformers_loads_the_result(walkthrough: Path,
                                                                                             transformers) -> None:
    import torch
    from safetensors.torch import load_file

    from engine.events import read_events
    from engine.inspect.sample import load_model

    w = walkthrough
    assert "the quick" in (w / "stdout.txt").read_text()  # transformers generated from the export
    events, _ = read_events(w / "my-run" / "events.jsonl")
    started = [e for e in events if e.event == "run_started"]
    segments = [e for e in events if e.event == "segment"]
    assert started[0].init_from == "tiny-gpt2" and segments[0].init_from == "tiny-gpt2"
    config = json.loads((w / "tiny-gpt2" / "config.json").read_text())
    assert started[0].config["model"]["n_layer"] == config["n_layer"] and started[0].config["model"]["init_from"] == "tiny-gpt2"
    assert sum(1 for line in (w / "my-run" / "metrics.csv").read_text().splitlines() if line.split(",")[1] == "step") == 6

    # it trained from the weights: each AdamW step moves a weight by about lr at most (a random
    # start would be ~0.1 away: HF initializes with std 0.02)
    lr = started[0].config["optim"]["lr"]
    tiny = load_file(w / "tiny-gpt2" / "model.safetensors")
    out = load_file(w / "my-model" / "model.safetensors")
    for key in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"):
        diff = (tiny[key] - out[key]).abs().max().item()
        assert 0 < diff < 6 * lr, (key, diff)

    # and transformers computes what our checkpoint computes
    ours = load_model(w / "my-run" / "checkpoints" / "best.pt").model.eval()  # what `export --from best` read
    theirs = transformers.GPT2LMHeadModel.from_pretrained(w / "my-model").eval()
    V = theirs.config.vocab_size
    idx = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, ours(idx, idx)[0][..., :V], rtol=0, atol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(w / "my-model")
    assert tok.decode(tok("the lazy dog")["input_ids"]) == "the lazy dog"


def test_unknown_model_name_is_one_line(tmp_path: Path) -> None:
    refused(["train", "--init-from", "gpt3", "--out", "run"], tmp_path, _env(tmp_path), r"^error: --init-from gpt3: neither a model name")


def test_missing_network_is_one_line_and_the_cache_stays_empty(tmp_path: Path) -> None:
    env = _env(tmp_path)
    refused(["train", "--init-from", "gpt2-medium", "--out", "run"], tmp_path, env,
            r"^error: gpt2-medium is not in the Hugging Face cache .* HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE")
    assert not any((tmp_path / "hf-home").iterdir())
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    refused(["prepare", "--hf-dataset", "json", "--data-files", "a.jsonl", "--out", "d"], tmp_path, env,  # GPT-2's BPE, by default
            r"^error: gpt2 is not in the Hugging Face cache .* or pass --tokenizer PATH/tokenizer.json$")
    refused(["prepare", "--hf-dataset", "json", "--data-files", "none.jsonl", "--tokenizer", "bpe", "--out", "d"], tmp_path, env,
            r"^error: --data-files none.jsonl: no such file")


def test_a_shape_flag_against_the_weights_and_init_on_resume_are_refused(walkthrough: Path) -> None:
    env = _env(walkthrough)
    refused(["train", "--init-from", "tiny-gpt2", "--n-embd", "64", "--data", "my-data", *TRAIN, "--out", "r2"], walkthrough, env,
            r"^error: --n-embd 64 conflicts with tiny-gpt2, whose weights have n_embd 32; drop --n-embd")
    refused(["train", "--resume", "my-run", "--init-from", "tiny-gpt2"], walkthrough, env,
            r"^error: --init-from starts a new run; a --resume continues from its checkpoint")


def test_a_dataset_without_the_text_field_writes_nothing(walkthrough: Path) -> None:
    refused(["prepare", "--hf-dataset", "json", "--data-files", "my-text.jsonl", "--text-field", "body", "--tokenizer", "tiny-gpt2",
             "--out", "d2"], walkthrough, _env(walkthrough), r"^error: --hf-dataset json has no field 'body' \(fields: text\); pass --text-field")


def test_export_over_a_non_empty_directory_writes_nothing(walkthrough: Path) -> None:
    refused(["export", "my-run", "--hf", "my-model"], walkthrough, _env(walkthrough), r"^error: --hf my-model is not empty")
    refused(["export", "my-run", "--from", "99", "--hf", "new-model"], walkthrough, _env(walkthrough), r"no such checkpoint")


def test_a_logger_not_installed_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """wandb's import made to fail in the subprocess (a sitecustomize shim), as where it is not installed."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Gone:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('wandb', 'tensorboard'):\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _Gone())\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    env = _env(work, PYTHONPATH=f"{shim}{os.pathsep}{ROOT}")
    refused(["train", "--preset", "micro", *TRAIN, "--log", "csv", "wandb", "--out", "run"], work, env,
            r"^error: --log wandb needs the wandb package; pip install gpt2-tui\[wandb\]$")
    refused(["train", "--preset", "micro", *TRAIN, "--log", "tensorboard", "--out", "run"], work, env,
            r"^error: --log tensorboard needs the tensorboard package; pip install gpt2-tui\[tensorboard\]$")
    refused(["train", "--log", "mlflow", "--out", "run"], work, env, r"argument --log: invalid choice: 'mlflow'")
