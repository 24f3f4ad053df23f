"""The scheduler's housekeeping: startup rows, heartbeats, dead executions, cleanup, and the
LISTEN connection. A mixin of ``Scheduler``: these loops share its state."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .backoff import Backoff
from .errors import SchemaMissingError
from .job import RECURRING_INSTANCE
from .repository.model import NewTask, TaskKey

if TYPE_CHECKING:
    from .clock import Clock
    from .config import SchedulerConfig
    from .execution import Execution
    from .job import _Job
    from .observer import ObserverDispatch
    from .operations.recorder import OperationsRecorder
    from .repository.base import TaskRepository
    from .repository.model import TaskRow
    from .schedules import Schedule

__all__ = ["Housekeeping"]

log = logging.getLogger("ekbatan_fastapi.scheduler")

_RESCHEDULE_GUARD = timedelta(seconds=10)
_DEATH_MARGIN = 0.005
"""Seconds after the next death to look (the comparison in SQL is strict)."""
_MIN_EARLY_CHECK = 0.02
"""Early dead-execution checks come at least this far apart (against clock skew)."""
_TIMER_SLACK = 0.001
"""The event loop may wake a timer this early (its clock resolution): still the round."""


class Housekeeping:
    """Startup rows, heartbeats, revival of dead executions, hourly cleanup, notifications."""

    if TYPE_CHECKING:
        repository: TaskRepository
        config: SchedulerConfig
        name: str
        clock: Clock
        jobs: dict[str, _Job]
        schedules: dict[str, Schedule]
        running: dict[TaskKey, Execution]
        recorder: OperationsRecorder
        observer: ObserverDispatch
        _active: list[str]
        _ready: asyncio.Event
        _stopping: bool
        _started_at: datetime | None
        _db_reachable: bool | None
        _last_error: str | None
        _last_unresolved_check: float
        _next_death: datetime | None

        def db_time(self) -> datetime: ...
        def _observe_db_time(self, db_now: datetime, sent: datetime | None = None) -> None: ...
        def _db_failed(self, error: BaseException, where: str) -> None: ...
        def request_poll(self) -> None: ...
        def note_due(self, when: datetime) -> None: ...
        async def _sleep(self, seconds: float) -> None: ...
        def _extra(self, row: TaskRow) -> dict[str, Any]: ...

    async def _bootstrap(self) -> None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while not self._stopping:
            try:
                await self._create_recurring_rows()
                if await self.recorder.check():
                    await self.recorder.report_instance(self._started_at or self.db_time())
            except SchemaMissingError as error:
                self._db_reachable = True
                self._last_error = str(error)
                log.error("scheduler %s: %s", self.name, error, extra={"scheduler": self.name})
            except Exception as error:
                self._db_failed(error, "startup")
            else:
                self._ready.set()
                return
            await self._sleep(backoff.next())

    async def _create_recurring_rows(self) -> None:
        """Insert missing recurring rows, move changed deterministic schedules, drop disabled."""
        repo = self.repository
        sent = self.clock.now()
        db_now = await repo.db_now()
        self._observe_db_time(db_now, sent)
        enabled = {n: s for n, s in self.schedules.items() if not s.is_disabled}
        inserted: set[TaskKey] = set(
            await repo.insert_missing(
                [
                    NewTask(
                        name,
                        RECURRING_INSTANCE,
                        schedule.initial_execution_time(db_now),
                        priority=self.jobs[name].priority(),
                    )
                    for name, schedule in enabled.items()
                ]
            )
        )
        deterministic = [
            n
            for n, s in enabled.items()
            if s.is_deterministic and (n, RECURRING_INSTANCE) not in inserted
        ]
        for row in (
            await repo.recurring_rows(deterministic, RECURRING_INSTANCE) if deterministic else []
        ):
            if row.picked or row.execution_time <= db_now + _RESCHEDULE_GUARD:
                continue
            expected = enabled[row.task_name].initial_execution_time(db_now)
            if expected != row.execution_time and await repo.reschedule(
                row.task_name, row.task_instance, expected, expected_version=row.version
            ):
                log.info(
                    "schedule of %s changed: moved its next run from %s to %s",
                    row.task_name,
                    row.execution_time.isoformat(),
                    expected.isoformat(),
                    extra=self._extra(row),
                )
        for name, schedule in self.schedules.items():
            if schedule.is_disabled and await repo.delete_unpicked(name, RECURRING_INSTANCE):
                log.info("%s is disabled: removed its row", name, extra={"task_name": name})

    async def _housekeeping_loop(self) -> None:
        """A round per heartbeat interval; in between, a dead-execution check at the moment
        the next picked row would become dead (so a crashed peer's executions are revived
        within milliseconds of the dead window, not up to one interval later)."""
        interval = self.config.heartbeat_interval.total_seconds()
        loop = asyncio.get_running_loop()
        next_round = loop.time() + interval
        while True:
            wake = next_round
            if self._next_death is not None:
                until = (self._next_death - self.db_time()).total_seconds() + _DEATH_MARGIN
                wake = min(wake, loop.time() + max(until, _MIN_EARLY_CHECK))
            await asyncio.sleep(max(0.0, wake - loop.time()))
            if loop.time() < next_round - _TIMER_SLACK:  # an early dead-execution check only
                self._next_death = None
                if not self._stopping and self._ready.is_set():
                    await self._revive_dead()
                continue
            next_round = loop.time() + interval
            await self._heartbeat()
            if self._stopping or not self._ready.is_set():
                continue
            await self._revive_dead()  # first: failover time does not wait for the others
            await self.recorder.report_instance(self._started_at or self.db_time())
            await self._maintain()

    async def _heartbeat(self) -> None:
        executions = [e for e in self.running.values()]
        if not executions:
            return
        try:
            alive = await self.repository.heartbeat([e.owned for e in executions])
        except Exception as error:
            self._db_failed(error, "heartbeat")
            for execution in executions:
                execution.heartbeat.record_failure()
                if self.observer.active:
                    self.observer.heartbeat_failed(
                        execution.row.task_name, execution.row.task_instance
                    )
            return
        for execution in executions:
            if execution.row.key in alive:
                execution.heartbeat.record_success()
            elif execution.row.key in self.running and not execution.recording:
                execution.heartbeat.record_failure()
                if self.observer.active:
                    self.observer.heartbeat_failed(
                        execution.row.task_name, execution.row.task_instance
                    )
                if execution.heartbeat.failed_heartbeats > 1:
                    continue
                log.warning(
                    "heartbeat of %s found the row revived elsewhere (%d failed heartbeats); "
                    "this execution can no longer record its result",
                    execution.label,
                    execution.heartbeat.failed_heartbeats,
                    extra=self._extra(execution.row),
                )

    async def _revive_dead(self) -> None:
        try:
            revived, self._next_death = await self.repository.revive_and_watch(
                self._active, self.config.dead_after
            )
        except Exception as error:
            self._db_failed(error, "dead-execution check")
            return
        for row in revived:
            if self.observer.active:
                self.observer.dead_execution_revived(
                    row.task_name, row.task_instance, row.picked_by
                )
            log.warning(
                "revived dead execution %s/%s (slot %s, picked by %s, last heartbeat %s)",
                row.task_name,
                row.task_instance,
                row.execution_time.isoformat(),
                row.picked_by,
                row.last_heartbeat.isoformat() if row.last_heartbeat else "never",
                extra=self._extra(row),
            )
        if revived:
            self.request_poll()

    async def _maintain(self) -> None:
        """Hourly (and at the first housekeeping round): delete unresolved rows, prune history
        and long-gone instances."""
        now = self.clock.monotonic()
        period = min(3600.0, self.config.delete_unresolved_after.total_seconds())
        if now - self._last_unresolved_check < period:
            return
        self._last_unresolved_check = now
        try:
            deleted = await self.repository.delete_unresolved(
                list(self.jobs), self.config.delete_unresolved_after
            )
            await self.recorder.maintain()
        except Exception as error:
            self._db_failed(error, "housekeeping (unresolved rows, history pruning)")
            return
        if deleted:
            log.warning(
                "deleted %d unresolved rows (task names no registered job knows) older than %s",
                deleted,
                self.config.delete_unresolved_after,
                extra={"scheduler": self.name},
            )

    async def _listen_loop(self) -> None:
        """Hold a LISTEN connection: work scheduled by any instance wakes this one at once."""
        await self._ready.wait()
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while not self._stopping:
            began = self.clock.monotonic()
            try:
                await self.repository.listen(self._notified)
            except Exception as error:
                if self.clock.monotonic() - began > 5:
                    backoff.reset()
                self._db_failed(error, "listening for notifications")
            await asyncio.sleep(backoff.next())

    def _notified(self, when: datetime | None) -> None:
        if when is None or when <= self.db_time():
            self.request_poll()
        else:
            self.note_due(when)
