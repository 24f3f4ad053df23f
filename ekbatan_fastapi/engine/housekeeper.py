"""``Housekeeper``: a round per heartbeat interval: heartbeat every running execution, revive
dead executions (also in between, at the moment the next picked row would be dead), report
this instance, and (hourly) delete unresolved rows, prune the history and the trace contexts
whose task is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from ..domain.logs import library_logger
from ..store.tasks import TaskStore
from ..store.traces import TraceStore
from .alarm import Alarm
from .config import SchedulerConfig
from .execution import Execution
from .history import HistoryRecorder
from .link import DatabaseLink
from .logs import log_extra
from .observer import ObserverDispatch
from .running import RunningExecutions, RunState

__all__ = ["Housekeeper"]

log = library_logger(__name__)

_DEATH_MARGIN = 0.005
"""Seconds after the next death to look (the comparison in SQL is strict)."""
_MIN_EARLY_CHECK = 0.02
"""Early dead-execution checks come at least this far apart (against clock skew)."""
_TIMER_SLACK = 0.001
"""The event loop may wake a timer this early (its clock resolution): still the round."""
_MAINTENANCE_PERIOD = 3600.0


class Housekeeper:
    """Heartbeats, dead executions, maintenance."""

    def __init__(
        self,
        *,
        name: str,
        names: Sequence[str],
        known: Sequence[str],
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        running: RunningExecutions,
        history: HistoryRecorder,
        observer: ObserverDispatch,
        refresh_definitions: Callable[[], Awaitable[None]] | None = None,
        traces: TraceStore | None = None,
    ) -> None:
        self.name = name
        self.names = list(names)
        """The task names whose dead executions this instance revives (it can run them)."""
        self.known = list(known)
        """Every registered job name (rows of other names are unresolved)."""
        self.tasks = tasks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.running = running
        self.history = history
        self.observer = observer
        self.refresh_definitions = refresh_definitions
        """Re-reads the stored job definitions (a newer version's schedules)."""
        self.traces = traces
        """Trace contexts of one-time tasks (OpenTelemetry): pruned where the task is gone."""
        self.next_death: datetime | None = None
        """When the next picked row would be dead (database time): check for it then."""
        self._last_maintenance = -1e9
        self._warned_unknown: set[str] = set()

    async def run(self) -> None:
        """A round per heartbeat interval; in between, a dead-execution check at the moment
        the next picked row would become dead (so a crashed peer's executions are revived
        within milliseconds of the dead window, not up to one interval later)."""
        interval = self.config.heartbeat_interval.total_seconds()
        loop = asyncio.get_running_loop()
        next_round = loop.time() + interval
        while True:
            wake = next_round
            if self.next_death is not None:
                until = (self.next_death - self.link.now()).total_seconds() + _DEATH_MARGIN
                wake = min(wake, loop.time() + max(until, _MIN_EARLY_CHECK))
            await asyncio.sleep(max(0.0, wake - loop.time()))
            if loop.time() < next_round - _TIMER_SLACK:  # an early dead-execution check only
                self.next_death = None
                if self._may_revive():
                    await self.revive_dead()
                continue
            next_round = loop.time() + interval
            await self.heartbeat()
            if not self._may_revive():
                continue
            await self.revive_dead()  # first: failover time does not wait for the others
            await self.release_orphans()
            await self.history.report_instance(self.state.started_at or self.link.now())
            if self.refresh_definitions is not None:
                await self.refresh_definitions()
            await self.maintain()

    def _may_revive(self) -> bool:
        return not self.state.stopping and self.state.ready.is_set()

    async def heartbeat(self) -> None:
        executions = list(self.running)
        if not executions:
            return
        sent = self.config.clock.monotonic()  # when the database stores the heartbeats
        try:
            alive = await self.tasks.heartbeat([e.owned for e in executions])
        except Exception as error:
            self.link.failed(error, "heartbeat")
            for execution in executions:
                self._heartbeat_failed(execution)
            return
        self.link.answered()
        for execution in executions:
            if execution.row.key in alive:
                execution.heartbeat.record_success(sent)
            elif execution.row.key in self.running.by_key and not execution.recording:
                self._heartbeat_failed(execution)
                if execution.heartbeat.failed_heartbeats > 1:
                    continue
                log.warning(
                    "heartbeat of %s found the row revived elsewhere (%d failed heartbeats); "
                    "this execution can no longer record its result",
                    execution.label,
                    execution.heartbeat.failed_heartbeats,
                    extra=log_extra(execution.row, self.name),
                )

    def _heartbeat_failed(self, execution: Execution) -> None:
        execution.heartbeat.record_failure()
        if self.observer.active:
            self.observer.heartbeat_failed(execution.row.task_name, execution.row.task_instance)

    async def revive_dead(self) -> None:
        try:
            revival = await self.tasks.revive_dead(self.names, self.config.dead_after)
        except Exception as error:
            self.link.failed(error, "dead-execution check")
            return
        self.link.answered()
        self.next_death = revival.next_death
        for row in revival.revived:
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
                extra=log_extra(row, self.name),
            )
        if revival.revived:
            self.alarm.request_poll()

    def _orphans_possible(self) -> bool:
        """A claim of ours failed lately: it may have executed on the server anyway. After a
        dead window its rows are dead executions, revived like any other."""
        failed = self.state.claim_failed_at
        if failed is None:
            return False
        window = (self.config.dead_after + 2 * self.config.heartbeat_interval).total_seconds()
        if self.config.clock.monotonic() - failed > window:
            self.state.claim_failed_at = None
            return False
        return True

    async def release_orphans(self) -> None:
        """Release rows picked by this instance that it does not run (see
        ``TaskStore.release_orphans``); only while a failed claim may have left some."""
        if not self._orphans_possible() or self.state.claiming:
            return
        try:
            released = await self.tasks.release_orphans(
                self.name,
                self.running.by_key,  # live: an execution launched meanwhile counts
                2 * self.config.heartbeat_interval,
                still_safe=lambda: not self.state.claiming and not self.state.stopping,
            )
        except Exception as error:
            self.link.failed(error, "releasing orphaned claims")
            return
        for row in released:
            log.warning(
                "released %s/%s (slot %s): picked by this instance, which does not run it (a "
                "claim whose answer was lost); it runs again at its slot",
                row.task_name,
                row.task_instance,
                row.execution_time.isoformat(),
                extra=log_extra(row, self.name),
            )
        if released:
            self.alarm.request_poll()

    async def maintain(self) -> None:
        """Hourly (and at the first housekeeping round): delete unresolved rows, prune history
        and long-gone instances."""
        now = self.config.clock.monotonic()
        period = min(_MAINTENANCE_PERIOD, self.config.delete_unresolved_after.total_seconds())
        if now - self._last_maintenance < period:
            return
        self._last_maintenance = now
        try:
            deleted = await self.tasks.delete_unresolved(
                self.known, self.config.delete_unresolved_after
            )
            await self.history.maintain()
            if self.traces is not None:
                await self.traces.prune()
        except Exception as error:
            self.link.failed(error, "housekeeping (unresolved rows, history pruning)")
            return
        if deleted:
            log.warning(
                "deleted %d unresolved rows (task names no registered job knows) older than %s",
                deleted,
                self.config.delete_unresolved_after,
                extra={"scheduler": self.name},
            )
        await self.warn_unknown()

    async def warn_unknown(self) -> None:
        """Warn once per task name about rows no live instance runs: unpicked, overdue by more
        than the dead window, of a name this instance does not know (a live instance that
        knew it would have claimed them)."""
        try:
            found = await self.history.ops.overdue_unknown(self.known, self.config.dead_after)
            paused = set(await self.history.ops.paused()) if self.history.available else set()
        except Exception as error:
            self.link.failed(error, "housekeeping (rows of unknown tasks)")
            return
        for name, count, oldest in found:
            if name in paused or name in self._warned_unknown:
                continue
            self._warned_unknown.add(name)
            log.warning(
                "%d rows of task %r have been due since %s and no live instance runs them: "
                "no job of that name is registered here, and no other instance claimed them "
                "within %s. Register the job (its module in ekbatan.jobs.modules, "
                "EKBATAN_JOBS__MODULES) or delete the rows (`ekbatan-jobs list %s` shows them); "
                "rows of unknown tasks are deleted after %s (delete_unresolved_after)",
                count,
                name,
                oldest.isoformat(),
                self.config.dead_after,
                name,
                self.config.delete_unresolved_after,
                extra={"task_name": name, "scheduler": self.name},
            )
