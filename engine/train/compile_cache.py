"""Where torch.compile keeps what it compiled, so that the warm-up is paid once.

PyTorch's own caches do the work: inductor's FX graph cache (generated and built kernels)
and the AOTAutograd cache (the traced forward/backward graphs) are read back by any later
compile of the same graph with the same shapes and settings: a second run, a resume, a
restart. We keep them under the user's gpt2-tui cache (`$GPT2_TUI_CACHE`, else
~/.cache/gpt2-tui; engine.files.cache_root) in `torch-compile/`, instead of inductor's
default under /tmp, which a reboot empties. The Trainer calls `enable()` just before
torch.compile; the measuring tools `redirect()` it to a directory of their own to time a
cold or a warm compile. Set TORCHINDUCTOR_FX_GRAPH_CACHE=0 to turn the caches off.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine import files

SUBDIR = "torch-compile"
ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor reads it at each compile (Triton's cache lives inside)

_redirected: Path | None = None


def default_dir(cache_root: Path | None = None) -> Path:
    from engine.files import cache_root as root

    return root(cache_root) / SUBDIR


def enable(cache_root: Path | None = None) -> Path:
    """Point PyTorch's compile caches at cache_root/torch-compile (cache_root: the gpt2-tui
    cache by default) and switch them on; the directory used. Call before torch.compile."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    path = _redirected or default_dir(cache_root)
    files.make_dir(path)
    os.environ[ENV] = str(path.resolve())
    inductor_config.fx_graph_cache = True
    aot_config.enable_autograd_cache = True
    return path


def forget_loaded() -> None:
    """Drop what this process holds in memory of compiled code: the next compile reads disk."""
    import torch
    from torch._inductor.utils import clear_inductor_caches

    torch._dynamo.reset()
    clear_inductor_caches()


@contextmanager
def redirect(path: Path) -> Iterator[Path]:
    """Inside, enable() uses `path` (for the measuring tools: an empty directory is a cold
    compile, one a compile of the same config filled a warm one). What this process had
    loaded is forgotten on the way in and out, so only the directory decides."""
    global _redirected
    before, env_before = _redirected, os.environ.get(ENV)
    _redirected = Path(path)
    forget_loaded()
    try:
        yield _redirected
    finally:
        _redirected = before
        if env_before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = env_before
        forget_loaded()
