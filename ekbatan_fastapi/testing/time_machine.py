"""``TimeMachine``: the real scheduler on a real database, driven by hand under a clock that
moves only when told (db-scheduler's ``ManualScheduler``).

It builds a ``JobRegistry`` as an application does, with a ``ManualClock`` injected into the
scheduler and the database's ``now()`` set to the same time (``dbclock``), so that every "is
it due" decision (the poll's SQL, catch-up, retries, the next slot) sees the machine's time.
The machine starts the scheduler in its manual mode (``Scheduler.start_manual``): the same
start-up and the same list of services (engine/lifecycle.py) as a started scheduler, the ones
that only react to work handed to them (completer, history writer) running, the others
stepped by hand. ``run_due()`` steps them (the housekeeper revives dead executions, the poller
claims what is due and the executor runs it), waits until the completer recorded it, and
repeats until nothing is due; ``advance()`` moves the time of both clocks; closing stops the
scheduler as a shutdown does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..client import SchedulerClient
from ..domain.clock import ManualClock
from ..domain.errors import ConfigurationError
from ..domain.job import Job
from ..domain.rows import Outcome, PollResult, TaskKey
from ..engine.execution import Execution
from ..engine.observer import ExecutionFinished, SchedulerObserver
from ..registry import JobRegistry, SchedulerBuilder, job_registry
from ..store.migrate import create_schema
from .dbclock import DatabaseClock, database_clock

__all__ = ["Ran", "TimeMachine"]

_SETTLE_POLL = 0.002
"""Seconds between looks at whether the launched executions are recorded."""


@dataclass(frozen=True, slots=True)
class Ran:
    """One execution ``run_due`` ran, once its result was recorded."""

    task_name: str
    task_instance: str
    execution_time: datetime
    """The slot it ran (``ctx.execution_time``)."""
    outcome: Outcome
    error: BaseException | None
    """What the job raised (None: it succeeded)."""


class _Finished(SchedulerObserver):
    def __init__(self) -> None:
        self.events: dict[TaskKey, ExecutionFinished] = {}

    def execution_finished(self, event: ExecutionFinished) -> None:
        self.events[(event.task_name, event.task_instance)] = event


class TimeMachine:
    """``async with TimeMachine(jobs, database_url, start=...) as tm:`` then ``tm.advance``,
    ``tm.run_due`` and ``tm.client`` (or ``tm.schedule``) for one-time tasks.

    ``database``: a PostgreSQL or MySQL/MariaDB URL (the machine builds its own pool, to set
    the clock on every connection of it); the jobs tables are created unless
    ``create_tables=False``. One time machine per database at a time. ``customize`` runs on
    the scheduler settings like ``customize_scheduler`` (the clock stays the machine's).
    ``timeout``: seconds ``run_due`` waits for the executions of one round.
    """

    def __init__(
        self,
        jobs: Iterable[Job],
        database: str | URL,
        *,
        start: datetime,
        dialect: str | None = None,
        create_tables: bool = True,
        customize: Callable[[SchedulerBuilder], Any] | None = None,
        max_rounds: int = 100,
        timeout: float = 30.0,
    ) -> None:
        if isinstance(database, AsyncEngine) or not isinstance(database, str | URL):
            raise ConfigurationError(
                f"TimeMachine takes the database URL, got {type(database).__name__}: it builds "
                "its own pool to set the clock on each of its connections"
            )
        self.clock = ManualClock(start)
        self._finished = _Finished()
        self._create_tables = create_tables
        self._max_rounds = max_rounds
        self._timeout = timeout

        def configure(b: SchedulerBuilder) -> None:
            b.listen(False).scheduler_name("time-machine").observer(self._finished)
            if dialect is not None:
                b.dialect(dialect)
            if customize is not None:
                customize(b)
            b.clock(self.clock)

        self.registry: JobRegistry = (
            job_registry()
            .connection_provider(database)
            .with_jobs(jobs)
            .customize_scheduler(configure)
            .build()
        )
        self._db_clock: DatabaseClock = database_clock(
            self.registry.store.dialect.name, self.registry.engine
        )
        self._db_clock.attach()
        self._open = False

    # -- what a test reads -------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The machine's time (the scheduler's and the database's)."""
        return self.clock.now()

    @property
    def client(self) -> SchedulerClient:
        """The registry's client: schedule, pause, history, ... at the machine's time."""
        return self.registry.client

    @property
    def engine(self) -> AsyncEngine:
        """The machine's pool: its ``now()`` is the machine's time too."""
        return self.registry.engine

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> TimeMachine:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the tables and the clock, then start the scheduler in its manual mode: its
        start-up (the recurring rows, at the machine's time; errors propagate) and the
        services that run by themselves."""
        if self._open:
            return
        self._open = True
        try:
            if self._create_tables:
                await create_schema(self.engine, self.registry.store.tables.table_name)
            await self._db_clock.install(self.now)
            await self.registry.scheduler.start_manual()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the scheduler as a shutdown does (what is pending is written), remove the
        clock, close the pool."""
        if not self._open:
            return
        self._open = False
        try:
            await self.registry.scheduler.stop()
            await self._db_clock.remove()
        finally:
            await self.registry.connection.dispose()

    # -- time travel ---------------------------------------------------------------------------

    async def advance(self, to: datetime | None = None, *, by: timedelta | None = None) -> None:
        """Move the time forward, to ``to`` (aware) or ``by`` a duration; nothing runs."""
        if (to is None) == (by is None):
            raise ConfigurationError("advance() takes to=<aware datetime> or by=<timedelta>")
        target = to if to is not None else self.now + (by or timedelta(0))
        if target.tzinfo is None:
            raise ConfigurationError(
                f"advance(to=...) takes an aware datetime, got {target!r}; e.g. "
                "datetime(2026, 1, 2, 2, 0, tzinfo=UTC)"
            )
        if target < self.now:
            raise ConfigurationError(
                f"a TimeMachine moves forward only: it is {self.now.isoformat()}, asked for "
                f"{target.isoformat()}"
            )
        self.clock.set(target)
        await self._db_clock.set(self.clock.now())

    async def schedule(
        self, job_name: str, instance_id: str, at: datetime | None = None, data: Any = None
    ) -> bool:
        """Schedule a one-time task (``client.schedule``; ``at`` None: the machine's now)."""
        return await self.client.schedule(job_name, instance_id, at, data)

    async def run_due(self) -> list[Ran]:
        """Run everything due at the machine's time, as the scheduler would, until nothing is
        due (a slot ``CatchUp.all`` still owes, a retry due at once): the executions that
        ran, oldest slot first. A job's exception does not propagate: see ``Ran.error``.

        Each round steps the scheduler's stepped services in their order: first, as the
        housekeeper would have by now, executions whose heartbeats stopped longer than the
        dead window ago (a crashed instance's) are revived; then the poller claims what is
        due and the executor runs it."""
        if not self._open:
            raise ConfigurationError("run_due() needs an open TimeMachine: `async with` it")
        scheduler = self.registry.scheduler
        ran: list[Ran] = []
        for _ in range(self._max_rounds):
            stepped = await scheduler.lifecycle.step()
            result = stepped["poller"]
            if not isinstance(result, PollResult):
                raise TypeError(
                    f"run_due(): the scheduler's poller step returned {result!r}, not a "
                    "PollResult (a service replaced by a test?); step the real poller"
                )
            launched = [
                scheduler.executions.by_key[row.key]
                for row in result.claimed
                if row.key in scheduler.executions.by_key
            ]
            await self._settle(launched)
            ran.extend(self._ran(execution) for execution in launched if execution.task)
            if not result.claimed:
                break
        else:
            raise RuntimeError(
                f"work was still due after {self._max_rounds} rounds of run_due() (a job "
                "whose next time is always due?); raise max_rounds if that is meant"
            )
        await self._history_written()
        return sorted(ran, key=lambda r: (r.execution_time, r.task_name, r.task_instance))

    async def _settle(self, launched: list[Execution]) -> None:
        """Wait until the completer recorded every launched execution."""
        running = self.registry.scheduler.executions
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        lifecycle = self.registry.scheduler.lifecycle
        while left := [e for e in launched if running.by_key.get(e.row.key) is e]:
            if (crashed := lifecycle.crashed()) is not None:
                name, error = crashed
                raise RuntimeError(f"run_due(): the {name} crashed") from error
            if loop.time() > deadline:
                raise TimeoutError(
                    f"run_due(): still running or unrecorded after {self._timeout:g}s: "
                    + ", ".join(e.label for e in left)
                )
            await asyncio.sleep(_SETTLE_POLL)

    async def _history_written(self) -> None:
        """Wait until the history and the slot counts (missed streaks included) are written."""
        recorder = self.registry.scheduler.recorder
        counter = self.registry.scheduler.completer.counter
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        while True:
            waiting = counter is not None and counter.waiting
            if not (recorder.pending or waiting) or loop.time() > deadline:
                return
            await asyncio.sleep(_SETTLE_POLL)

    def _ran(self, execution: Execution) -> Ran:
        event = self._finished.events.get(execution.row.key)
        outcome = event.outcome if event is not None else Outcome.SUCCEEDED
        return Ran(
            execution.row.task_name,
            execution.row.task_instance,
            execution.execution_time,
            outcome,
            execution.error,
        )
