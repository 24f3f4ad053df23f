"""``SchedulerObserver``: hooks into the scheduler's events, for metrics and tracing.

The core calls them and knows nothing of what is behind them (``ekbatan_fastapi.metrics``
turns them into Prometheus metrics). Register one with
``customize_scheduler(lambda b: b.observer(my_observer))``.

Every hook has a no-op default, so an observer overrides only what it needs. Hooks run on the
scheduler's event loop, in the middle of its loops: keep them cheap and never block (no I/O).
An exception raised by a hook is logged and swallowed; it never breaks the scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ..domain.logs import library_logger
from ..domain.records import Outcome, outcome_of
from ..domain.rows import FinishKind

if TYPE_CHECKING:
    from ..domain.rows import Finish
    from .execution import Execution
    from .scheduler import Scheduler

__all__ = ["ExecutionFinished", "ObserverDispatch", "SchedulerObserver", "finished_event"]

log = library_logger(__name__)


@dataclass(frozen=True, slots=True)
class ExecutionFinished:
    """One execution, once its result was recorded (or found superseded)."""

    task_name: str
    task_instance: str
    execution_time: datetime
    """The slot that ran (the row's ``execution_time`` when it was claimed)."""
    outcome: Outcome
    duration: float
    """Seconds the job's ``execute`` ran (monotonic clock)."""
    slot_lag: float
    """Seconds from the slot (``execution_time``) to the start, on the database clock."""
    consecutive_failures: int | None
    """The row's count after this execution (0 after a success); None when it was not
    recorded (superseded) or released at shutdown."""
    finished_at: datetime
    """When it finished (database clock)."""
    error: BaseException | None


def finished_event(execution: Execution, finish: Finish, recorded: bool) -> ExecutionFinished:
    """The event of an execution whose result the completer has just written."""
    row = execution.row
    failures: int | None = None
    if recorded and finish.kind is FinishKind.FAILED:
        failures = (row.consecutive_failures or 0) + 1
    elif recorded and finish.kind is not FinishKind.RELEASED:
        failures = 0
    return ExecutionFinished(
        task_name=row.task_name,
        task_instance=row.task_instance,
        execution_time=row.execution_time,
        outcome=outcome_of(finish, recorded, execution.error),
        duration=execution.duration,
        slot_lag=(execution.started - row.execution_time).total_seconds(),
        consecutive_failures=failures,
        finished_at=execution.finished_at or execution.started,
        error=execution.error,
    )


class SchedulerObserver:
    """Base class of observers: every hook is a no-op; override the ones you need."""

    def attached(self, scheduler: Scheduler) -> None:
        """The scheduler this observer was registered with was created (once per scheduler).
        Keep a reference to read ``scheduler.status()`` or ``scheduler.running`` later."""

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        """An execution was claimed and starts now; ``slot_lag`` as in ExecutionFinished."""

    def execution_finished(self, event: ExecutionFinished) -> None:
        """An execution ended and its outcome is known."""

    def polled(self, duration: float, claimed: int) -> None:
        """A poll statement (claim of due rows) took ``duration`` seconds and claimed
        ``claimed`` rows."""

    def heartbeat_failed(self, task_name: str, task_instance: str) -> None:
        """A heartbeat of a running execution failed: the database was unreachable, or the
        row was revived by another instance meanwhile."""

    def dead_execution_revived(
        self, task_name: str, task_instance: str, picked_by: str | None
    ) -> None:
        """This instance revived an execution whose heartbeats stopped (``picked_by`` ran it)."""

    def slots_counted(self, task_name: str, missed: int, caught_up: int, skipped: int) -> None:
        """A recorded result of a recurring job decided slots beyond the one it ran: ``missed``
        coalesced into a later run (``CatchUp.latest``), one ``caught_up`` (run late, in turn,
        ``CatchUp.all``), ``skipped`` by the policy (not run)."""

    def database_error(self, operation: str, error: BaseException) -> None:
        """A database statement of the scheduler failed (it is retried with backoff);
        ``operation`` is a short fixed label such as ``poll`` or ``heartbeat``."""


class ObserverDispatch:
    """Calls every registered observer, each call guarded: an observer's exception is logged
    (at most once a minute per observer and hook) and never reaches the scheduler."""

    def __init__(self, observers: Sequence[SchedulerObserver], scheduler_name: str) -> None:
        self.observers = tuple(observers)
        self.active = bool(self.observers)
        """False when nothing is registered: callers skip building events."""
        self._name = scheduler_name
        self._last_logged: dict[tuple[int, str], float] = {}
        self.errors = 0

    def _call(self, hook: str, *args: object) -> None:
        for observer in self.observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                self._failed(observer, hook)

    def _failed(self, observer: SchedulerObserver, hook: str) -> None:
        self.errors += 1
        key = (id(observer), hook)
        now = time.monotonic()
        if now - self._last_logged.get(key, -1e9) >= 60:
            self._last_logged[key] = now
            log.exception(
                "scheduler %s: observer %s raised in %s (ignored; logged at most once a minute)",
                self._name,
                type(observer).__name__,
                hook,
                extra={"scheduler": self._name},
            )

    def attached(self, scheduler: Scheduler) -> None:
        self._call("attached", scheduler)

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        self._call("execution_started", task_name, task_instance, slot_lag)

    def execution_finished(self, event: ExecutionFinished) -> None:
        self._call("execution_finished", event)

    def polled(self, duration: float, claimed: int) -> None:
        self._call("polled", duration, claimed)

    def heartbeat_failed(self, task_name: str, task_instance: str) -> None:
        self._call("heartbeat_failed", task_name, task_instance)

    def dead_execution_revived(
        self, task_name: str, task_instance: str, picked_by: str | None
    ) -> None:
        self._call("dead_execution_revived", task_name, task_instance, picked_by)

    def slots_counted(self, task_name: str, missed: int, caught_up: int, skipped: int) -> None:
        self._call("slots_counted", task_name, missed, caught_up, skipped)

    def database_error(self, operation: str, error: BaseException) -> None:
        self._call("database_error", operation, error)
