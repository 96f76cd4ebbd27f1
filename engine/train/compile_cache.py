"""Where torch.compile keeps what it compiled, so that the warm-up is paid once.

PyTorch's own caches do the work: inductor's FX graph cache (generated and built kernels)
and the AOTAutograd cache (the traced forward/backward graphs) are read back by any later
compile of the same graph with the same shapes and settings: a second run, a resume, a
restart. We keep them under the user's gpt2-tui cache (`$GPT2_TUI_CACHE`, else
~/.cache/gpt2-tui; engine.files.cache_root) in `torch-compile/`, instead of inductor's
default under /tmp, which a reboot empties. The Trainer calls `enable()` just before
torch.compile; the measuring tools `redirect()` it to a directory of their own to time a
cold or a warm compile. Set TORCHINDUCTOR_FX_GRAPH_CACHE=0 to turn the caches off.
What the graph depends on but the caches do not key on (the SDPA kernel picked) joins
their key through `tag()`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine import files, text

SUBDIR = "torch-compile"
ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor reads it at each compile (Triton's cache lives inside)

_redirected: Path | None = None
_fallback: Path | None = None  # this process's own fresh directory when the cache's is not private


def default_dir(cache_root: Path | None = None) -> Path:
    from engine.files import cache_root as root

    return root(cache_root) / SUBDIR


def private_or_fresh(path: Path) -> Path:
    """`path` when it is ours and private (engine.files.private_dir: 0700, this user's, in a
    parent others cannot write): torch unpickles and imports what it finds there, so a cache
    another user can write would run their code in our run. Otherwise one warning, and this
    process compiles into a fresh private directory of its own (the run goes on, uncached)."""
    global _fallback
    try:
        return files.private_dir(path)
    except OSError as err:
        if _fallback is None:
            import tempfile
            import warnings

            _fallback = Path(tempfile.mkdtemp(prefix="gpt2-tui-compile-"))  # 0700, made new: nothing planted
            why = text.path_text(str(err.strerror or err))
            warnings.warn(f"the compile cache is not used: {why}, and torch would load code from it; this run "
                          "compiles uncached (fix: chmod 700 it as its owner, or remove it)", stacklevel=2)  # fmt: skip
        return _fallback


def enable(cache_root: Path | None = None) -> Path:
    """Point PyTorch's compile caches at cache_root/torch-compile (cache_root: the gpt2-tui
    cache by default) and switch them on; the directory used. Call before torch.compile."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    path = private_or_fresh(_redirected or default_dir(cache_root))
    os.environ[ENV] = str(path.resolve())
    inductor_config.fx_graph_cache = True
    aot_config.enable_autograd_cache = True
    return path


TAG_ENV = "TORCH_COMPILE_CACHE_KEY_TAG"  # the user's own tag, kept ahead of ours


def tag(what: str) -> str:
    """Make `what` (a setting torch's caches do not key on, yet the compiled graph depends on:
    the SDPA pick, attention.cache_tag) part of every compile cache key from now on in this
    process (torch.compiler.config.cache_key_tag, read at each compile); the tag set."""
    import torch.compiler.config as compiler_config

    compiler_config.cache_key_tag = " | ".join(t for t in (os.environ.get(TAG_ENV, ""), what) if t)
    return compiler_config.cache_key_tag


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
