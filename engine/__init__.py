"""gpt2-tui's training engine: config, model, data, loop, checkpoints and events.

Nothing in this package imports textual; the TUI drives it through config objects,
the trainer's Control object and events.
"""

import os as _os

# Some VMs advertise AMX in cpuid without enabling it, and oneDNN's bf16 kernels then die
# with SIGILL on the first bf16 matmul (seen on our 2-core dev machines). Capping oneDNN at
# AVX512-BF16 costs nothing on GPUs and little for the small models trained on CPUs; set
# ONEDNN_MAX_CPU_ISA=ALL to lift the cap on a machine where AMX works.
_os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
