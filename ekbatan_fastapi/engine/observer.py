"""``SchedulerObserver``: hooks into the scheduler's events, for metrics and tracing.

The core calls them and knows nothing of what is behind them (``ekbatan_fastapi.metrics``
turns them into Prometheus metrics). Register one with
``customize_scheduler(lambda b: b.observer(my_observer))``.

Every hook has a no-op default, so an observer overrides only what it needs. Hooks run on the
scheduler's event loop, in the middle of its loops: keep them cheap and never block (no I/O).
An exception raised by a hook is logged and swallowed; it never breaks the scheduler.

Three hooks wrap work instead of reporting it (``ekbatan_fastapi.otel`` uses them for spans):
``execution_scope`` (an async context manager around one execution's ``execute``, in its own
asyncio task: what it makes current, the job sees), ``statement_scope`` (around the poll and
completion statements) and ``scheduling_context`` (a carrier kept with a scheduled one-time
task). A scheduler whose observers override none of them pays one ``nullcontext`` per use.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..domain.job import RECURRING_INSTANCE, OneTimeJob
from ..domain.logs import library_logger
from ..domain.rows import KIND_DELETED, KIND_FAILED, KIND_RELEASED, Outcome, outcome_of

if TYPE_CHECKING:
    from ..domain.rows import Finish, PollResult, TaskKey, TaskRow
    from ..store.liveness import Held
    from .execution import Execution
    from .scheduler import Scheduler

__all__ = [
    "ExecutionFinished",
    "ExecutionStarted",
    "ObserverDispatch",
    "SchedulerObserver",
    "finished_event",
    "started_event",
]

log = library_logger(__name__)

_NO_SCOPE = contextlib.nullcontext()
"""What a scope is where no observer makes one (reusable, sync and async)."""


@dataclass(frozen=True, slots=True)
class ExecutionStarted:
    """One execution about to run ``execute`` (what ``execution_scope`` is told)."""

    task_name: str
    task_instance: str
    execution_time: datetime
    """The slot it runs (``ctx.execution_time``)."""
    version: int
    """The claim's version (the row's ``version`` after the claim)."""
    picked_by: str
    """The scheduler instance running it."""
    consecutive_failures: int
    """The row's count before this execution."""
    one_time: bool
    """A one-time task (its row may carry the context it was scheduled in)."""
    backfill: bool
    """A backfilled slot of a recurring job."""


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
    version: int = 0
    """The claim's version (with the name and instance, it matches ``ExecutionStarted``)."""
    picked_by: str | None = None
    deleted: bool = False
    """Its row was deleted: a one-time task (or backfilled slot) that is done."""


def started_event(execution: Execution) -> ExecutionStarted:
    """The event of an execution whose ``execute`` starts now."""
    row = execution.row
    return ExecutionStarted(
        task_name=row.task_name,
        task_instance=row.task_instance,
        execution_time=execution.execution_time,
        version=row.version,
        picked_by=row.picked_by or "",
        consecutive_failures=row.consecutive_failures or 0,
        one_time=isinstance(execution.job, OneTimeJob) and row.task_instance != RECURRING_INSTANCE,
        backfill=execution.backfill,
    )


def finished_event(execution: Execution, finish: Finish, recorded: bool) -> ExecutionFinished:
    """The event of an execution whose result the completer has just written."""
    row = execution.row
    failures: int | None = None
    kind = finish.kind
    if recorded and kind is KIND_FAILED:
        failures = (row.consecutive_failures or 0) + 1
    elif recorded and kind is not KIND_RELEASED:
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
        version=row.version,
        picked_by=row.picked_by,
        deleted=recorded and kind is KIND_DELETED,
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

    def execution_failed(
        self, task_name: str, task_instance: str, slot: datetime, error: BaseException
    ) -> None:
        """An execution of ``slot`` (``ctx.execution_time``) raised or timed out (before its
        result is recorded; retried or not as its job's failure handler decides)."""

    def job_paused(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        """This instance paused ``task_name`` cluster-wide after the failure of ``slot``
        (``pause_after_failures()``; ``paused_by`` is ``ekbatan``)."""

    def slot_missed(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        """A slot of a recurring job passed without a run, as recorded in the history
        (``record_missed_slots``): ``reason`` is ``coalesced`` (merged by ``CatchUp.latest``),
        ``overlap`` (fell due while the previous run was going, or ``Overlap.buffer_one``
        skipped it) or ``catch_up`` (skipped by the catch-up policy). Called when the result
        that decided it is recorded, for the newest 100 slots of that result at most
        (``slots_counted`` has the full count)."""

    def missed_streak(self, task_name: str, task_instance: str, consecutive: int) -> None:
        """The task instance has now missed ``consecutive`` slots in a row since its last run
        (as this instance counted them); the next slot that runs ends the streak (its
        ``execution_finished``)."""

    def database_error(self, operation: str, error: BaseException) -> None:
        """A database statement of the scheduler failed (it is retried with backoff);
        ``operation`` is a short fixed label such as ``poll`` or ``heartbeat``."""

    def execution_scope(
        self, execution: ExecutionStarted
    ) -> AbstractAsyncContextManager[Any] | None:
        """An async context manager entered in the execution's own asyncio task right before
        ``execute(ctx)`` and exited when it returned (None: nothing to wrap). What it makes
        current (a span, a contextvar) the job sees, also a plain ``def`` in its worker
        thread. It may await (a short read), which delays the job. An exception out of
        ``execute`` never reaches it (the outcome comes to ``execution_finished``); one does
        when the execution is abandoned or its task cancelled. Errors it raises are logged
        and ignored."""
        return None

    def statement_scope(self, operation: str, rows: int) -> AbstractContextManager[Any] | None:
        """A context manager around one hot-path round trip of the scheduler: ``"poll"``
        (claim up to ``rows`` due rows; ``polled`` is called inside it with the count) or
        ``"complete"`` (record ``rows`` results). The statement's exception passes through it.
        None: nothing to wrap."""
        return None

    async def scheduler_stopped(self, timeout: float) -> None:
        """The scheduler stopped (every execution ended and was recorded): finish or drop
        pending work (a queue of pings, a batch of exports) within ``timeout`` seconds, the
        shutdown's remaining wait. Called once per stop; errors are logged and ignored."""

    # -- what the scheduler sends and what the database answered (audits, benchmarks) --------

    def statement_sent(self, name: str, sql: str) -> None:
        """A hot-path statement ``name`` (``poll``, ``claim``, ``finish``, ``heartbeat``, ...)
        is being sent to the driver directly, past SQLAlchemy (SQLAlchemy's
        ``before_cursor_execute`` event sees all the others). Called for every such statement:
        overriding it makes the store report them; the cheapest hook is none."""

    def poll_answered(self, result: PollResult, started: float, seconds: float) -> None:
        """A poll answered: sent at wall-clock time ``started`` (``time.time()``), it took
        ``seconds`` and claimed ``result.claimed`` (the rows, as claimed)."""

    def results_written(
        self,
        items: Sequence[Finish],
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        """The completer sent a batch of results in ``seconds``: ``recorded`` holds the keys
        the database took (a key missing: the row was revived or finished elsewhere). On
        ``error`` (``recorded`` None) the statement may have committed all the same."""

    def rows_revived(self, rows: Sequence[TaskRow | Held]) -> None:
        """This instance revived these rows: after their dead window (``TaskRow``) or at once,
        their owner's liveness lock being free (``Held``: no data; ``execution_time`` may be
        None, ``last_heartbeat`` as the driver returned it). Both as they were: ``picked_by``
        the old owner, ``version`` and ``last_heartbeat`` before the revival."""

    def transaction_completing(self, finish: Finish) -> None:
        """``ctx.transaction()`` wrote this slot's completion and is about to commit (the
        row stays locked by the transaction until then)."""

    def transaction_committed(self, finish: Finish) -> None:
        """``ctx.transaction()`` committed this slot's completion with its effects."""

    def scheduling_context(self) -> Mapping[str, str] | None:
        """A one-time task is being scheduled (``client.schedule``/``schedule_many``): the
        caller's context to keep with it, as W3C trace context headers (``traceparent`` and
        optionally ``tracestate``), or None. It is stored in ``ekbatan_trace_context``
        (migration V0005) in the scheduling transaction."""
        return None


def _overrides(observer: SchedulerObserver, hook: str) -> bool:
    return getattr(type(observer), hook) is not getattr(SchedulerObserver, hook)


def _hooks() -> tuple[str, ...]:
    """Every hook of ``SchedulerObserver`` (its public methods)."""
    return tuple(
        name for name, value in vars(SchedulerObserver).items()
        if callable(value) and not name.startswith("_")
    )  # fmt: skip


class _Guarded:
    """An observer's scope whose exit errors are logged, never raised (the body's exception
    passes through, never suppressed)."""

    def __init__(self, dispatch: ObserverDispatch, observer: SchedulerObserver, scope: Any):
        self._dispatch, self._observer, self._scope = dispatch, observer, scope

    def __enter__(self) -> None:
        self._scope.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._scope.__exit__(kind, exc, tb)
        except Exception:
            self._dispatch._failed(self._observer, "statement_scope")

    async def __aenter__(self) -> None:
        await self._scope.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._scope.__aexit__(kind, exc, tb)
        except Exception:
            self._dispatch._failed(self._observer, "execution_scope")


class ObserverDispatch:
    """Calls every registered observer, each call guarded: an observer's exception is logged
    (at most once a minute per observer and hook) and never reaches the scheduler."""

    def __init__(self, observers: Sequence[SchedulerObserver], scheduler_name: str) -> None:
        self.observers = tuple(observers)
        self.active = bool(self.observers)
        """False when nothing is registered: callers skip building events."""
        self._hooked = {h: tuple(o for o in self.observers if _overrides(o, h)) for h in _hooks()}
        self.wants = frozenset(h for h, observers in self._hooked.items() if observers)
        """The hooks some observer overrides: a caller checks ``"hook" in wants`` and skips
        the event (and building it) otherwise, so an unobserved event costs a set lookup."""
        self._name = scheduler_name
        self._last_logged: dict[tuple[int, str], float] = {}
        self.errors = 0
        self._executions = [o for o in self.observers if _overrides(o, "execution_scope")]
        self.scopes_executions = bool(self._executions)
        """An observer wraps each execution (``execution_scope``): without, none is entered."""
        self._statements = [o for o in self.observers if _overrides(o, "statement_scope")]
        self._carriers = [o for o in self.observers if _overrides(o, "scheduling_context")]
        self.carries_context = bool(self._carriers)
        """An observer keeps a context with scheduled one-time tasks."""

    def _call(self, hook: str, *args: object) -> None:
        for observer in self._hooked[hook]:
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
        for observer in self._hooked["execution_finished"]:  # once per execution: no _call
            try:
                observer.execution_finished(event)
            except Exception:
                self._failed(observer, "execution_finished")

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

    def execution_failed(
        self, task_name: str, task_instance: str, slot: datetime, error: BaseException
    ) -> None:
        self._call("execution_failed", task_name, task_instance, slot, error)

    def job_paused(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        self._call("job_paused", task_name, task_instance, slot, reason)

    def slot_missed(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        self._call("slot_missed", task_name, task_instance, slot, reason)

    def missed_streak(self, task_name: str, task_instance: str, consecutive: int) -> None:
        self._call("missed_streak", task_name, task_instance, consecutive)

    def database_error(self, operation: str, error: BaseException) -> None:
        self._call("database_error", operation, error)

    def statement_sent(self, name: str, sql: str) -> None:
        self._call("statement_sent", name, sql)

    def poll_answered(self, result: PollResult, started: float, seconds: float) -> None:
        self._call("poll_answered", result, started, seconds)

    def results_written(
        self,
        items: Sequence[Finish],
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        self._call("results_written", items, recorded, error, seconds)

    def rows_revived(self, rows: Sequence[TaskRow | Held]) -> None:
        self._call("rows_revived", rows)

    def transaction_completing(self, finish: Finish) -> None:
        self._call("transaction_completing", finish)

    def transaction_committed(self, finish: Finish) -> None:
        self._call("transaction_committed", finish)

    def execution_scope(self, execution: Execution) -> AbstractAsyncContextManager[Any]:
        """Every observer's ``execution_scope`` of ``execution``, as one."""
        if not self._executions:
            return _NO_SCOPE
        return self._execution_scope(started_event(execution))

    @contextlib.asynccontextmanager
    async def _execution_scope(self, started: ExecutionStarted) -> Any:
        async with contextlib.AsyncExitStack() as stack:
            for observer in self._executions:
                try:
                    scope = observer.execution_scope(started)
                    if scope is not None:
                        await stack.enter_async_context(_Guarded(self, observer, scope))
                except Exception:
                    self._failed(observer, "execution_scope")
            yield

    def statement_scope(self, operation: str, rows: int) -> AbstractContextManager[Any]:
        """Every observer's ``statement_scope``, as one."""
        if not self._statements:
            return _NO_SCOPE
        return self._statement_scope(operation, rows)

    @contextlib.contextmanager
    def _statement_scope(self, operation: str, rows: int) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for observer in self._statements:
                try:
                    scope = observer.statement_scope(operation, rows)
                    if scope is not None:
                        stack.enter_context(_Guarded(self, observer, scope))
                except Exception:
                    self._failed(observer, "statement_scope")
            yield

    async def scheduler_stopped(self, timeout: float) -> None:
        """Every observer's ``scheduler_stopped``, at once, within ``timeout`` seconds."""
        stopping = [o for o in self.observers if _overrides(o, "scheduler_stopped")]

        async def one(observer: SchedulerObserver) -> None:
            try:
                await asyncio.wait_for(observer.scheduler_stopped(timeout), timeout + 1.0)
            except Exception:
                self._failed(observer, "scheduler_stopped")

        if stopping:
            await asyncio.gather(*(one(o) for o in stopping))

    def scheduling_context(self) -> dict[str, str] | None:
        """The first carrier an observer gives (None: none)."""
        for observer in self._carriers:
            try:
                carrier = observer.scheduling_context()
            except Exception:
                self._failed(observer, "scheduling_context")
                continue
            if carrier:
                return dict(carrier)
        return None
