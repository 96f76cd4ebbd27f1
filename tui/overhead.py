"""What the dashboard costs the run it shows: the same config headless and under the TUI.

    python -m tui.overhead --preset micro --max-steps 300 --rounds 2

Each round trains the config once headless (the Trainer alone on a worker thread with
the same torch thread count: a thread's OpenMP team is its own, and on a loaded 2-core
machine 1 vs 2 intra-op threads alone moved micro's step time 5x) and once under the dashboard (the app in headless-terminal mode at
160x50, every chart visible, launched in-process the way F5 does). With --detached the
pair is: the headless CLI process alone, and the same command spawned by F6 with the
dashboard tailing its file.
Modes alternate so that load drifting on a shared machine hits both. The figure is the
settled step time (median over the second half of the steps, as the trainer's summary
reports it) and the overhead is TUI over headless.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.api import RunConfig, console, resolve, start
from engine.api import events as ev


def _summary(run_dir: Path) -> dict[str, Any]:
    events, _ = ev.read_events(run_dir / "events.jsonl")
    done = [e for e in events if isinstance(e, ev.RunFinished)]
    if not done:
        raise RuntimeError(f"{run_dir}: the run did not finish")
    return done[-1].summary


def run_headless(config: RunConfig, run_dir: Path, threads: int) -> dict[str, Any]:
    """The trainer alone, on a worker thread set up exactly like the TUI's (same torch
    thread count): what differs between the two modes is then only the dashboard."""
    import threading

    import torch

    def work() -> None:
        torch.set_num_threads(threads)
        start(config, run_dir).run()

    t = threading.Thread(target=work, name="bench-headless")
    t.start()
    t.join()
    return _summary(run_dir)


def run_headless_cli(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """The baseline for --detached: exactly the command F6 spawns, with no dashboard."""
    from engine.api import child, headless_command

    cfg_file = run_dir.with_suffix(".toml")
    cfg_file.write_text(config.model_copy(update={"out_dir": str(run_dir)}).to_toml())
    done = child.run(headless_command(cfg_file, run_dir), timeout=None)
    if done.returncode != 0:
        raise RuntimeError(f"the headless run exited {done.returncode}: {done.output.strip()[-300:]}")
    return _summary(run_dir)


async def _run_tui(config: RunConfig, run_dir: Path, size: tuple[int, int], detached: bool, threads: int) -> dict[str, Any]:
    from tui.app import GPT2App
    from tui.widgets.charts import MetricChart

    app = GPT2App(attach_dir=None)
    draws0, secs0 = MetricChart.draws, MetricChart.draw_seconds
    async with app.run_test(headless=True, size=size) as pilot:
        await pilot.pause()
        app.launch(config, run_dir, detached=detached, threads=threads)
        session = app.session
        clock0: tuple[float, float] | None = None  # UI thread CPU and wall at the first step shown
        while session is None or session.alive() or session.state.live:
            await asyncio.sleep(0.05)
            if clock0 is None and session is not None and session.state.step > 0:
                clock0 = time.thread_time(), time.perf_counter()  # this coroutine runs on the UI thread
            if session is not None and session.state.finished is not None:
                break
            if session is not None and session.process is not None and session.process.poll() is not None:
                await asyncio.sleep(1.0)  # let the tail catch the last lines
                break
        c0, w0 = clock0 or (time.thread_time(), time.perf_counter())
        ui_cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        await pilot.pause()
    out = _summary(run_dir)
    out["ui_cpu_s"], out["wall_s"] = ui_cpu, wall
    out["chart_draws"] = MetricChart.draws - draws0
    out["draw_seconds"] = MetricChart.draw_seconds - secs0
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tui.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="micro")
    p.add_argument("--data", default=None, help="dataset dir (default: the embedded corpus)")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", default="160x50", help="terminal size of the dashboard")
    p.add_argument("--detached", action="store_true", help="measure the F5 launch (own process) instead")
    p.add_argument("--threads", type=int, default=None, help="torch threads on the trainer thread (default: torch's)")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))
    import torch

    threads = args.threads or torch.get_num_threads()
    over: dict[str, Any] = {"train.max_steps": args.max_steps, "train.eval_interval": 10**9,
                            "train.ckpt_interval": 10**9, "train.log_interval": 1}  # fmt: skip
    if args.data:
        over["data.path"] = args.data
    if args.batch_size:
        over["train.batch_size"] = args.batch_size
    config = resolve(args.preset, overrides=over)
    tui_mode = "tui-detached" if args.detached else "tui-in-process"
    results: dict[str, list[dict[str, Any]]] = {"headless": [], tui_mode: []}
    root = Path(tempfile.mkdtemp(prefix="gpt2-tui-overhead-"))
    t0 = time.time()
    try:
        for r in range(args.rounds):
            for mode in ("headless", tui_mode) if r % 2 == 0 else (tui_mode, "headless"):
                run_dir = root / f"{mode}-{r}"
                if mode == "headless" and args.detached:
                    res = run_headless_cli(config, run_dir)
                elif mode == "headless":
                    res = run_headless(config, run_dir, threads)
                else:
                    res = asyncio.run(_run_tui(config, run_dir, (w, h), args.detached, threads))
                results[mode].append(res)
                console.err.line(f"round {r} {mode:>15}: {1000 * res['median_step_time_s']:.2f} ms/step", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    head = statistics.median(x["median_step_time_s"] for x in results["headless"])
    tui = statistics.median(x["median_step_time_s"] for x in results[tui_mode])
    draws = sum(x.get("chart_draws", 0) for x in results[tui_mode])
    secs = sum(x.get("draw_seconds", 0.0) for x in results[tui_mode])
    console.out.line(f"config: preset {args.preset}, {config.tokens_per_step} tokens/step, {args.max_steps} steps, "
                     f"{args.rounds} rounds, dashboard {w}x{h}; torch threads {threads} on the trainer thread, "
                     f"{os.cpu_count()} CPUs; {time.time() - t0:.0f} s")  # fmt: skip
    console.out.line("| mode | settled ms/step (median of rounds) | per round | overhead |")
    console.out.line("|---|---:|---|---:|")
    for mode, val in (("headless", head), (tui_mode, tui)):
        rounds = ", ".join(f"{1000 * x['median_step_time_s']:.1f}" for x in results[mode])
        ovh = "-" if mode == "headless" else f"{100 * (val / head - 1):+.1f}%"
        console.out.line(f"| {mode} | {1000 * val:.2f} | {rounds} | {ovh} |")
    pairs = [t["median_step_time_s"] / h["median_step_time_s"] - 1 for h, t in zip(results["headless"], results[tui_mode])]
    console.out.line(f"paired overhead, round by round (each pair ran back to back): "
                     f"{', '.join(f'{100 * p:+.1f}%' for p in pairs)}; median {100 * statistics.median(pairs):+.1f}%")  # fmt: skip
    ui = sum(x["ui_cpu_s"] for x in results[tui_mode])
    wall = sum(x["wall_s"] for x in results[tui_mode])
    console.out.line(f"UI thread CPU time while training: {ui:.1f} s over {wall:.1f} s = {100 * ui / wall:.1f}% "
                     f"(less load-dependent: the most of the time the UI can hold the GIL or a core)")  # fmt: skip
    if draws:
        console.out.line(f"chart builds+renders: {draws} builds, {secs:.2f} s in plotext over the TUI runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
