"""The training system, free of any UI: config -> front door -> trainer -> events.

    from engine.run.configs import new_config
    from engine.run.owner import start
    config, run_dir = new_config("nano", None, {"optim.lr": 3e-4})  # pydantic RunConfig, checked
    trainer = start(config, run_dir)   # data opened, memory checked, run directory created
    trainer.run()                      # events -> run_dir/events.jsonl (+ any sinks: console, TUI)

Core: config (every setting, described once), settings (their flags and form fields),
device (device and precision decisions), data, model, losses, trainer, guard (verdicts
on bad steps), control (pause/stop/save from other threads), checkpoint, rundir, events,
memory (the estimator), flops, distributed, launch (torchrun), prepare, sample, cli
(the headless commands). The measuring tools live apart, in bench/, which engine never imports.
"""

import os as _os

# Some VMs advertise AMX in cpuid without enabling it, and oneDNN's bf16 kernels then die
# with SIGILL on the first bf16 matmul (seen on our 2-core dev machines). Capping oneDNN at
# AVX512-BF16 costs nothing on GPUs and little for the small models trained on CPUs; set
# ONEDNN_MAX_CPU_ISA=ALL to lift the cap on a machine where AMX works.
_os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
