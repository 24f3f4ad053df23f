"""``Startup``: before the first poll, reach the database and bring the recurring rows in line
with the registered jobs: settle whose definition holds (``Definitions``: a rolling deploy
never moves a row back), insert the missing rows (race-safe across instances), move a row
whose deterministic schedule (daily, cron) changed, delete the rows of disabled jobs; then
look for the operations tables and report this instance. ``plan`` says what that would change,
without changing anything (``ekbatan-jobs plan``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..domain.job import RECURRING_INSTANCE, Job
from ..domain.logs import library_logger
from ..domain.rollout import Decision
from ..domain.rows import JobDefinition, NewTask, TaskKey, TaskRow
from ..domain.schedules import Schedule
from ..store.tasks import TaskStore
from .config import SchedulerConfig
from .definitions import Definitions
from .history import HistoryRecorder
from .logs import log_extra
from .poller import Alarm, Backoff, DatabaseLink, paced
from .running import RunState

__all__ = ["PlannedChange", "Startup"]

log = library_logger(__name__)

RESCHEDULE_GUARD = timedelta(seconds=10)
"""A row due within this long is not moved by a changed schedule (it is about to run)."""


@dataclass(frozen=True, slots=True)
class PlannedChange:
    """What startup does (or would do) to one recurring job."""

    task_name: str
    action: str
    """``insert``, ``reschedule``, ``delete``, ``adopt`` (a newer version's schedule holds),
    or ``none``."""
    old_schedule: str | None
    new_schedule: str | None
    next_before: datetime | None
    next_after: datetime | None
    reason: str


class Startup:
    """Runs once, retrying with backoff until the database answers; then ``state.ready``."""

    def __init__(
        self,
        *,
        name: str,
        jobs: Mapping[str, Job],
        tasks: TaskStore,
        definitions: Definitions,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        history: HistoryRecorder,
        first_contact: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.first_contact = first_contact
        """Run once, before anything else, when the database first answers."""
        self.name = name
        self.jobs = jobs
        self.tasks = tasks
        self.definitions = definitions
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.history = history

    async def run(self) -> None:
        """``once``, retried with backoff until it succeeds (or the scheduler stops)."""
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while not self.state.stopping:
            try:
                await self.once()
            except Exception as error:  # a missing table too: logged once, then once a minute
                self.link.failed(error, "startup")
            else:
                return
            await self.alarm.backoff(backoff.next())

    async def once(self) -> None:
        """One attempt at every start-up step, errors propagating (a manual driver calls it
        directly): the first contact, the recurring rows, this instance's report; then ready."""
        if self.first_contact is not None:
            await self.first_contact()
            self.first_contact = None
        await self.create_recurring_rows()
        if await self.history.check():
            await self.history.report_instance(self.state.started_at or self.link.now())
        self.state.ready_at = self.link.now()
        self.state.ready.set()

    async def create_recurring_rows(self) -> None:
        """Settle the definitions, then insert missing recurring rows, move changed
        deterministic schedules, drop disabled ones."""
        sent = self.config.clock.now()
        db_now = await self.tasks.db_now()
        self.link.observed(db_now, sent)
        decisions = await self.definitions.reconcile()
        current = self.definitions.current()  # after reconcile: the adopted schedules too
        enabled = {n: s for n, s in current.items() if not s.is_disabled}
        inserted = await self._insert_missing(enabled, db_now)
        movable = [
            n
            async for n, s in paced(enabled.items())
            if s.is_deterministic
            and (n, RECURRING_INSTANCE) not in inserted
            and (decisions is None or decisions[n].changed)
        ]
        await self._move_changed(movable, enabled, db_now)
        await self._drop_disabled(decisions)

    async def _insert_missing(
        self, enabled: Mapping[str, Schedule], db_now: datetime
    ) -> set[TaskKey]:
        """The row of each enabled recurring job that has none, at its first time."""
        rows = [
            NewTask(
                name,
                RECURRING_INSTANCE,
                schedule.initial_execution_time(db_now),
                priority=self.jobs[name].priority(),
            )
            async for name, schedule in paced(enabled.items())
        ]
        return set(await self.tasks.insert_missing(rows))

    async def _move_changed(
        self, names: list[str], enabled: Mapping[str, Schedule], db_now: datetime
    ) -> None:
        """Move the next run of each of ``names`` (a deterministic schedule that changed) to
        where its schedule now puts it; a row picked or due within the guard stays."""
        rows = await self.tasks.recurring_rows(names, RECURRING_INSTANCE) if names else []
        for row in rows:
            expected = self._moved_to(row, enabled[row.task_name], db_now)
            if expected is not None and await self.tasks.reschedule(
                row.task_name, row.task_instance, expected, expected_version=row.version
            ):
                log.info(
                    "schedule of %s changed: moved its next run from %s to %s",
                    row.task_name,
                    row.execution_time.isoformat(),
                    expected.isoformat(),
                    extra=log_extra(row, self.name),
                )

    async def _drop_disabled(self, decisions: Mapping[str, Decision] | None) -> None:
        """Delete the unpicked row of each disabled job whose definition this instance holds."""
        for name, schedule in self.definitions.current().items():
            held = decisions is None or decisions[name].ours
            if (
                schedule.is_disabled
                and held
                and await self.tasks.delete_unpicked(name, RECURRING_INSTANCE)
            ):
                log.info("%s is disabled: removed its row", name, extra={"task_name": name})

    @staticmethod
    def _moved_to(row: TaskRow, schedule: Schedule, db_now: datetime) -> datetime | None:
        """Where a changed deterministic schedule moves ``row`` (None: it stays)."""
        if row.picked or row.execution_time <= db_now + RESCHEDULE_GUARD:
            return None
        expected = schedule.initial_execution_time(db_now)
        return expected if expected != row.execution_time else None

    async def plan(self) -> list[PlannedChange]:
        """What startup would change now for each recurring job, changing nothing."""
        db_now = await self.tasks.db_now()
        found = await self.definitions.decisions()
        decisions, stored = found if found is not None else ({}, {})
        names = [n for n in self.definitions.local if n in self.jobs]
        rows = {
            r.task_name: r
            for r in (await self.tasks.recurring_rows(names, RECURRING_INSTANCE) if names else [])
        }
        return [
            self._planned(name, rows.get(name), db_now, decisions.get(name), stored.get(name))
            for name in names
        ]

    def _planned(
        self,
        name: str,
        row: TaskRow | None,
        db_now: datetime,
        decision: Decision | None,
        stored: JobDefinition | None,
    ) -> PlannedChange:
        local = self.definitions.local[name]
        before = row.execution_time if row is not None else None
        old = stored.schedule if stored is not None else None
        reason = decision.reason if decision is not None else "no job definitions table"
        if decision is not None and not decision.ours:
            reason = f"{reason}: runs by the stored schedule (its own: {local.describe()})"
            return PlannedChange(name, "adopt", old, old, before, before, reason)
        new = local.describe()
        if local.is_disabled:
            action = "delete" if row is not None and not row.picked else "none"
            return PlannedChange(name, action, old, new, before, None, reason)
        if row is None:
            first = local.initial_execution_time(db_now)
            return PlannedChange(name, "insert", old, new, None, first, reason)
        moved = None
        if local.is_deterministic and (decision is None or decision.changed):
            moved = self._moved_to(row, local, db_now)
        if moved is None:
            return PlannedChange(name, "none", old, new, before, before, reason)
        return PlannedChange(name, "reschedule", old, new, before, moved, reason)
