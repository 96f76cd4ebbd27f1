"""The training system, free of any UI: it never imports tui/, textual or bench/.

    from pathlib import Path
    from engine.api import resolve, start
    config = resolve("nano", None, {"optim.lr": 3e-4})  # preset < file < flags: a validated RunConfig
    run = start(config, Path("runs/demo"))  # preflight, data opened, run directory created and locked
    run.run()                               # segment after segment -> "completed" or "stopped"

engine.api is the surface the app, bench/ and the commands use. The packages stack, each importing
only those below it (pyproject.toml's import contracts hold the order):

  cli/      the headless commands (`python -m engine.cli`); reference.py writes docs/cli.md, docs/events.md
  inspect/  reading runs: the runs list, compare, sample, export, doctor
  run/      a run's life: owner (start, Run), preflight, requests, segments, toggle, launchers, torchrun
  prep/     datasets and models in and out: prepare, Hub streaming, HF weights, the tokenizer
  train/    one segment: model, losses, batches, memory (the estimator), trainer, checkpoints, compiling
  the foundations: events; rundir, dataset, console; text, settings; config, device; files,
            switch_matrix, gpu_monitor; errors
"""

import os as _os

# Some VMs advertise AMX in cpuid without enabling it, and oneDNN's bf16 kernels then die
# with SIGILL on the first bf16 matmul (seen on our 2-core dev machines). Capping oneDNN at
# AVX512-BF16 costs nothing on GPUs and little for the small models trained on CPUs; set
# ONEDNN_MAX_CPU_ISA=ALL to lift the cap on a machine where AMX works.
_os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
