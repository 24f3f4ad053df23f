"""Clocks. The scheduler reads local time only through a Clock, so tests can inject a wrong one.

Every "is it due / is it dead" decision is taken by the database (its ``now()``); the local
clock is used only to measure intervals and, corrected by the observed offset to the database
clock, to estimate the database's time between statements.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

__all__ = ["Clock", "ManualClock", "OffsetClock", "SystemClock"]


class Clock(Protocol):
    """A source of wall-clock time (aware UTC) and monotonic seconds."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's clock. Its methods are the C functions themselves (read several times
    per execution): no Python call in between."""

    now: Callable[[], datetime] = staticmethod(partial(datetime.now, UTC))
    monotonic: Callable[[], float] = staticmethod(time.monotonic)


class OffsetClock:
    """The machine's clock shifted by a fixed offset: a node whose clock is wrong (for tests)."""

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """Wall-clock time that moves only when told (``ekbatan_fastapi.testing.TimeMachine``);
    monotonic seconds stay the machine's, so timeouts and heartbeats measure real time."""

    def __init__(self, start: datetime) -> None:
        self._now = _aware_utc(start, "start")

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return time.monotonic()

    def set(self, when: datetime) -> None:
        """Move to ``when`` (aware)."""
        self._now = _aware_utc(when, "when")


def _aware_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError(
            f"{name} must be an aware datetime, got {value!r}; e.g. "
            "datetime(2026, 1, 1, 2, 0, tzinfo=UTC)"
        )
    return value.astimezone(UTC)
