"""Per-job timeouts (``Job.timeout()``): an ``async def`` execution is cancelled at its timeout
and given a grace period to clean up; one that ignores its cancellation past the grace is
abandoned like at shutdown (its row stays picked, its heartbeats stop, it is revived after the
dead window). A plain ``def`` execution cannot be interrupted: ``ctx.is_timed_out`` turns true
and it is recorded as timed out when it returns. Either way the row stays picked and
heartbeated until the execution has really ended, so the next slot never overlaps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from ..domain.durations import format_iso_duration
from ..domain.errors import JobTimedOut
from ..domain.logs import library_logger
from .execution import Execution
from .logs import log_extra

__all__ = ["Abandoned", "TimeoutRunner"]

log = library_logger(__name__)


class Abandoned(Exception):
    """A timed-out execution ignored its cancellation past the grace period."""


class TimeoutRunner:
    """Runs executions of jobs that have a timeout."""

    def __init__(self, scheduler_name: str, grace: timedelta) -> None:
        self.name = scheduler_name
        self.grace = grace
        self._abandoned: set[asyncio.Future[Any]] = set()
        """Abandoned executions still running (kept referenced until they end)."""

    def timed_out(self, execution: Execution, timeout: timedelta) -> JobTimedOut:
        execution.timed_out = True
        return JobTimedOut(
            f"{execution.label} ran longer than its timeout of {format_iso_duration(timeout)}"
        )

    async def run_async(
        self, execution: Execution, work: Awaitable[None], timeout: timedelta
    ) -> BaseException | None:
        """Run ``work`` (the job's ``execute(ctx)``) as a task of its own, bounded by
        ``timeout``; the error to record (``JobTimedOut`` at the timeout). Raises ``Abandoned``
        when it ignored its cancellation for the whole grace period, and ``CancelledError``
        when this execution itself is cancelled (shutdown: the job is cancelled with it)."""
        inner = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({inner}, timeout=timeout.total_seconds())
            if inner in done:
                return _outcome(inner)
            error = self.timed_out(execution, timeout)
            log.warning(
                "%s ran past its timeout of %s: cancelled, %s to clean up",
                execution.label,
                timeout,
                self.grace,
                extra=log_extra(execution.row, self.name),
            )
            inner.cancel()
            done, _ = await asyncio.wait({inner}, timeout=self.grace.total_seconds())
            if inner not in done:
                self._abandon(execution, inner)
                raise Abandoned
            cause = _outcome(inner)
            if cause is not None and not isinstance(cause, asyncio.CancelledError):
                error.__cause__ = cause
            return error
        except asyncio.CancelledError:
            inner.cancel()
            await asyncio.wait({inner})
            raise

    def _abandon(self, execution: Execution, inner: asyncio.Future[Any]) -> None:
        log.error(
            "%s ignored its cancellation for %s after its timeout: abandoned; its row stays "
            "picked and is revived after the dead window (make the job stop when cancelled, "
            "or check ctx.is_timed_out)",
            execution.label,
            self.grace,
            extra=log_extra(execution.row, self.name),
        )
        self._abandoned.add(inner)
        inner.add_done_callback(self._abandoned.discard)

    def arm(self, execution: Execution, timeout: timedelta) -> Callable[[], None]:
        """For a plain ``def`` execution: ``ctx.is_timed_out`` turns true at the timeout.
        Returns the call that disarms the timer."""
        handle = asyncio.get_running_loop().call_later(
            timeout.total_seconds(), self._flag, execution, timeout
        )
        return handle.cancel

    def _flag(self, execution: Execution, timeout: timedelta) -> None:
        execution.timed_out = True
        log.warning(
            "%s runs past its timeout of %s: a plain def job cannot be interrupted; "
            "ctx.is_timed_out is now true, and it is recorded as timed out when it returns",
            execution.label,
            timeout,
            extra=log_extra(execution.row, self.name),
        )


def _outcome(task: asyncio.Future[Any]) -> BaseException | None:
    """What a finished job task ended with (a ``CancelledError`` it raised itself is a
    failure, as without a timeout)."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()
