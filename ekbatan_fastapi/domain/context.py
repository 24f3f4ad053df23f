"""What an execution is told about itself: its slot, its data and its heartbeats."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from .codec import DataModel, decode_data
from .errors import ConfigurationError
from .rows import RECURRING_INSTANCE

__all__ = ["ExecutionContext", "HeartbeatState", "TransactionOpener", "execution_context"]


class TransactionOpener(Protocol):
    """Opens the transaction in which an execution's effects commit with its completion
    (the engine's ``SlotTransaction``)."""

    def __call__(self, target: Any = None) -> AbstractAsyncContextManager[Any]: ...


D = TypeVar("D", default=Any)


def _never() -> bool:
    return False


@dataclass(slots=True, init=False)
class HeartbeatState:
    """This instance's own view of an execution's heartbeats (db-scheduler's definitions).

    ``fraction_dead`` is 0.0 right after a successful heartbeat and 1.0 at the moment another
    instance may revive the row. A failed heartbeat is one whose update did not reach the
    database, or found the row no longer ours (it was revived elsewhere). ``monotonic`` is the
    clock the intervals are measured with (the scheduler's; a test may pass its own).
    """

    heartbeat_interval: timedelta
    dead_after: timedelta
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False)
    last_success: float | None = None
    """Monotonic time of the last successful heartbeat (None: now, when created)."""
    failed_heartbeats: int = 0
    """Heartbeats failed since the last success (db-scheduler's failures since last success)."""
    last_failure: float | None = None
    lock_lost_at: float | None = None
    """Monotonic time this instance's liveness lock was lost (None: held, or none): peers may
    revive the row ``lock_grace`` seconds later, whatever its heartbeats say."""
    lock_grace: float = 0.5

    def __init__(
        self,
        heartbeat_interval: timedelta,
        dead_after: timedelta,
        monotonic: Callable[[], float] = time.monotonic,
        last_success: float | None = None,
        failed_heartbeats: int = 0,
        last_failure: float | None = None,
        lock_lost_at: float | None = None,
        lock_grace: float = 0.5,
    ) -> None:
        # The dataclass's own ``__init__`` with its ``__post_init__`` folded in: one Python
        # call less per execution (one is built for every execution the scheduler launches).
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self.monotonic = monotonic
        self.last_success = monotonic() if last_success is None else last_success
        self.failed_heartbeats = failed_heartbeats
        self.last_failure = last_failure
        self.lock_lost_at = lock_lost_at
        self.lock_grace = lock_grace

    def record_success(self, sent: float | None = None) -> None:
        """A heartbeat reached the database. ``sent``: the monotonic time it was sent (the
        database stored the heartbeat then, not when its answer came back: after a stall
        between the two, e.g. a SIGSTOP, the row is as stale as the peers see it)."""
        self.last_success = self.monotonic() if sent is None else sent
        self.failed_heartbeats = 0

    def record_failure(self) -> None:
        self.last_failure = self.monotonic()
        self.failed_heartbeats += 1

    @property
    def since_last_success(self) -> timedelta:
        last = self.last_success if self.last_success is not None else self.monotonic()
        return timedelta(seconds=max(0.0, self.monotonic() - last))

    @property
    def has_stale_heartbeat(self) -> bool:
        """A heartbeat failed, or none succeeded for longer than an interval plus some slack."""
        interval = self.heartbeat_interval.total_seconds()
        slack = min(10.0, interval * 0.25)
        return (
            self.failed_heartbeats > 0 or self.since_last_success.total_seconds() > interval + slack
        )

    def lock_lost(self, at: float, grace: float) -> None:
        """This instance's liveness lock was lost at ``at``: peers may revive the row
        ``grace`` seconds later (``fraction_dead`` reaches 1.0 then)."""
        self.lock_lost_at, self.lock_grace = at, grace

    def lock_taken(self) -> None:
        """The liveness lock is held again: only the heartbeats count."""
        self.lock_lost_at = None

    @property
    def fraction_dead(self) -> float:
        fraction = self.since_last_success / self.dead_after
        lost = self.lock_lost_at
        if lost is not None and self.lock_grace > 0:
            fraction = max(fraction, (self.monotonic() - lost) / self.lock_grace)
        return fraction


@dataclass
class ExecutionContext(Generic[D]):
    """What an execution knows about itself (``ExecutionContext[InvoiceData]`` in a typed
    one-time job: ``data`` is then the model instance).

    ``execution_time`` is the slot being run; it stays the same when a dead execution is
    revived elsewhere, so ``(task_name, task_instance, execution_time)`` is an idempotency
    key. ``version`` grows with every claim and can serve as a fencing token.
    ``shutting_down`` answers ``is_shutting_down`` (the scheduler's state).
    """

    task_name: str
    task_instance: str
    execution_time: datetime
    picked_by: str
    version: int
    task_data: bytes | None = field(repr=False)
    heartbeat_state: HeartbeatState
    consecutive_failures: int
    shutting_down: Callable[[], bool] = field(default=_never, repr=False)
    timed_out: Callable[[], bool] = field(default=_never, repr=False)
    """Answers ``is_timed_out`` (the scheduler's timer)."""
    transactions: TransactionOpener | None = field(default=None, repr=False)
    """What ``transaction()`` opens: set by the scheduler (None: no database at hand)."""
    is_backfill: bool = False
    """A slot run again by ``client.backfill`` (``task_instance`` is ``backfill:<slot>``)."""
    data_model: DataModel | None = field(default=None, repr=False)
    """The typed job's model (``OneTimeJob[InvoiceData]``): ``data`` is validated into it."""
    attempt: int = 1
    """Which attempt of this slot runs: 1, then 2, 3... for the retries a recurring job's
    ``failure_handler()`` asks for (always 1 without one)."""
    cancel_check: Callable[[], bool] = field(default=_never, repr=False)
    """Answers ``cancel_requested`` (set by the scheduler)."""

    @cached_property
    def data(self) -> D:
        """The instance's data, decoded from JSON on first use: the model instance for a typed
        job (the scheduler checked it fits before calling ``execute``: a row whose data does
        not is parked instead).

        Raises ``TaskDataError`` when the row holds bytes this library did not write; the
        execution then fails like any other exception (a job that never reads ``data`` runs).
        """
        if self.data_model is not None:
            return self.data_model.decode(  # type: ignore[no-any-return]
                self.task_data, task_name=self.task_name, task_instance=self.task_instance
            )
        where = f"{self.task_name}/{self.task_instance}"
        return decode_data(self.task_data, where=where)  # type: ignore[no-any-return]

    @property
    def is_shutting_down(self) -> bool:
        """True once the scheduler began to stop: a long job may wind down early."""
        return self.shutting_down()

    @property
    def is_timed_out(self) -> bool:
        """True once the execution ran past its job's ``timeout()``: a plain ``def`` job should
        return soon (it cannot be interrupted); an ``async def`` one is being cancelled."""
        return self.timed_out()

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to stop this execution (``client.cancel_running``, the
        admin route, ``ekbatan-jobs cancel``): an ``async def`` job is being
        cancelled; a plain ``def`` job cannot be interrupted and should return soon (it is
        recorded as ``cancelled`` when it does)."""
        return self.cancel_check()

    @property
    def fencing_token(self) -> int:
        """The version this execution's claim wrote: it grows with every claim of the row, so
        an external system that remembers the highest token it accepted can refuse the
        writes of a stale execution (see docs/exactly-once.md)."""
        return self.version

    @property
    def idempotency_key(self) -> tuple[str, str, datetime]:
        """``(task_name, task_instance, execution_time)``: the same in a revived execution of
        this slot, different for every other slot. A backfilled slot has the key of the
        recurring slot it stands for (``task_instance`` ``recurring``): effects keyed by it
        happen once per slot, however often it is run."""
        instance = RECURRING_INSTANCE if self.is_backfill else self.task_instance
        return (self.task_name, instance, self.execution_time)

    def transaction(self, target: Any = None) -> AbstractAsyncContextManager[Any]:
        """A transaction whose effects commit together with this slot's completion:

        ``async with ctx.transaction() as conn:`` gives an ``AsyncConnection`` on the jobs
        database; ``ctx.transaction(session)`` uses the application's own ``AsyncSession``
        or ``AsyncConnection`` (same database). At the end of the block the slot is completed
        in the same transaction, guarded by ``version``, and committed; if the execution was
        superseded meanwhile, nothing commits and ``ExecutionSuperseded`` is raised. An
        exception inside the block rolls everything back (the execution then fails as usual).
        Once per execution, in ``async def execute`` only.
        """
        if self.transactions is None:
            raise ConfigurationError(
                "ctx.transaction() needs the jobs database, and this context has none: run "
                "the job through the scheduler, or pass database=<URL or AsyncEngine> to "
                "ekbatan_fastapi.testing.run_job"
            )
        return self.transactions(target)


def execution_context(
    *,
    task_name: str,
    task_instance: str,
    execution_time: datetime,
    picked_by: str,
    version: int,
    task_data: bytes | None,
    heartbeat_state: HeartbeatState,
    consecutive_failures: int,
    shutting_down: Callable[[], bool],
    timed_out: Callable[[], bool],
    transactions: TransactionOpener | None,
    is_backfill: bool,
    data_model: DataModel | None,
    attempt: int = 1,
    cancel_check: Callable[[], bool] = _never,
) -> ExecutionContext[Any]:
    """An ``ExecutionContext`` built by keyword, as the scheduler (once per execution) and
    ``run_job`` build one: each field is named here, beside the class, and passed in the class's
    field order (``tests/test_context.py`` proves each lands in its own attribute). Calling the
    class with 13 keywords would cost about 2 us more per execution: CPython passes a class
    call's keywords through a dict, a function call's not."""
    return ExecutionContext(
        task_name,
        task_instance,
        execution_time,
        picked_by,
        version,
        task_data,
        heartbeat_state,
        consecutive_failures,
        shutting_down,
        timed_out,
        transactions,
        is_backfill,
        data_model,
        attempt,
        cancel_check,
    )
