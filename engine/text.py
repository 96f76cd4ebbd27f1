"""Text for people, in one place: untrusted text made safe, byte sizes, durations, ratios,
switch names, samples, each event's text, the memory estimate's table and advice. A leaf
(no other engine module at run time but errors): console, CLI and screens all word it so.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import UserError

if TYPE_CHECKING:  # events and memory import this module: their types are named, not imported
    from engine.config import RunConfig

MiB, GiB = 1 << 20, 1 << 30

# ------------------------------------------------------------------------------ plain values


def printable(text: str) -> str:
    """Model output may hold control characters (ESC, CR, C1, bidi overrides); a terminal must
    never receive them raw: each becomes a middle dot. Newlines and tabs stay."""
    return "".join(c if c.isprintable() or c in "\n\t" else "\u00b7" for c in text.replace("\r\n", "\n"))


def path_text(path: object) -> str:
    """A file name safe for one terminal line: control characters and undecodable bytes escaped
    (not dotted as `printable` does: the name must stay findable)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(path))


@functools.cache
def program() -> str:
    """How to run gpt2-tui in a printed command, so the advice runs as printed: `gpt2-tui` when
    that name on PATH is this program, else the script as it was invoked (`.venv/bin/gpt2-tui`
    when the venv is not on PATH), else this Python running the entry module."""
    argv0 = sys.argv[0] if sys.argv else ""
    on_path = shutil.which("gpt2-tui")
    script = Path(argv0) if Path(argv0).name == "gpt2-tui" and os.access(argv0, os.X_OK) else None
    if script is None:  # not started as the script (python -m, pytest, torchrun): the venv's own script
        sibling = Path(sys.executable).parent / "gpt2-tui"
        script = sibling if os.access(sibling, os.X_OK) else None
    if script is None:
        return "gpt2-tui" if on_path else f"{sys.executable} -m gpt2_tui"
    if on_path and Path(on_path).resolve() == script.resolve():
        return "gpt2-tui"
    return str(script) if "/" in str(script) else str(script.resolve())


SAMPLE_LINES, SAMPLE_CHARS = 6, 400  # a console sample: a glance at the model, not a page


def sample_text(text: str, indent: str = "    ") -> str:
    """A sample for a log: made safe, its first lines only, indented under its header."""
    safe = printable(text).rstrip()
    head = safe[:SAMPLE_CHARS].split("\n")[:SAMPLE_LINES]
    lines = [indent + line.rstrip() for line in head] if safe else [indent + "(empty)"]
    if len("\n".join(head)) < len(safe):
        lines.append(indent + "...")
    return "\n".join(lines)


def human(n: int | float | None) -> str:
    """Bytes in binary units: 512 B, 3.2 MiB, 14.81 GiB ("-" for unknown). The one byte format."""
    if n is None:
        return "-"
    n = float(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def parse_bytes(text: str) -> int:
    """'80GiB', '80 GB', '24g', '512MiB', '1e9' -> bytes (GB = 1e9, GiB = 2**30, bare g = GiB)."""
    t = text.strip().replace(" ", "").lower()
    units = {"tib": 1 << 40, "gib": GiB, "mib": MiB, "kib": 1024, "tb": 10**12, "gb": 10**9,
             "mb": 10**6, "kb": 10**3, "t": 1 << 40, "g": GiB, "m": MiB, "k": 1024, "b": 1}  # fmt: skip
    for suffix, mult in units.items():
        if t.endswith(suffix):
            number, scale = t[: -len(suffix)], mult
            break
    else:
        number, scale = t, 1
    try:
        value = float(number) * scale
    except ValueError:
        value = -1
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"cannot read memory size {text!r}; write it like 80GiB, 24GB or 512MiB")
    return int(value)


def fmt_params(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"


def loss_text(loss: float) -> str:
    """A loss as people read it: 4 significant digits (10.83, 3.412, 0.8123); more are noise."""
    return f"{loss:.4g}"


def params_text(n_params: int, vocab: int) -> str:
    """'124.5M params (vocab 50257)': a parameter count means little without the vocab it assumes."""
    return f"{fmt_params(n_params)} params (vocab {vocab})"


def ratio_text(v: float | None) -> str:
    """A speedup: '1.52x' ('-' for unknown)."""
    return "-" if v is None else f"{v:.2f}x"


def duration_text(seconds: float) -> str:
    """'42s', '12m34s', '1h02m': short enough for a log line."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def clock_text(seconds: float | None) -> str:
    """'4:07', '1:02:03': a duration as a clock, for the dashboard and the ladder ('-' for unknown)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def short(name: str) -> str:
    """'speed.compile' -> 'compile': the sections are noise in a table or a log line."""
    return name.rsplit(".", 1)[-1]


def value_text(v: Any) -> str:
    """A switch's value as people say it: on/off, auto for None."""
    return {True: "on", False: "off", None: "auto"}[v] if isinstance(v, (bool, type(None))) else str(v)


def change_text(diff: dict[str, list[Any]]) -> str:
    """'compile off -> on, prefetch on -> off' (empty when nothing changed)."""
    return ", ".join(f"{short(n)} {value_text(a)} -> {value_text(b)}" for n, (a, b) in diff.items())


# ------------------------------------------------------------------------------ events and the estimate


def describe(e: Any, max_steps: int | None = None, eta: float | None = None) -> str:
    """The text of an event: the console's, the dashboard log's, `attach`'s. One line, but a
    run's end (its settled speed follows) and a sample (its text, indented). `eta`: seconds
    to the end, for a step line. `e`: an engine.events event, told by its tag. Events are read
    from files anyone may write: the text passes `printable`, whatever field it came from."""
    return printable(_describe(e, max_steps, eta))


def unsettled_end(e: Any, from_step: int, reports: int, before: Any = None) -> str:
    """A run's end whose last segment has too few step reports to settle (a one-step compile
    segment): its speed is no settled one, said so; then the last segment that did settle
    (`before`: an engine.run.segments.SegmentSummary; None: none did), named as such."""
    first = e.summary.get("first_step_time_s") if isinstance(e.summary, dict) else None
    head = describe(e.model_copy(update={"summary": {}}))
    plural = "s" * (reports != 1)
    line = (f"{head}\nthe last segment (from step {from_step}) has {reports} step report{plural}, too few to settle"
            + (f" (first step {first:.2f} s)" if isinstance(first, (int, float)) else ""))  # fmt: skip
    if before is None or before.settled_step_time_s is None:
        return line + ": no settled speed"
    c = before.contention
    summary = {"median_step_time_s": before.settled_step_time_s, "tokens_per_s": before.tokens_per_s or 0.0,
               "mfu": before.mfu, "peak_mem_bytes": before.peak_mem_bytes,
               "first_step_time_s": before.first_step_time_s or 0.0,
               "contention": c.model_dump() if c is not None and hasattr(c, "model_dump") else c}  # fmt: skip
    speed = describe(e.model_copy(update={"summary": summary})).split("\n", 1)[1]
    return f"{line}; the last settled segment instead (steps {before.from_step}-{before.to_step}):\n{speed}"


def shown(value: object) -> str:
    """A cell or a one-line message made from file contents: `printable`, on one line."""
    return printable(str(value)).replace("\n", " ").replace("\t", " ")


def attention_text(e: Any) -> str:
    """A run_started's attention kernel, and what was measured to pick it: 'attention cuDNN
    (measured: cuDNN 0.84 ms, flash 1.02 ms)'; '' for manual attention (or an older run)."""
    kernel = getattr(e, "attention", None)
    if not isinstance(kernel, str):
        return ""
    ms = getattr(e, "attention_ms", None) or {}
    timed = ", ".join(f"{printable(str(n))} {'n/a' if v is None else f'{v:.2f} ms'}" for n, v in ms.items()
                      if isinstance(v, (int, float, type(None))))  # fmt: skip
    return f"attention {printable(kernel)}" + (f" (measured: {timed})" if timed else "")


def contention_text(c: Any, short: bool = False) -> str:
    """A timing taken on a busy machine, in words ('' when it was not): the load against the
    CPUs and the share of the CPU time the process wanted that it spent waiting, the figures
    engine/train/contention.py judged it by. `c`: an engine.events.Contention, or its dict in a
    run_finished summary (read from a file: the numbers are checked here). `short`: a marker."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    if c is None or get("contended") is not True:
        return ""

    def num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    load, cores, stolen = get("load"), get("cores"), get("stolen")
    parts = [f"load {load:.1f}{'/' if short else ' on '}{cores:g} CPUs"] if num(load) and num(cores) else []
    if num(stolen):
        parts.append(f"{100 * stolen:.0f}% CPU wait" if short else
                     f"{100 * stolen:.0f}% of the CPU time it wanted spent waiting")
    what = ", ".join(parts) or "a busy machine"
    if short:
        return f"busy: {what}"
    return (f"timed on a busy machine ({what}): slower and noisier than this machine can do, so a wall-clock "
            "comparison with another run (compare's speed-ups, the time to a target) means little here; rerun when "
            "it is quiet")  # fmt: skip


def _describe(e: Any, max_steps: int | None, eta: float | None) -> str:
    match e.event:
        case "run_started":
            b, a, t = (e.setting(f"train.{k}") or "?" for k in ("batch_size", "grad_accum", "block_size"))
            return (
                f"run started: {e.n_params / 1e6:.2f}M parameters on {e.device_name} ({e.device}, {e.precision}), "
                f"{b}x{a}x{t} tokens/step, from step {e.start_step}"
            ) + (f", {e.world_size} processes ({e.parallel})" if e.world_size > 1 else "") + (
                f", weights from {printable(e.init_from)}" if getattr(e, "init_from", None) else ""
            ) + (f", {attention_text(e)}" if getattr(e, "attention", None) else "") + (
                f" ({busy})" if (busy := contention_text(getattr(e, "contention", None), short=True)) else ""
            )
        case "step":
            mfu = "-" if e.mfu is None else f"{100 * e.mfu:.1f}%"
            return (
                f"step {e.step:>6}/{max_steps} | loss {loss_text(e.loss)} | lr {e.lr:.2e} | "
                f"norm {e.grad_norm:.3f} | {1000 * e.step_time_s:.1f} ms | "
                f"{e.tokens_per_s:,.0f} tok/s | mfu {mfu} | mem {human(e.mem_bytes)}"
            ) + (f" | eta {duration_text(eta)}" if eta else "")
        case "eval":
            return f"eval step {e.step}: val loss {loss_text(e.val_loss)}"
        case "checkpoint":
            return f"checkpoint step {e.step}: {e.path}{' (best)' if e.best else ''}"
        case "warning":
            return f"warning: {e.message}"
        case "run_finished":
            best = "-" if e.best_val_loss is None else loss_text(e.best_val_loss)
            line = f"run {e.reason} at step {e.step}; best val loss {best}"
            s = e.summary
            if s:
                mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
                line += (
                    f"\nsettled speed: {1000 * s['median_step_time_s']:.1f} ms/step, "
                    f"{s['tokens_per_s']:,.0f} tok/s, mfu {mfu}, peak mem "
                    f"{human(s.get('peak_mem_bytes'))} (first step {s['first_step_time_s']:.2f} s)"
                )
                if busy := contention_text(s.get("contention")):
                    line += f"\n{busy}"
            return line
        case "run_failed":
            return f"run failed at step {e.step}: {e.error}"
        case "paused" | "resumed":
            return f"{e.event} at step {e.step}"
        case "request":
            why = f": {e.reason}" if e.reason else ""
            return f"request {e.id} ({e.kind}) {e.status} at step {e.step}{why}"
        case "segment":
            if e.reason == "start":
                return ""  # run_started already said it all
            return f"segment from step {e.step}: {change_text(e.changed) or 'switches unchanged'} ({e.reason})"
        case "compiled":
            if not e.compiled:
                return f"compile ({e.scope}): nothing was compiled by step {e.step}; the segment runs eager"
            return (f"compile ({e.scope}): {e.compile_s:.1f} s, {e.source} "
                    f"({e.graphs} graph{'s' * (e.graphs != 1)}, cache {e.cache_hits} hit / {e.cache_misses} miss)")
        case "sample":
            return f"sample at step {e.step}:\n{sample_text(e.text)}"
        case "tune_plan" | "tune_trial" | "tune_done":
            return tune_text(e)
    return ""  # gpu: a reading a second: the GPU tab draws them, the log and console do not


def tune_text(e: Any) -> str:
    """A tune's event (engine/run/tune.py) as the console's and the log's line."""
    if e.event == "tune_plan":
        spend = (f"{e.budget_steps} steps" if e.budget_steps is not None else duration_text(e.budget_s or 0))
        per = max(1, e.steps_per_trial)  # read from a file: never a division by zero
        need = per * (len(e.trials) + 1)
        covers = (f", enough for about {max(0, e.budget_steps // per - 1)} of them"
                  if e.budget_steps is not None and e.budget_steps < need else "")  # fmt: skip
        line = (f"tuning from step {e.step}: {len(e.trials)} trials after the start ({', '.join(e.trials) or 'none'}), "
                f"about {need} steps ({per} each, more for a noisy one) plus each one's warm-up; "
                f"budget {e.budget} ({spend}){covers}")
        return line + "".join(f"\n  not tried: {s}" for s in e.skipped)
    if e.event == "tune_trial":
        head = f"tuning: trial {e.index} of {e.of}, {e.label}"
        if e.status == "trying":
            return f"{head}: trying from step {e.step}"
        if e.status == "skipped":
            return f"{head}: skipped ({e.reason})"
        if e.settled_step_time_s is None:
            return f"{head}: {e.status} ({e.reason})"
        vs = f", {e.vs_start:.2f}x the start" if e.vs_start else ""
        busy = " (timed on a busy machine: marked !)" if e.status == "contended" else ""
        why = f" ({e.reason})" if e.reason else ""
        warm = f", warm-up {e.warmup_s:.1f} s" if e.warmup_s and e.warmup_s >= 0.05 else ""
        return f"{head}: {1000 * e.settled_step_time_s:.1f} ms/step settled{vs}{warm}{busy}{why}"
    gain = f", {e.gain:.2f}x the start" if e.gain else ""
    chose = change_text(e.changed) or "the start's switches"
    saved = f"; saved for --from-tuned in {e.tuned_file}" if e.tuned_file else ""
    return f"tune done at step {e.step} ({e.reason}): {chose}{gain}, {e.trials} trials measured{saved}"


def verdict(est: Any, device_bytes: int | None) -> str:
    if device_bytes is None:
        return f"peak {human(est.peak_bytes)}; device memory unknown (pass --device-memory)"
    if est.fits(device_bytes):
        return f"fits: peak {human(est.peak_bytes)} of {human(device_bytes)} ({human(device_bytes - est.peak_bytes)} to spare)"
    return f"does not fit: peak {human(est.peak_bytes)} > {human(device_bytes)} available"


def format_table(est: Any, device_bytes: int | None, model_size: str | None = None) -> str:
    """An engine.train.memory.MemoryEstimate as a plain-text table: each part's full size, what of
    it is alive at the peak, the phases, the peak and the verdict. `model_size`: the model's size in
    words (engine.train.memory.size_text), else the estimate's parameter count and vocab."""
    rows = [("part", "size", "at peak")]
    for name, size in est.components.items():
        if size or est.breakdown.get(name):
            rows.append((name, human(size), human(est.breakdown.get(name, 0))))
    w0, w1 = (max(len(r[i]) for r in rows) + 2 for i in (0, 1))
    lines = [
        f"{model_size or params_text(est.n_params, est.vocab_size)}, "
        f"micro-batch {est.batch_size} x {est.seq_len} tokens, "
        f"grad accum {est.grad_accum}, {est.precision} on {est.target}"
        + (f", {est.world_size} ranks ({est.sharding})" if est.world_size > 1 else "")
        + (", torch.compile" if est.compile else ""),
        "",
    ]
    for i, (a, b, c) in enumerate(rows):
        lines.append(f"{a:<{w0}}{b:>{w1}}{c:>{w1 + 2}}")
        if i == 0:
            lines.append("-" * (w0 + 2 * w1 + 2))
    lines.append("-" * (w0 + 2 * w1 + 2))
    lines.append(f"{'peak (' + est.peak_phase + ')':<{w0 + w1}}{human(est.peak_bytes):>{w1 + 2}}")
    lines += ["", "allocated by phase: " + ", ".join(f"{k} {human(v)}" for k, v in est.phases.items())]
    lines.extend(f"note: {n}" for n in est.notes)
    lines.append(verdict(est, device_bytes))
    return "\n".join(lines)


def fix_flags(fitted: RunConfig) -> str:
    """The flags that give a config `fitted`'s micro-batch, e.g. '--batch-size 8 --grad-accum 4'."""
    return f"--batch-size {fitted.train.batch_size} --grad-accum {fitted.train.grad_accum}"


def advice(fitted: RunConfig | None) -> str:
    """What to change when a config does not fit, given the estimator's largest micro-batch
    that does (memory.suggest_fit; None when none does)."""
    if fitted is not None:
        return f"suggested fix: {fix_flags(fitted)} (same sequences per optimizer step)"
    return (
        "even micro-batch 1 does not fit: try --grad-checkpointing, a shorter --block-size, "
        "bf16, more ranks with fsdp, or a smaller model"
    )
