"""Clocks. The scheduler reads local time only through a Clock, so tests can inject a wrong one.

Every "is it due / is it dead" decision is taken by the database (its ``now()``); the local
clock is used only to measure intervals and, corrected by the observed offset to the database
clock, to estimate the database's time between statements.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "OffsetClock", "SystemClock"]


class Clock(Protocol):
    """A source of wall-clock time (aware UTC) and monotonic seconds."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class OffsetClock:
    """The machine's clock shifted by a fixed offset: a node whose clock is wrong (for tests)."""

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def monotonic(self) -> float:
        return time.monotonic()
