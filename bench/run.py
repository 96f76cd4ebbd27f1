"""`gpt2-tui bench`: which measuring tool the options ask for.

    bench --preset P            the cumulative speed ladder (ladder.py)
    bench --config FILE         one config over time: the compile warm-up settling (timeline.py)
    bench --plain               our Trainer vs an independent plain GPT-2 loop (plain.py)
    bench --best                every optimization on, micro-batch x compile mode swept (best.py)
    bench --gpu-report          the GPU figures for docs/gpu/: a short window's profile, or --full (gpu_report.py)
    bench --to-loss X           each rung trained to val loss X, ranked by training time to it (to_loss.py)
    bench --recipe-ladder       the speedrun's tricks: each added, then each left out, over paired seeds,
                                ranked by training time to the baseline's final val loss (recipe_ladder.py)
"""

from __future__ import annotations

from bench.common import BenchOptions
from engine.errors import UserError


def run(opts: BenchOptions, command: str = "gpt2-tui bench") -> int:
    if opts.gpu_report:  # its --out is the report's directory, merged into: checked by gpu_report
        from bench import gpu_report

        return gpu_report.run(opts, command)
    from engine import device
    from engine import rundir

    device.pick(opts.device)  # a device this machine lacks: one line, before any out dir exists
    if opts.out is not None:
        rundir.check_new(opts.out)  # each tool checks again where it creates it
    report_only = [f for f, v in (("--part", opts.part), ("--dry-run", opts.dry_run), ("--full", opts.full),
                                  ("--no-doctor", opts.no_doctor)) if v]  # fmt: skip
    if report_only:
        raise UserError(f"{report_only[0]} belongs to --gpu-report; add --gpu-report or leave it out")
    if opts.budget and (opts.config is not None or opts.plain or opts.best):
        raise UserError("--budget bounds the ladder (and --gpu-report's parts), not --config, --plain or --best; leave it out")
    if opts.nanogpt is not None and not opts.plain:
        raise UserError("--nanogpt times nanoGPT's train.py beside --plain's loops: add --plain, or leave it out")
    if opts.compile_cache and (opts.plain or opts.best):
        raise UserError("--compile-cache times the ladder or --config FILE, not --plain or --best; leave it out")
    if opts.seeds is not None and not opts.recipe_ladder:
        raise UserError("--seeds is --recipe-ladder's (seeds per row): add --recipe-ladder, or leave it out")
    if opts.to_loss is not None or opts.recipe_ladder:
        other = [f for f, v in (("--config", opts.config is not None), ("--plain", opts.plain), ("--best", opts.best),
                                ("--compile-cache", opts.compile_cache)) if v]  # fmt: skip
        if other:
            raise UserError(f"--to-loss trains the ladder's rungs to a loss; {other[0]} is another tool: leave one out")
        if opts.recipe_ladder:
            from bench import recipe_ladder

            return recipe_ladder.run(opts, command)
        from bench import to_loss

        return to_loss.run(opts, command)
    if opts.config is not None:
        from bench import timeline

        return timeline.run(opts, command)
    if opts.best:
        from bench import best

        return best.run(opts, command)
    if opts.plain:
        from bench import plain

        return plain.run(opts, command)
    from bench import ladder

    return ladder.run(opts, command)
