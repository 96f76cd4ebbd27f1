"""The engine as the app sees it: every name the TUI uses, and nothing else.

The TUI imports only this module (an import contract in pyproject.toml holds it), so what
the engine offers a UI is this one list. Names load on first use (PEP 562): the app paints
its first screen before torch is imported, and a screen pays only for what it reads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> (module, name in it); None: the module itself
_SURFACE: dict[str, tuple[str, str | None]] = {
    "console": ("engine.console", None),
    "child": ("engine.child", None),
    "BATCH": ("engine.config", "BATCH"),
    "DEFAULT_VOCAB": ("engine.config", "DEFAULT_VOCAB"),
    "RunConfig": ("engine.config", "RunConfig"),
    "build": ("engine.config", "build"),
    "fit_warmup": ("engine.config", "fit_warmup"),
    "merge": ("engine.config", "merge"),
    "overlay": ("engine.config", "overlay"),
    "preset_names": ("engine.config", "preset_names"),
    "read_toml": ("engine.config", "read_toml"),
    "resolve": ("engine.config", "resolve"),
    "set_dotted": ("engine.config", "set_dotted"),
    "Capabilities": ("engine.device", "Capabilities"),
    "device": ("engine.device", None),
    "pick": ("engine.device", "pick"),
    "Refusal": ("engine.errors", "Refusal"),
    "UserError": ("engine.errors", "UserError"),
    "EventLines": ("engine.events", "EventLines"),
    "events": ("engine.events", None),
    "atomic_write_bytes": ("engine.files", "atomic_write_bytes"),
    "files": ("engine.files", None),
    "GpuSample": ("engine.gpu_monitor", "GpuSample"),
    "available": ("engine.gpu_monitor", "available"),
    "COMPARE_COLUMNS": ("engine.inspect.compare", "COLUMNS"),
    "LEFT": ("engine.inspect.compare", "LEFT"),
    "Row": ("engine.inspect.compare", "Row"),
    "SETTINGS_COLUMN": ("engine.inspect.compare", "SETTINGS_COLUMN"),
    "best_val_loss": ("engine.inspect.compare", "best_val_loss"),
    "blocks": ("engine.inspect.compare", "blocks"),
    "cells": ("engine.inspect.compare", "cells"),
    "labels": ("engine.inspect.compare", "labels"),
    "read_run": ("engine.inspect.compare", "read_run"),
    "reach_text": ("engine.inspect.compare", "reach_text"),
    "recipe_of": ("engine.inspect.compare", "recipe_of"),
    "recipe_text": ("engine.inspect.compare", "recipe_text"),
    "rows": ("engine.inspect.compare", "rows"),
    "shown_settings": ("engine.inspect.compare", "shown_settings"),
    "setting_items": ("engine.inspect.compare", "setting_items"),
    "DEFAULT_ROOT": ("engine.inspect.runs", "DEFAULT_ROOT"),
    "RUN_COLUMNS": ("engine.inspect.runs", "COLUMNS"),
    "RunSummary": ("engine.inspect.runs", "RunSummary"),
    "list_runs": ("engine.inspect.runs", "list_runs"),
    "row": ("engine.inspect.runs", "row"),
    "summarize": ("engine.inspect.runs", "summarize"),
    "memory": ("engine.train.memory", None),
    "default_dataset": ("engine.prep.prepare", "default_dataset"),
    "Verdict": ("engine.run.preflight", "Verdict"),
    "preflight": ("engine.run.preflight", "preflight"),
    "start": ("engine.run.owner", "start"),
    "Control": ("engine.run.requests", "Control"),
    "Request": ("engine.run.requests", "Request"),
    "post": ("engine.run.requests", "post"),
    "SWITCHES": ("engine.run.segments", "SWITCHES"),
    "headless_command": ("engine.run.launchers", "headless_command"),
    "spawn_new": ("engine.run.launchers", "spawn_new"),
    "spawn_resume": ("engine.run.launchers", "spawn_resume"),
    "train_in_thread": ("engine.run.launchers", "train_in_thread"),
    "SegmentReader": ("engine.run.segments", "SegmentReader"),
    "SegmentSummary": ("engine.run.segments", "SegmentSummary"),
    "Reach": ("engine.run.segments", "Reach"),
    "default_target": ("engine.run.segments", "default_target"),
    "final_val_loss": ("engine.run.segments", "final_val_loss"),
    "mark_target": ("engine.run.segments", "mark_target"),
    "changed": ("engine.run.segments", "changed"),
    "segments_of": ("engine.run.segments", "segments_of"),
    "switches": ("engine.run.segments", "switches"),
    "toggle": ("engine.run.toggle", None),
    "rundir": ("engine.rundir", None),
    "Setting": ("engine.settings", "Setting"),
    "form_sections": ("engine.settings", "form_sections"),
    "setting": ("engine.settings", "setting"),
    "change_text": ("engine.text", "change_text"),
    "clock_text": ("engine.text", "clock_text"),
    "contention_text": ("engine.text", "contention_text"),
    "describe": ("engine.text", "describe"),
    "format_table": ("engine.text", "format_table"),
    "human": ("engine.text", "human"),
    "loss_text": ("engine.text", "loss_text"),
    "parse_bytes": ("engine.text", "parse_bytes"),
    "path_text": ("engine.text", "path_text"),
    "printable": ("engine.text", "printable"),
    "program": ("engine.text", "program"),
    "shown": ("engine.text", "shown"),
    "verdict": ("engine.text", "verdict"),
    "open_dataset": ("engine.dataset", "open_dataset"),
}

__all__ = sorted(_SURFACE)

if TYPE_CHECKING:  # the same names, for type checkers and the import graph
    from engine import child  # noqa: F401
    from engine import console  # noqa: F401
    from engine import device  # noqa: F401
    from engine import events  # noqa: F401
    from engine import files  # noqa: F401
    from engine.train import memory  # noqa: F401
    from engine import rundir  # noqa: F401
    from engine.run import toggle  # noqa: F401
    from engine.config import BATCH, DEFAULT_VOCAB, RunConfig, build, fit_warmup, merge, overlay, preset_names, read_toml, resolve, set_dotted  # noqa: F401
    from engine.device import Capabilities, pick  # noqa: F401
    from engine.errors import Refusal, UserError  # noqa: F401
    from engine.events import EventLines  # noqa: F401
    from engine.files import atomic_write_bytes  # noqa: F401
    from engine.gpu_monitor import GpuSample, available  # noqa: F401
    from engine.inspect.compare import COLUMNS as COMPARE_COLUMNS, LEFT, Row, SETTINGS_COLUMN, best_val_loss, blocks, cells, labels, reach_text, read_run, recipe_of, recipe_text, rows, setting_items, shown_settings  # noqa: F401
    from engine.inspect.runs import DEFAULT_ROOT, COLUMNS as RUN_COLUMNS, RunSummary, list_runs, row, summarize  # noqa: F401
    from engine.prep.prepare import default_dataset  # noqa: F401
    from engine.run.preflight import Verdict, preflight  # noqa: F401
    from engine.run.launchers import headless_command, spawn_new, spawn_resume, train_in_thread  # noqa: F401
    from engine.run.owner import start  # noqa: F401
    from engine.run.requests import Control, Request, post  # noqa: F401
    from engine.run.segments import SWITCHES, Reach, SegmentReader, SegmentSummary, changed, default_target, final_val_loss, mark_target, segments_of, switches  # noqa: F401
    from engine.settings import Setting, form_sections, setting  # noqa: F401
    from engine.text import change_text, clock_text, contention_text, describe, format_table, human, loss_text, parse_bytes, path_text, printable, program, shown, verdict  # noqa: F401
    from engine.dataset import open_dataset  # noqa: F401


def __getattr__(name: str) -> Any:
    try:
        module, attr = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"engine.api has no {name!r}; add it to _SURFACE if the app needs it") from None
    loaded = importlib.import_module(module)
    value = loaded if attr is None else getattr(loaded, attr)
    globals()[name] = value  # later lookups skip this function
    return value
