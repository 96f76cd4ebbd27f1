"""Where gpt2-tui keeps what it builds once and reuses: datasets, tokenizers, compiled code."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: Path | None = None) -> Path:
    """cache_dir, else $GPT2_TUI_CACHE, else ~/.cache/gpt2-tui."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("GPT2_TUI_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt2-tui"
