"""``paced``: a long loop of the start (100,000 jobs) that gives the event loop a turn every
``PACE`` items, so an application's other tasks (its routes, the heartbeats) are not held up
for the whole loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

__all__ = ["PACE", "paced"]

T = TypeVar("T")

PACE = 1000
"""Items between two turns of the event loop (a few milliseconds of work)."""


async def paced(items: Iterable[T], every: int = PACE) -> AsyncIterator[T]:
    """``items``, with an ``await asyncio.sleep(0)`` before every ``every``-th one."""
    for index, item in enumerate(items):
        if index and index % every == 0:
            await asyncio.sleep(0)
        yield item
