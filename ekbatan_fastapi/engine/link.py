"""``DatabaseLink``: what one scheduler instance knows of its database, shared by its loops.

The database's clock, estimated between statements from the local clock and the last
observed offset; whether the database was reachable at the last attempt; the last error, and
the rule for logging errors (the first one at once, then at most one a minute while the
outage lasts).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from ..domain.clock import Clock
from .observer import ObserverDispatch

__all__ = ["DatabaseLink"]

log = logging.getLogger(__name__)

_LOG_EVERY = 60.0
"""Seconds between error lines while the database stays unreachable."""


class DatabaseLink:
    """The database clock, reachability and the last error of one scheduler instance."""

    def __init__(self, name: str, clock: Clock, observer: ObserverDispatch) -> None:
        self.name = name
        self.clock = clock
        self.observer = observer
        self.offset = timedelta(0)
        self.reachable: bool | None = None
        """None until the first round trip was attempted."""
        self.last_error: str | None = None
        self._last_logged = -1e9

    def now(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.clock.now() + self.offset

    def observed(self, db_now: datetime, sent: datetime | None = None) -> None:
        """Learn the database clock's offset from ``now()`` read in a statement sent at local
        time ``sent``: ``now()`` is taken when the statement starts, so measuring against the
        time the answer arrived would make every later wake-up late by that round trip."""
        self.offset = db_now - (sent if sent is not None else self.clock.now())
        self.answered()

    def answered(self) -> None:
        """A statement got its answer: the database is reachable."""
        if self.reachable is False:
            log.warning("scheduler %s: database reachable again", self.name)
        self.reachable = True

    def failed(self, error: BaseException, where: str) -> None:
        """A statement of ``where`` failed (the caller retries): record, count and log it."""
        self.last_error = f"{where}: {type(error).__name__}: {error}"
        if self.observer.active:
            self.observer.database_error(where, error)
        was_reachable = self.reachable
        self.reachable = False
        now = self.clock.monotonic()
        if was_reachable is not False or now - self._last_logged > _LOG_EVERY:
            self._last_logged = now
            log.error(
                "scheduler %s: database error during %s (will retry): %s",
                self.name,
                where,
                self.last_error,
                extra={"scheduler": self.name},
            )
