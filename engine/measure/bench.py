"""`gpt2-tui bench`: which measuring tool the options ask for.

    bench --preset P            the cumulative speed ladder (ladder.py)
    bench --config FILE         one config over time: the compile warm-up settling (timeline.py)
    bench --plain               our Trainer vs an independent plain GPT-2 loop (plain.py)
    bench --best                every optimization on, micro-batch x compile mode swept (best.py)
"""

from __future__ import annotations

from engine.measure.common import BenchOptions


def run(opts: BenchOptions, command: str = "gpt2-tui bench") -> int:
    if opts.config is not None:
        from engine.measure import timeline

        return timeline.run(opts, command)
    if opts.best:
        from engine.measure import best

        return best.run(opts, command)
    if opts.plain:
        from engine.measure import plain

        return plain.run(opts, command)
    from engine.measure import ladder

    return ladder.run(opts, command)
