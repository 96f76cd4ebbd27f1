"""Shared by the Pilot tests: poll until a condition holds, or fail naming what never came."""

import asyncio

WAIT_S = 180.0  # generous bound for a loaded 2-core machine; the poll ends as soon as it holds


async def until(pilot, predicate, what: str, timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.05)
