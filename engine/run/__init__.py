"""A run's life: its directory, its one writer, the segments it trains, the requests it takes
(the mailbox), the events it emits, its loggers and its launchers (thread, process, torchrun)."""
