"""``DatabaseLink``: what one scheduler instance knows of its database, shared by its loops.

The database's clock, estimated between statements from the local clock and the last
observed offset; the current condition (``ok``, or what the last error means: unreachable,
read-only, a pooler mismatch, ...) and since when; the last error with its time, which stays
after recovery; the rule for logging errors (the first one at once, then at most one a minute
while the outage lasts); and the signal that the loops reached the database again after a
failover-like error (``moved``), on which the listener reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from ..domain.clock import Clock
from ..domain.logs import library_logger
from ..store.database import Diagnosis
from .observer import ObserverDispatch

__all__ = ["FAILOVER_CONDITIONS", "DatabaseLink"]

log = library_logger(__name__)

_LOG_EVERY = 60.0
"""Seconds between error lines while the database stays unreachable."""

FAILOVER_CONDITIONS = ("unreachable", "timeout", "read-only")
"""Errors after which the next answer may come from another server (a failover): the
listener's connection, which saw none of them, may still be on the old one."""


def _undiagnosed(error: BaseException) -> Diagnosis:
    return Diagnosis("unreachable", False, f"{type(error).__name__}: {error}")


class DatabaseLink:
    """The database clock, condition and last error of one scheduler instance."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        observer: ObserverDispatch,
        diagnose: Callable[[BaseException], Diagnosis] = _undiagnosed,
    ) -> None:
        self.name = name
        self.clock = clock
        self.observer = observer
        self.diagnose = diagnose
        self.offset = timedelta(0)
        self.reachable: bool | None = None
        """None until the first round trip was attempted; False while the last attempt got
        no answer (an error that is the database's answer leaves it True)."""
        self.condition = "unknown"
        """``ok`` after an answer; else the last error's condition (``Diagnosis``)."""
        self.condition_since: datetime | None = None
        self.last_error: str | None = None
        """The last error, kept after recovery (``last_error_at`` says when)."""
        self.last_error_at: datetime | None = None
        self._stamped: datetime | None = None
        """The latest of ``condition_since`` / ``last_error_at`` given out (see ``_stamp``)."""
        self._last_logged = -1e9
        self._maybe_moved = False
        self.moved = asyncio.Event()
        """Set when the loops get answers again after a failover-like error."""

    def now(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.clock.now() + self.offset

    def _stamp(self) -> datetime:
        """``now()`` for the status's times, never earlier than the last one given out: the
        estimate moves with each observed offset (by a few milliseconds on a loaded machine),
        and an error followed at once by a recovery must not read as ``ok`` since before it."""
        stamp = self.now()
        if self._stamped is not None and stamp < self._stamped:
            stamp = self._stamped
        self._stamped = stamp
        return stamp

    def observed(self, db_now: datetime, sent: datetime | None = None) -> None:
        """Learn the database clock's offset from ``now()`` read in a statement sent at local
        time ``sent``: ``now()`` is taken when the statement starts, so measuring against the
        time the answer arrived would make every later wake-up late by that round trip."""
        self.offset = db_now - (sent if sent is not None else self.clock.now())
        self.answered()

    def answered(self) -> None:
        """A statement got its answer: the database is reachable and works."""
        if self.condition != "ok":
            if self.condition != "unknown":
                log.warning(
                    "scheduler %s: the database answers again (was: %s)", self.name, self.condition
                )
            self._set_condition("ok")
        self.reachable = True
        if self._maybe_moved:
            self._maybe_moved = False
            self.moved.set()

    def _set_condition(self, condition: str) -> None:
        if condition != self.condition:
            self.condition = condition
            self.condition_since = self._stamp()

    def report(self, condition: str, message: str) -> None:
        """A condition found without a failed statement (a missing table at startup, a
        crashed loop): shown like an error."""
        self.last_error = message
        self.last_error_at = self._stamp()
        self._set_condition(condition)

    def failed(self, error: BaseException, where: str, *, failover: bool = True) -> None:
        """A statement of ``where`` failed (the caller retries): record, count and log it.
        ``failover``: the error may mean the database moved (the listener's own loss does not
        count: it reconnects anyway)."""
        diagnosis = self.diagnose(error)
        self.last_error = f"{where}: {diagnosis.message}"
        self.last_error_at = self._stamp()
        if self.observer.active:
            self.observer.database_error(where, error)
        was = self.condition
        self.reachable = diagnosis.reachable
        self._set_condition(diagnosis.condition)
        if failover and diagnosis.condition in FAILOVER_CONDITIONS:
            self._maybe_moved = True
        now = self.clock.monotonic()
        if was != diagnosis.condition or now - self._last_logged > _LOG_EVERY:
            self._last_logged = now
            log.error(
                "scheduler %s: database error during %s (will retry): %s",
                self.name,
                where,
                self.last_error,
                extra={"scheduler": self.name},
            )
