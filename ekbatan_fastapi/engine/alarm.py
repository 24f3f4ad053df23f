"""``Alarm``: when the poller wakes. It sleeps until the polling interval ends, an earlier
known due time (database clock) comes, or somebody asks for a poll (new work due now, capacity
freed, a revival, shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

from .link import DatabaseLink

__all__ = ["Alarm"]

_LATE = 0.002
"""Seconds after a due time to wake: the comparison in SQL is ``<= now()``."""


class Alarm:
    """The poller's alarm clock."""

    def __init__(
        self, link: DatabaseLink, stopping: Callable[[], bool], ahead: timedelta = timedelta(0)
    ) -> None:
        self._link = link
        self._stopping = stopping
        self._ahead = ahead
        """``claim_ahead``: wake this long before a due time (the poll claims that far ahead)."""
        self._wake = asyncio.Event()
        self._requested = False
        self.planned_due: datetime | None = None
        """The earliest due time the poller knows of (database time), if sooner than the
        interval; the poller sets it after each poll."""

    def request_poll(self) -> None:
        """Poll now."""
        self._requested = True
        self._wake.set()

    def note_due(self, when: datetime) -> None:
        """Something becomes due at ``when`` (database time): wake up then, if that is sooner."""
        if self.planned_due is None or when < self.planned_due:
            self.planned_due = when
            self._wake.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep until the deadline, an earlier known due time, or a poll request."""
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + seconds
        while not self._stopping():
            if self.planned_due is not None:
                until = self.planned_due - self._ahead - self._link.now()
                until_due = until.total_seconds() + _LATE
                deadline = min(deadline, loop_time() + max(0.0, until_due))
            remaining = deadline - loop_time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            self._wake.clear()
            if self._requested:
                self._requested = False
                return
