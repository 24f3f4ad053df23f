"""``Scheduler``: runs the registered jobs against one ``scheduled_tasks`` table.

It wires the loops, each an object that owns its state (see docs/architecture.md):

* the **poller** (startup first) claims due rows in batches and hands them to the executor;
* the **executor** runs each as its own asyncio task (a plain ``def`` in a worker thread) and
  hands its result to the completer;
* the **completer** records results in batches, each write guarded by the claimed version;
* the **housekeeper** heartbeats every running execution and revives dead executions;
* the **maintenance** loop, on the one instance that leads it, deletes unresolved rows and
  prunes the history, long-gone instances and trace contexts (engine/maintenance.py);
* the **listener** wakes the poller when any instance schedules work (PostgreSQL);
* the **history recorder** writes the history where the completion does not, and its
  retention loop prunes it hourly in paced batches (off the housekeeper's round);
* the **loop-lag monitor** reports a blocked event loop.

The loops are one ordered list of named services (``services``); the ``Lifecycle`` starts
them in that order, supervises them (a loop that crashes is logged and restarted) and stops
them in db-scheduler's two phases (engine/lifecycle.py); the ``TimeMachine`` starts and steps
the same list by hand. The scheduler keeps the status snapshot. A database error never ends a
loop: it is logged, shown in ``status()``, and retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..domain.catchup import CatchUp
from ..domain.errors import ConfigurationError
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job, schedule_of
from ..domain.limits import JobLimits, resolve_limits
from ..domain.logs import library_logger
from ..domain.overlap import overlap_reason
from ..domain.persistent import PersistentScheduleJob
from ..domain.rows import PollingStrategy, TaskKey, TaskRow
from ..domain.schedules import Schedule
from ..store.limited import Limit
from ..store.schedules import ScheduleRows
from .completer import Completer
from .config import SchedulerConfig
from .definitions import Definitions
from .execution import Execution
from .executor import Executor
from .history import HistoryRecorder
from .housekeeper import Housekeeper
from .lag import LoopLagMonitor
from .lifecycle import Lifecycle, Manual, Service, Stop, StopSteps
from .listener import Listener
from .liveness import watch_for
from .maintenance import Maintenance
from .observer import ObserverDispatch
from .poller import Alarm, DatabaseLink, Poller
from .running import Capacity, Holdings, RunState
from .slots import SlotCounter
from .startup import Startup
from .transaction import SlotTransaction

if TYPE_CHECKING:
    from ..store.dialects import Store

__all__ = [
    "ExecutionStatus",
    "Scheduler",
    "SchedulerStatus",
]

_SAME_TIME = timedelta(milliseconds=1)
"""A held row's due time as a poll reports it and as the row holds it agree within this."""

log = library_logger(__name__)


def _strategy(config: SchedulerConfig, store: Store) -> PollingStrategy:
    """The configured polling strategy, or the dialect's best."""
    supported = store.tasks.supports_skip_locked
    if config.polling_strategy is None:
        return PollingStrategy.LOCK_AND_FETCH if supported else PollingStrategy.FETCH
    strategy = PollingStrategy(config.polling_strategy)
    if strategy is PollingStrategy.LOCK_AND_FETCH and not supported:
        raise ConfigurationError(
            f"polling_strategy 'lock-and-fetch' needs FOR UPDATE SKIP LOCKED, which the "
            f"{store.dialect.name} dialect lacks; use 'fetch'"
        )
    return strategy


def _check_claim_ahead(config: SchedulerConfig, store: Store) -> None:
    if config.claim_ahead and not store.tasks.supports_claim_ahead:
        raise ConfigurationError(
            f"claim_ahead ({config.claim_ahead.total_seconds():g} s) is not supported on the "
            f"{store.dialect.name} dialect (its task store cannot claim ahead); set it to 0 (PT0S)"
        )


class Scheduler:
    """Runs the registered jobs against one ``scheduled_tasks`` table."""

    def __init__(self, store: Store, jobs: Sequence[Job], config: SchedulerConfig) -> None:
        config.validate()
        self.store = store
        self.config = config
        self.name = config.scheduler_name
        self.clock = config.clock
        self.jobs: dict[str, Job] = {job.name(): job for job in jobs}
        schedules: dict[str, Schedule] = {
            name: schedule_of(job)
            for name, job in self.jobs.items()
            if isinstance(job, DistributedJob)
        }
        self.catch_ups: dict[str, CatchUp] = {
            name: job.catch_up()
            for name, job in self.jobs.items()
            if isinstance(job, DistributedJob)
        }
        active = [
            name for name in self.jobs if not (name in schedules and schedules[name].is_disabled)
        ]
        self.limits: dict[str, JobLimits] = {
            name: resolve_limits(job, config.job_overrides.get(name))
            for name, job in self.jobs.items()
        }
        """Each job's timeout and concurrency limit (its own, or the settings' override)."""
        self.polling_strategy = _strategy(config, store)
        _check_claim_ahead(config, store)
        self.batch_size = config.batch_size or max(50, 3 * len(self.jobs))
        self.observer = ObserverDispatch(config.observers, self.name)
        if "statement_sent" in self.observer.wants:
            store.tasks.on_statement = self.observer.statement_sent
        self.state = RunState()
        self._stopped: asyncio.Future[None] | None = None
        """Done once the first ``stop`` finished (every later call waits for it)."""
        self.link = DatabaseLink(self.name, self.clock, self.observer, store.db.diagnose)
        self.alarm = Alarm(self.link, self.state, config.claim_ahead)
        self.executions = Capacity(self.batch_size, self.alarm.request_poll)
        """What this instance holds and may claim (executions, claims in flight)."""
        self.recorder = HistoryRecorder(
            store.operations,
            self.name,
            history=config.history,
            retention=config.history_retention,
            on_db_error=self.link.failed,
            retry_cap=config.polling_interval.total_seconds(),
            # a write each housekeeping round: after an outage, the first sign that the
            # database works again while nothing is judged dead (no dead-execution check)
            on_answer=self.link.answered,
        )
        self._wire(active, schedules)
        self.lag = LoopLagMonitor(
            self.name,
            config.heartbeat_interval,
            config.dead_after,
            suspects=self.executions.async_labels,
            now=self.link.now,
        )
        self.lifecycle = Lifecycle(
            self.name,
            self._services(),
            state=self.state,
            link=self.link,
            steps=StopSteps(
                begin=self._stopping,
                executions=lambda: self.executor.drain(config.shutdown_max_wait),
                leave=self.recorder.leave,
                release=self._release,
            ),
            results_wait=min(
                config.shutdown_results_wait, config.shutdown_max_wait
            ).total_seconds(),
            retry_cap=config.polling_interval.total_seconds(),
        )
        self.observer.attached(self)

    def _wire(self, active: list[str], schedules: dict[str, Schedule]) -> None:
        """Build the loops; each gets the collaborators it uses, nothing more."""
        self._wire_executions(schedules)
        self._wire_loops(active)

    def _services(self) -> list[Service]:
        """The loops, in start order (a manual driver's step order), each with how it stops
        and runs under a manual driver (engine/lifecycle.py; docs/architecture.md)."""
        services = [
            # first: a manual round revives the dead executions before it claims (the
            # housekeeper's loop sleeps a heartbeat interval before its first round)
            Service(
                "housekeeper",
                self.housekeeper.run,
                Stop.LAST,
                Manual.STEP,
                step=self.housekeeper.revive_step,
            ),
            Service(
                "poller",
                self._start_and_poll,
                Stop.CLAIMING,
                Manual.STEP,
                step=self.poller.step,
            ),
            Service(
                "completer",
                self.completer.run,
                Stop.FLUSH,
                Manual.LOOP,
                close=self.completer.close,
            ),
            Service("maintenance", self.maintenance.run, Stop.FIRST, Manual.OFF),
            Service("loop-lag monitor", self.lag.run, Stop.LAST, Manual.OFF),
            Service(
                "history writer",
                self.recorder.run,
                Stop.FLUSH,
                Manual.LOOP,
                close=self.recorder.close,
            ),
            Service("history retention", self.recorder.retain, Stop.LAST, Manual.OFF),
        ]
        if self.config.listen and self.store.tasks.supports_notify:
            services.append(Service("listener", self.listener.run, Stop.FIRST, Manual.OFF))
        if self.liveness is not None:
            # stopped last: the liveness lock with the heartbeats (peers judge by it)
            services.append(Service("liveness watch", self.liveness.run, Stop.LAST, Manual.OFF))
        return services

    def _wire_executions(self, schedules: dict[str, Schedule]) -> None:
        """What runs executions and records them; the stored job definitions."""
        store, config = self.store, self.config
        self.completer = Completer(
            name=self.name,
            tasks=store.tasks,
            config=config,
            link=self.link,
            alarm=self.alarm,
            running=self.executions,
            history=self.recorder,
            observer=self.observer,
            limited={n for n, lim in self.limits.items() if lim.limited},
            counter=SlotCounter(store.jobs, self.recorder, self.observer)
            if self.catch_ups
            or any(isinstance(job, PersistentScheduleJob) for job in self.jobs.values())
            else None,
        )
        self.definitions = Definitions(
            name=self.name,
            jobs=self.jobs,
            schedules=schedules,
            catch_ups=self.catch_ups,
            limits=self.limits,
            store=store.jobs,
            config=config,
            now=self.link.now,
        )
        self.executor = Executor(
            name=self.name,
            jobs=self.jobs,
            schedule_for=self.definitions.current().get,  # a live view
            running=self.executions,
            observer=self.observer,
            submit=self.completer.submit,
            settled=self.completer.settled,
            transactions=self._transaction_for,
            limits=self.limits,
            catch_ups={
                **self.catch_ups,
                **{
                    name: job.catch_up()
                    for name, job in self.jobs.items()
                    if isinstance(job, PersistentScheduleJob)
                },
            },
            definitions=self.definitions,
            schedule_rows=ScheduleRows(store.tasks),
            retry_marks=self._mark_retry,
            pause=self._pause_failing,
            config=config,
            link=self.link,
            state=self.state,
        )

    def _wire_loops(self, active: list[str]) -> None:
        """Startup, the poller, the housekeeper, the listener and the liveness watch."""
        store, config = self.store, self.config
        self.liveness = watch_for(self, active)
        self.startup = Startup(
            name=self.name,
            jobs=self.jobs,
            tasks=store.tasks,
            definitions=self.definitions,
            alarm=self.alarm,
            history=self.recorder,
            config=config,
            link=self.link,
            state=self.state,
            first_contact=self._first_contact,
        )
        self.poller = Poller(
            name=self.name,
            names=active,
            limits={
                n: Limit(lim.max_concurrency, lim.concurrency_key)
                for n, lim in self.limits.items()
                if lim.max_concurrency is not None and n in active
            },
            strategy=self.polling_strategy,
            tasks=store.tasks,
            alarm=self.alarm,
            running=self.executions,
            executor=self.executor,
            history=self.recorder,
            observer=self.observer,
            config=config,
            link=self.link,
            state=self.state,
            schedule_for=self.definitions.current().get,  # a live view
            on_held=self.liveness.others_hold if self.liveness is not None else None,
            cancel_other=[
                name
                for name, job in self.jobs.items()
                if isinstance(job, DistributedJob) and job.overlap().cancels
            ],
            stop_overlapped=self._stop_overlapped,
        )
        self.housekeeper = Housekeeper(
            name=self.name,
            names=active,
            tasks=store.tasks,
            alarm=self.alarm,
            running=self.executions,
            history=self.recorder,
            observer=self.observer,
            refresh_definitions=self.definitions.refresh,
            cancels=store.cancels,
            config=config,
            link=self.link,
            state=self.state,
        )
        self.maintenance = Maintenance(
            name=self.name,
            known=list(self.jobs),
            tasks=store.tasks,
            history=self.recorder,
            config=config,
            link=self.link,
            state=self.state,
            traces=store.traces,
            jobs=store.jobs,
        )
        self.listener = Listener(
            tasks=store.tasks, config=config, link=self.link, alarm=self.alarm, state=self.state
        )

    async def _mark_retry(self, execution: Execution) -> bool:
        """Write a failed slot's pending retry into its row (see ``Executor``)."""
        mark = execution.mark
        assert mark is not None
        spec = execution.persistent
        if spec is None:
            return await self.store.tasks.mark_retry(execution.owned, mark)
        # a schedule row: over what its count wrote (or, not counted, what was claimed) only
        counted = spec.encode(where=execution.label)
        expected = (counted, execution.row.task_data)
        return await self.store.tasks.mark_retry(execution.owned, mark, expected)

    async def _stop_overlapped(self, task_name: str, due: datetime, slot: datetime) -> None:
        """Ask (``ekbatan_cancel_requests``, as ``client.cancel_running`` does) the instance
        running ``task_name``'s row due at ``due`` to stop it: its next slot ``slot`` is due
        and its job has ``Overlap.cancel_other``."""
        cancels = self.store.cancels
        row = await self.store.tasks.get(task_name, RECURRING_INSTANCE)
        if row is None or not row.picked or row.picked_by in (None, self.name):
            return
        if abs(row.execution_time - due) > _SAME_TIME or not await cancels.look():
            return
        await cancels.request(  # (a poll's held times may lose their microseconds)
            task_name, RECURRING_INSTANCE, row.version, self.name, overlap_reason(slot)
        )

    async def _pause_failing(self, task_name: str, reason: str) -> None:
        """Pause a job cluster-wide after its failures (``pause_after_failures()``)."""
        await self.store.operations.pause(task_name, "ekbatan", reason)

    def _transaction_for(self, execution: Execution) -> SlotTransaction:
        return SlotTransaction(
            execution,
            tasks=self.store.tasks,
            operations=self.store.operations,
            history=self.recorder,
            config=self.config,
            link=self.link,
            observer=self.observer,
            schedule_rows=self.executor.schedule_rows,
        )

    # -- what other layers read and call ---------------------------------------------------

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """Each recurring job's current schedule (``Definitions``: its own, or the one a newer
        version stored during a rolling deploy); a read-only view."""
        return self.definitions.current()

    @property
    def services(self) -> list[Service]:
        """The loops, in start order (``Lifecycle``)."""
        return self.lifecycle.services

    @property
    def running(self) -> dict[TaskKey, Execution]:
        """The executions this instance holds, by row (running, or recording their result)."""
        return self.executions.by_key

    def holdings(self) -> Holdings:
        """The rows held now, how many executions were launched so far, and whether a claim
        is in flight: two of these, taken around a read of the rows, tell an orphaned claim
        from one whose answer was being processed (``Holdings.settled_since``)."""
        return self.executions.holdings()

    @property
    def is_shutting_down(self) -> bool:
        return self.state.stopping

    def db_time(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.link.now()

    def request_poll(self) -> None:
        """Poll now (new due work, capacity freed, a revival, or shutdown)."""
        self.alarm.request_poll()

    def note_due(self, when: datetime) -> None:
        """Something becomes due at ``when`` (database time): wake up then, if that is sooner."""
        self.alarm.note_due(when)

    def claiming(self) -> contextlib.AbstractContextManager[None]:
        """Around a claim made for this instance outside the poller (a forced run-now) and
        the ``run_claimed`` of its row: its row is picked before it is held."""
        return self.executions.claim()

    def run_claimed(self, row: TaskRow) -> None:
        """Run a row this instance claimed outside the poller (a forced run-now)."""
        if not self.lifecycle.started or self.state.stopping:
            raise RuntimeError(f"scheduler {self.name} is not running")
        self.executor.launch(row)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background tasks and return at once; no database round trip here."""
        if self.lifecycle.started:
            raise RuntimeError(f"scheduler {self.name} is already started")
        self.state.started_at = self.clock.now()
        log.info(
            "scheduler %s starting: %d jobs, %s, batch %d, polling every %s, heartbeat %s x %d",
            self.name,
            len(self.jobs),
            self.polling_strategy,
            self.batch_size,
            self.config.polling_interval,
            self.config.heartbeat_interval,
            self.config.missed_heartbeats_limit,
            extra={"scheduler": self.name},
        )
        self.lifecycle.start()

    async def start_manual(self) -> None:
        """Manual mode (``testing.TimeMachine``): the start-up once, errors propagating, then
        the services that run by themselves (``Manual.LOOP``); the driver steps the others
        (``lifecycle.step``). ``stop`` ends it as it ends a started scheduler."""
        if self.lifecycle.started:
            raise RuntimeError(f"scheduler {self.name} is already started")
        self.state.started_at = self.clock.now()
        await self.startup.once()
        self.lifecycle.start_manual()

    async def _first_contact(self) -> None:
        """On a MariaDB Galera cluster (``wsrep_on``): ``fetch`` unless a strategy was set
        (lock-and-fetch's row locks hold on one node only: claimers on several nodes lock the
        same rows and all but one fail certification at COMMIT), and no ``max_concurrency``
        (its ``GET_LOCK`` holds on one node only)."""
        if not await self.store.tasks.galera():
            return
        limited = sorted(name for name, limits in self.limits.items() if limits.limited)
        if limited:
            raise ConfigurationError(
                f"max_concurrency of {', '.join(limited)} needs a cluster-wide lock, and on a "
                "MariaDB Galera cluster (wsrep_on = ON) MariaDB's GET_LOCK holds on one node "
                "only: schedulers on two nodes would both run up to the limit. Remove "
                "max_concurrency from these jobs (or their settings' overrides) on Galera"
            )
        if (
            self.config.polling_strategy is None
            and self.polling_strategy is PollingStrategy.LOCK_AND_FETCH
        ):
            self.polling_strategy = self.poller.strategy = PollingStrategy.FETCH
            log.info(
                "scheduler %s: the database is a MariaDB Galera node (wsrep_on): polling "
                "strategy fetch (lock-and-fetch's row locks hold on one node only)",
                self.name,
                extra={"scheduler": self.name},
            )

    async def _start_and_poll(self) -> None:
        if not self.state.ready.is_set():
            await self.startup.run()
        if self.liveness is not None:
            await self.liveness.before_first_claim()
        await self.poller.run()

    async def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until startup reached the database and created the recurring rows."""
        try:
            async with asyncio.timeout(timeout):
                await self.state.ready.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Two-phase shutdown (``Lifecycle.stop``): stop claiming; wait, cancel and wait again
        for the running executions; record their results and history; then stop heartbeats
        and housekeeping (last), and release. A call made while another stops the scheduler
        returns once that stop has finished (at once after it)."""
        if self._stopped is not None:  # a stop began: return once it has finished
            await asyncio.shield(self._stopped)
            return
        self._stopped = asyncio.get_running_loop().create_future()
        try:
            await self.lifecycle.stop()
        finally:
            self._stopped.set_result(None)
        log.info("scheduler %s stopped", self.name, extra={"scheduler": self.name})

    def _stopping(self) -> None:
        self.state.stopping = True
        self.alarm.request_poll()

    async def _release(self, left: float) -> None:
        await self.observer.scheduler_stopped(max(left, 1.0))
        await self.definitions.close()
        self.executor.close()

    # -- reporting -------------------------------------------------------------------------

    def status(self) -> SchedulerStatus:
        """A snapshot of this instance's state (for ``/jobs`` and logs)."""
        return SchedulerStatus(
            name=self.name,
            started_at=self.state.started_at,
            ready=self.state.ready.is_set(),
            stopping=self.state.stopping,
            database_reachable=self.link.reachable,
            condition=self.link.condition,
            condition_since=self.link.condition_since,
            last_error=self.link.last_error,
            last_error_at=self.link.last_error_at,
            last_successful_poll=self.state.last_poll,
            polling_strategy=self.polling_strategy,
            batch_size=self.batch_size,
            loop_restarts=self.state.loop_restarts,
            loop_lag_events=self.lag.events,
            max_loop_lag=self.lag.max_lag,
            last_loop_lag_at=self.lag.last_at,
            running=[
                ExecutionStatus(
                    task_name=e.row.task_name,
                    task_instance=e.row.task_instance,
                    execution_time=e.row.execution_time,
                    started=e.started,
                    version=e.row.version,
                    fraction_dead=e.heartbeat.fraction_dead,
                    failed_heartbeats=e.heartbeat.failed_heartbeats,
                )
                for e in self.executions
            ],
        )


# -- snapshots of this instance's state, for /jobs and for logs --------------------------------


@dataclass(frozen=True)
class ExecutionStatus:
    """An execution running on this instance."""

    task_name: str
    task_instance: str
    execution_time: datetime
    started: datetime
    version: int
    fraction_dead: float
    failed_heartbeats: int


@dataclass(frozen=True)
class SchedulerStatus:
    """This instance: is it up, does it reach the database, what does it run."""

    name: str
    started_at: datetime | None
    ready: bool
    stopping: bool
    database_reachable: bool | None
    """None until the first round trip was attempted; False while the database does not
    answer (an error that is its answer, such as read-only, leaves it True)."""
    last_error: str | None
    """The last error, kept after recovery: ``condition`` says whether it still holds."""
    last_successful_poll: datetime | None
    polling_strategy: str
    batch_size: int
    loop_restarts: int
    condition: str = "unknown"
    """Now: ``ok``, or what the last error means (``unreachable``, ``timeout``, ``read-only``,
    ``pooler``, ``schema-missing``, ``lock-wait``, ``error``, ``loop-crashed``)."""
    condition_since: datetime | None = None
    last_error_at: datetime | None = None
    loop_lag_events: int = 0
    """How often the event loop was found blocked for longer than the lag threshold."""
    max_loop_lag: float = 0.0
    """The longest blocked stretch seen, in seconds."""
    last_loop_lag_at: datetime | None = None
    running: list[ExecutionStatus] = field(default_factory=list)
