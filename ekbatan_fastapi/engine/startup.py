"""``Startup``: before the first poll, reach the database and bring the recurring rows in line
with the registered jobs: insert the missing rows (race-safe across instances), move a row
whose deterministic schedule (daily, cron) now gives another next time, delete the rows of
disabled jobs; then look for the operations tables and report this instance."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from ..domain.errors import SchemaMissingError
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job
from ..domain.limits import JobLimits
from ..domain.records import JobDefinition
from ..domain.rows import NewTask, TaskKey
from ..domain.schedules import Schedule
from ..store.jobs import JobsStore
from ..store.tasks import TaskStore
from .alarm import Alarm
from .backoff import Backoff
from .config import SchedulerConfig
from .history import HistoryRecorder
from .link import DatabaseLink
from .logs import log_extra
from .running import RunState

__all__ = ["Startup", "definition_of", "fingerprint"]

log = logging.getLogger(__name__)

RESCHEDULE_GUARD = timedelta(seconds=10)
"""A row due within this long is not moved by a changed schedule (it is about to run)."""


def fingerprint(schedule: Schedule) -> str:
    """A short stable digest of a schedule (its db-scheduler form)."""
    return hashlib.sha256(schedule.describe().encode("utf-8")).hexdigest()[:32]


def definition_of(
    job: Job, limits: JobLimits, config: SchedulerConfig, written_by: str
) -> JobDefinition:
    """What ``ekbatan_jobs`` says of one job (``written_at`` is the database's)."""
    schedule = job.schedule() if isinstance(job, DistributedJob) else None
    return JobDefinition(
        task_name=job.name(),
        kind="recurring" if schedule is not None else "one-time",
        schedule=schedule.describe() if schedule is not None else None,
        fingerprint=fingerprint(schedule) if schedule is not None else None,
        app_version=config.app_version,
        timeout=limits.timeout,
        max_concurrency=limits.max_concurrency,
        keyed=limits.concurrency_key is not None,
        written_by=written_by,
        written_at=datetime.now(UTC),
    )


class Startup:
    """Runs once, retrying with backoff until the database answers; then ``state.ready``."""

    def __init__(
        self,
        *,
        name: str,
        jobs: Mapping[str, Job],
        schedules: Mapping[str, Schedule],
        limits: Mapping[str, JobLimits],
        tasks: TaskStore,
        definitions: JobsStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        history: HistoryRecorder,
    ) -> None:
        self.name = name
        self.jobs = jobs
        self.schedules = schedules
        self.limits = limits
        self.tasks = tasks
        self.definitions = definitions
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.history = history

    async def run(self) -> None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while not self.state.stopping:
            try:
                await self.create_recurring_rows()
                if await self.history.check():
                    await self.history.report_instance(self.state.started_at or self.link.now())
                await self.register_definitions()
            except SchemaMissingError as error:
                self.link.answered()
                self.link.report("schema-missing", str(error))
                log.error("scheduler %s: %s", self.name, error, extra={"scheduler": self.name})
            except Exception as error:
                self.link.failed(error, "startup")
            else:
                self.state.ready.set()
                return
            await self.alarm.sleep(backoff.next())

    async def register_definitions(self) -> None:
        """Write what each job is into ``ekbatan_jobs`` (migration V0003), where it exists."""
        if not self.jobs or not await self.definitions.look():
            return
        await self.definitions.write(
            [
                definition_of(job, self.limits[name], self.config, self.name)
                for name, job in self.jobs.items()
            ]
        )

    async def create_recurring_rows(self) -> None:
        """Insert missing recurring rows, move changed deterministic schedules, drop disabled."""
        tasks = self.tasks
        sent = self.config.clock.now()
        db_now = await tasks.db_now()
        self.link.observed(db_now, sent)
        enabled = {n: s for n, s in self.schedules.items() if not s.is_disabled}
        inserted: set[TaskKey] = set(
            await tasks.insert_missing(
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
        rows = (
            await tasks.recurring_rows(deterministic, RECURRING_INSTANCE) if deterministic else []
        )
        for row in rows:
            if row.picked or row.execution_time <= db_now + RESCHEDULE_GUARD:
                continue
            expected = enabled[row.task_name].initial_execution_time(db_now)
            if expected != row.execution_time and await tasks.reschedule(
                row.task_name, row.task_instance, expected, expected_version=row.version
            ):
                log.info(
                    "schedule of %s changed: moved its next run from %s to %s",
                    row.task_name,
                    row.execution_time.isoformat(),
                    expected.isoformat(),
                    extra=log_extra(row, self.name),
                )
        for name, schedule in self.schedules.items():
            if schedule.is_disabled and await tasks.delete_unpicked(name, RECURRING_INSTANCE):
                log.info("%s is disabled: removed its row", name, extra={"task_name": name})
