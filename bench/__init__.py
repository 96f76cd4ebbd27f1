"""Measuring tools, apart from the product: the speed ladder, the independent reference loop,
the best-config sweep, the compile timeline, batch-building and memory measurements, the
dashboard's overhead and first paint, the GPU report; `gpt2-tui bench` dispatches (cli.py).

They train with the engine's own Trainer (engine.run.owner.start) and write tables to a new directory;
engine/ never imports them (pyproject's import-linter contract). The TUI's F8 screen runs the ladder.
"""
