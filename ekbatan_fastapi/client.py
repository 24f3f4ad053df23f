"""The scheduler client: schedule, reschedule, cancel and read task instances."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .codec import decode_data, encode_data
from .errors import (
    ConfigurationError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from .job import RECURRING_INSTANCE, DistributedJob, OneTimeJob, _Job
from .operations.models import ExecutionRecord, InstanceInfo, PauseInfo
from .operations.repository import OperationsRepository
from .repository.base import TaskRepository
from .repository.model import NewTask, TaskRow

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = [
    "MAX_NAME_LENGTH",
    "ScheduledTask",
    "SchedulerClient",
    "is_storable_text",
    "validate_name",
]

MAX_NAME_LENGTH = 100
_UNSET: Any = object()


def is_storable_text(value: str) -> bool:
    """True when a database can store ``value``: UTF-8 encodable (no lone surrogate, which
    Python strings may hold) and without NUL."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def validate_name(value: object, what: str) -> str:
    """Task names and instance ids: non-empty strings of at most 100 characters."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {type(value).__name__}: {value!r}")
    if not value.strip() or len(value) > MAX_NAME_LENGTH or not is_storable_text(value):
        shown = value if len(value) <= 120 else value[:117] + "..."
        raise ConfigurationError(
            f"{what} {shown!r} is invalid: use 1 to {MAX_NAME_LENGTH} characters (no NUL, "
            f"no lone surrogate), not blank (got {len(value)} characters)"
        )
    return value


def _aware(at: datetime | None, what: str) -> datetime | None:
    if at is None:
        return None
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ConfigurationError(
            f"{what} must be a timezone-aware datetime, got {at!r}; "
            "use e.g. datetime.now(UTC) + timedelta(minutes=5)"
        )
    return at


@dataclass(frozen=True)
class ScheduledTask:
    """A row of ``scheduled_tasks`` as the client shows it."""

    task_name: str
    task_instance: str
    execution_time: datetime
    picked: bool
    picked_by: str | None
    last_success: datetime | None
    last_failure: datetime | None
    consecutive_failures: int
    last_heartbeat: datetime | None
    version: int
    priority: int
    task_data: bytes | None

    @classmethod
    def from_row(cls, row: TaskRow) -> ScheduledTask:
        return cls(
            task_name=row.task_name,
            task_instance=row.task_instance,
            execution_time=row.execution_time,
            picked=row.picked,
            picked_by=row.picked_by,
            last_success=row.last_success,
            last_failure=row.last_failure,
            consecutive_failures=row.consecutive_failures or 0,
            last_heartbeat=row.last_heartbeat,
            version=row.version,
            priority=row.priority or 0,
            task_data=row.task_data,
        )

    @property
    def data(self) -> Any:
        """The decoded ``task_data`` (raises TaskDataError when it is not our JSON)."""
        return decode_data(self.task_data, where=f"{self.task_name}/{self.task_instance}")


class SchedulerClient:
    """Schedules one-time task instances and reads or changes rows of the table."""

    def __init__(
        self,
        repository: TaskRepository,
        jobs: Mapping[str, _Job],
        scheduler: Scheduler | None = None,
    ) -> None:
        self._repo = repository
        self._jobs = jobs
        self._scheduler = scheduler

    def _one_time_job(self, job_name: str) -> OneTimeJob:
        validate_name(job_name, "job name")
        job = self._jobs.get(job_name)
        if isinstance(job, OneTimeJob):
            return job
        known = sorted(n for n, j in self._jobs.items() if isinstance(j, OneTimeJob))
        if isinstance(job, DistributedJob):
            raise UnknownJobError(
                f"{job_name!r} is a recurring job: its single row is managed by the scheduler; "
                "use run_now() to run it early"
            )
        raise UnknownJobError(
            f"no one-time job named {job_name!r} is registered; registered one-time jobs: "
            f"{', '.join(known) or '(none)'}"
        )

    def _woken(self, at: datetime | None) -> None:
        if self._scheduler is None:
            return
        if at is None:
            self._scheduler.request_poll()
        else:
            self._scheduler.note_due(at)

    async def schedule(
        self,
        job_name: str,
        instance_id: str,
        at: datetime | None = None,
        data: Any = None,
        *,
        replace: bool = False,
        priority: int | None = None,
    ) -> bool:
        """Schedule instance ``instance_id`` of one-time job ``job_name`` at ``at`` (None: now).

        An existing instance is left alone (returns False) unless ``replace`` is true, which
        moves it and replaces its data; a running instance cannot be replaced.
        """
        job = self._one_time_job(job_name)
        validate_name(instance_id, "instance id")
        at = _aware(at, "at")
        where = f"{job_name}/{instance_id}"
        task = NewTask(
            job_name,
            instance_id,
            at,
            encode_data(data, where=where),
            job.priority() if priority is None else priority,
        )
        written = await self._repo.upsert(task, replace=replace)
        if not written and replace:
            raise TaskPickedError(f"{where} is running right now; it cannot be replaced")
        if written:
            self._woken(at)
        return written

    async def schedule_many(
        self,
        job_name: str,
        instances: Iterable[tuple[str, datetime | None, Any]],
    ) -> int:
        """Schedule many instances of one job in one statement: ``(instance_id, at, data)``
        tuples (``at`` None: now). Existing instances are left alone; returns how many were
        created."""
        job = self._one_time_job(job_name)
        tasks: list[NewTask] = []
        earliest: datetime | None = None
        due_now = False
        for instance_id, at, data in instances:
            validate_name(instance_id, "instance id")
            at = _aware(at, "at")
            if at is None:
                due_now = True
            elif earliest is None or at < earliest:
                earliest = at
            where = f"{job_name}/{instance_id}"
            tasks.append(
                NewTask(job_name, instance_id, at, encode_data(data, where=where), job.priority())
            )
        if not tasks:
            return 0
        created = len(await self._repo.insert_missing(tasks))
        when = None if due_now else earliest
        self._woken(when)
        if created and self._repo.supports_notify:
            await self._repo.notify(when)
        return created

    async def reschedule(
        self,
        job_name: str,
        instance_id: str,
        at: datetime | None = None,
        data: Any = _UNSET,
    ) -> None:
        """Move an instance (recurring: ``instance_id='recurring'``) to ``at`` (None: now)."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        at = _aware(at, "at")
        where = f"{job_name}/{instance_id}"
        replace_data = data is not _UNSET
        ok = await self._repo.reschedule(
            job_name,
            instance_id,
            at,
            task_data=encode_data(data, where=where) if replace_data else None,
            replace_data=replace_data,
        )
        if not ok:
            await self._explain_failure(job_name, instance_id, "rescheduled")
        self._woken(at)
        if self._repo.supports_notify:
            await self._repo.notify(at)

    async def run_now(
        self, job_name: str, instance_id: str = RECURRING_INSTANCE, *, force: bool = False
    ) -> None:
        """Make an instance due now (database clock), keeping its failure counters.

        A paused task raises TaskPausedError unless ``force``; a forced run is claimed and
        started on this instance at once (the task stays paused afterwards).
        """
        validate_name(job_name, "job name")
        pause = (await self.paused()).get(job_name)
        if pause is None:
            await self.reschedule(job_name, instance_id, None)
            return
        where = f"{job_name}/{instance_id}"
        if not force:
            raise TaskPausedError(
                f"{job_name} is paused (by {pause.paused_by} at {pause.paused_at.isoformat()}"
                f"{': ' + pause.reason if pause.reason else ''}); resume it, or pass force=True "
                "to run it once anyway"
            )
        if self._scheduler is None or job_name not in self._jobs:
            raise UnknownJobError(
                f"a forced run of {where} needs a running registry that has the job {job_name!r}"
            )
        row = await self._repo.claim_now(job_name, instance_id, self._scheduler.name)
        if row is None:
            await self._explain_failure(job_name, instance_id, "run")
            return
        self._scheduler.run_claimed(row)

    # -- operations: history, pause/resume, instances ------------------------------------

    async def _has_ops(self) -> bool:
        """True once the operations tables are known to exist (checked lazily)."""
        return self._scheduler is not None and await self._scheduler.recorder.check()

    async def _require_ops(self) -> OperationsRepository:
        if not await self._has_ops():
            raise SchemaMissingError(
                "the operations tables (execution history, paused tasks, instances) are "
                f"missing: apply migrations/{self._repo.dialect_name}/V0002__ekbatan_operations"
                ".sql or call `await ekbatan_fastapi.create_schema(engine)`"
            )
        assert self._scheduler is not None
        return self._scheduler.recorder.ops

    async def _known_task(self, job_name: str) -> None:
        validate_name(job_name, "job name")
        if job_name not in self._jobs and not await self._repo.list_tasks(job_name, limit=1):
            raise TaskNotFoundError(
                f"no job named {job_name!r} is registered here and the table has no rows for it"
            )

    async def history(
        self, job_name: str | None = None, *, limit: int = 50, before_id: int | None = None
    ) -> list[ExecutionRecord]:
        """Executions, newest first; page with ``before_id`` = the last id of a page."""
        if job_name is not None:
            validate_name(job_name, "job name")
        if not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit must be from 1 to 1000, got {limit}")
        return await (await self._require_ops()).history(job_name, limit=limit, before_id=before_id)

    async def pause(
        self, job_name: str, reason: str | None = None, *, paused_by: str | None = None
    ) -> None:
        """Pause a task cluster-wide: no instance claims it until resumed (survives restarts).
        Executions already running finish normally."""
        await self._known_task(job_name)
        ops = await self._require_ops()
        by = (
            paused_by
            if paused_by is not None
            else (self._scheduler.name if self._scheduler else None)
        )
        await ops.pause(job_name, by, reason)

    async def resume(self, job_name: str, *, skip_missed: bool = False) -> bool:
        """Resume a paused task; False if it was not paused. An overdue slot then runs once,
        unless ``skip_missed`` moves a recurring row to its next future slot."""
        await self._known_task(job_name)
        ops = await self._require_ops()
        job = self._jobs.get(job_name)
        if skip_missed and isinstance(job, DistributedJob):  # move it while still paused
            row = await self._repo.get(job_name, RECURRING_INSTANCE)
            db_now = await self._repo.db_now()
            if row is not None and not row.picked and row.execution_time <= db_now:
                following = job.schedule().next_execution_time(row.execution_time, db_now)
                await self._repo.reschedule(
                    job_name, RECURRING_INSTANCE, following, expected_version=row.version
                )
        resumed = await ops.resume(job_name)
        if resumed:
            self._woken(None)
            if self._repo.supports_notify:
                await self._repo.notify(None)
        return resumed

    async def paused(self) -> dict[str, PauseInfo]:
        """Every paused task (empty when the operations tables are missing)."""
        if not await self._has_ops():
            return {}
        return await (await self._require_ops()).paused()

    async def instances(self) -> list[InstanceInfo]:
        """Scheduler instances as they last reported themselves; ``alive`` = seen within the
        dead window."""
        ops = await self._require_ops()
        assert self._scheduler is not None
        return await ops.instances(self._scheduler.config.dead_after)

    async def cancel(self, job_name: str, instance_id: str) -> None:
        """Delete an instance that is not running."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        if not await self._repo.delete_unpicked(job_name, instance_id):
            await self._explain_failure(job_name, instance_id, "cancelled")

    async def _explain_failure(self, job_name: str, instance_id: str, verb: str) -> None:
        row = await self._repo.get(job_name, instance_id)
        where = f"{job_name}/{instance_id}"
        if row is None:
            raise TaskNotFoundError(f"no task instance {where} is scheduled")
        if row.picked:
            raise TaskPickedError(
                f"{where} is running right now on {row.picked_by}; it cannot be {verb} until "
                "it finishes"
            )
        raise TaskPickedError(f"{where} changed concurrently and was not {verb}; try again")

    async def get(self, job_name: str, instance_id: str) -> ScheduledTask | None:
        row = await self._repo.get(job_name, instance_id)
        return ScheduledTask.from_row(row) if row else None

    async def list(
        self,
        job_name: str | None = None,
        *,
        picked: bool | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[ScheduledTask]:
        """Instances ordered by execution time; filter by job name and picked state."""
        rows = await self._repo.list_tasks(job_name, picked=picked, limit=limit, offset=offset)
        return [ScheduledTask.from_row(r) for r in rows]
