"""Measuring tools: the speed ladder, the independent reference loop, the best-config sweep,
the compile timeline, batch-building and memory measurements, the GPU report.

They train with the engine's own Trainer (engine.start) and write tables to a new directory;
engine/ core never imports them.
"""
