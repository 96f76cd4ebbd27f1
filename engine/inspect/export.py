"""`gpt2-tui export RUN --hf DIR`: a run's checkpoint as a transformers GPT-2 directory.

Reading the run (which checkpoint, its model, its tokenizer) is this module's; the layout
transformers expects is engine.prep.hf's.
"""

from __future__ import annotations

from pathlib import Path

from engine import rundir
from engine.errors import UserError
from engine.inspect.sample import load_model
from engine.prep.hf import export, export_problem
from engine.train import checkpoint as ckpt


def export_run(run_or_file: Path, out: Path, which: str | None = None) -> Path:
    """`gpt2-tui export RUN [--from best|STEP] --hf DIR`: the checkpoint's weights and the
    run's tokenizer (when its data carried one) as a transformers directory."""
    run_or_file = Path(run_or_file).expanduser()
    target = run_or_file
    if which is not None:
        if not run_or_file.is_dir():
            raise UserError(f"--from {which} needs a run directory, not the file {run_or_file}")
        target = ckpt.CheckpointDir(run_or_file / "checkpoints").resolve(which)
    loaded = load_model(target)
    problem = export_problem(loaded.config.model)
    if problem:
        raise UserError(f"{loaded.path} has no transformers GPT-2 equivalent: {problem}")
    tokenizer = None
    for run in (run_or_file, loaded.path.parent.parent):
        tokenizer = rundir.tokenizer_of(run)
        if tokenizer:
            break
    return export(loaded.model.state_dict(), loaded.config.model, out, tokenizer)
