"""The operator read model: what ``GET /jobs`` (and ``/jobs/{name}``), the history pages,
the dashboard, ``ekbatan-jobs ... --json`` and the metrics show of the cluster, built here
once, with one set of names (``views.py``).

Every row comes with its derived state (the rules are the domain's,
``ekbatan_fastapi.domain.tasks``). The dead-after window is the reader's (``heartbeat_interval
x missed_heartbeats_limit``): every instance is expected to share it. With a scheduler running
in this process (``ReadModel.of``), the report also judges the cluster's health (dead rows,
orphaned claims, this instance's failing loops); the CLI reads without one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.exc import DBAPIError

from ..domain.codec import TaskDataError, TaskDataTooDeep
from ..domain.durations import format_iso_duration
from ..domain.errors import DatabaseUnavailable, SchemaMissingError
from ..domain.job import DistributedJob, Job, OneTimeJob
from ..domain.persistent import PersistentScheduleJob
from ..domain.rows import ExecutionRecord, InstanceInfo, JobDefinition, Outcome, PauseInfo
from ..domain.tasks import ScheduledTask, derive_state, heartbeat_age, overdue_after
from ..domain.text import redact
from ..engine.running import Holdings
from ..store.database import Diagnosis
from .client import SchedulerClient
from .views import (
    ExecutionView,
    HistoryPage,
    HistoryRecord,
    InstanceView,
    JobsReport,
    JobView,
    PauseView,
    SchedulerView,
    TaskPage,
    TaskView,
)

if TYPE_CHECKING:
    from ..engine.scheduler import Scheduler

Diagnose = Callable[[BaseException], Diagnosis]

__all__ = [
    "ReadModel",
    "describe_failure",
    "history_record",
    "running_here",
    "shown",
]


_USER = re.compile(
    r"""\b(for) (user|role) (?:(["'`])[^"'`]*\3(?:@(?:(["'`])[^"'`]*\4|[^\s)"']+))?"""
    r"""|[^\s@"'`]+@[^\s)"']+)|\b(role) (["'`])[^"'`]*\6""",
    re.IGNORECASE,
)
"""A database user's name in a driver's message (MySQL/MariaDB: ``Access denied for user
'root'@'10.0.0.5'``; PostgreSQL: ``password authentication failed for user "app"``, ``role
"app" does not exist``): not for unauthenticated readers."""


def shown(text: str) -> str:
    """Text fit for ``/jobs`` and the dashboard, which anyone may read: ``redact`` (no SQL
    parameters, no passwords) and no database user name (a login's other half)."""
    return redact(_USER.sub(lambda m: f"{m[1] or ''} {m[2] or m[5]} (name hidden)".strip(), text))


def describe_failure(error: BaseException, diagnose: Diagnose | None = None) -> str:
    """What a failed read of the tasks means: the database's diagnosis (``unreachable``,
    ``read-only``, a pooler mismatch, ...) for driver and connection errors, else what
    failed."""
    if isinstance(error, DatabaseUnavailable):  # it names where already
        return shown(str(error))
    if diagnose is not None and isinstance(error, DBAPIError | OSError):
        return shown(diagnose(error).message)
    what = shown(f"{type(error).__name__}: {error}")
    if isinstance(error, DBAPIError | OSError):
        return f"database unreachable: {what}"
    return f"cannot read the tasks: {what}"


_MAX_FAILING_NAMES = 50
_HISTORY_DEPTH = 20
"""``last_errors``: the names and records per name it reads at most."""

_SHOWN_DATA_BYTES = 64 * 1024
"""``task_data`` larger than this is not decoded for ``/jobs`` (the body stays bounded)."""
_SHOWN_DATA_DEPTH = 64
"""JSON nested deeper than this is not shown (encoders stop at a few hundred levels)."""


def _too_deep(value: Any, limit: int) -> bool:
    """``value`` (decoded JSON) has arrays or objects nested more than ``limit`` deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _task_data(task: ScheduledTask) -> Any:
    """The row's data as JSON, or a short text saying why it is not shown: whatever a row holds
    (written by anyone with INSERT on the table), the report never fails on it."""
    raw = task.task_data
    if raw is None:
        return None
    if len(raw) > _SHOWN_DATA_BYTES:
        return f"<{len(raw)} bytes, over the {_SHOWN_DATA_BYTES} shown>"
    try:
        data = task.data
    except (TaskDataTooDeep, RecursionError):
        return f"<{len(raw)} bytes, JSON nested too deep to show>"
    except (TaskDataError, ValueError):
        return f"<{len(raw)} bytes, not JSON>"
    if isinstance(data, dict | list) and _too_deep(data, _SHOWN_DATA_DEPTH):
        return f"<{len(raw)} bytes, JSON nested deeper than {_SHOWN_DATA_DEPTH} levels>"
    return data


def pause_view(pause: PauseInfo) -> PauseView:
    return PauseView(
        name=pause.task_name,
        paused_by=pause.paused_by,
        paused_at=pause.paused_at,
        reason=pause.reason,
    )


def instance_view(instance: InstanceInfo, now: datetime | None, me: str | None) -> InstanceView:
    return InstanceView(
        name=instance.name,
        host=instance.host,
        pid=instance.pid,
        started_at=instance.started_at,
        last_seen=instance.last_seen,
        last_seen_age_seconds=(
            max((now - instance.last_seen).total_seconds(), 0.0) if now is not None else None
        ),
        library_version=instance.library_version,
        alive=instance.alive,
        this_instance=instance.name == me,
    )


def history_record(record: ExecutionRecord) -> HistoryRecord:
    assert record.id is not None  # read from the table
    return HistoryRecord(
        id=record.id,
        task_name=record.task_name,
        task_instance=record.task_instance,
        execution_time=record.execution_time,
        picked_by=record.picked_by,
        started_at=record.started_at,
        finished_at=record.finished_at,
        duration_seconds=record.duration_seconds,
        outcome=record.outcome,
        error_class=record.error_class,
        error_message=shown(record.error_message) if record.error_message else None,
    )


def running_here(scheduler: Scheduler) -> dict[str, int]:
    """Executions running on ``scheduler``, by job (0 for each of its jobs): the metrics'
    ``ekbatan_running_executions`` and the report's ``scheduler.running``, counted alike."""
    counts = dict.fromkeys(scheduler.jobs, 0)
    for execution in list(scheduler.running.values()):
        task = execution.row.task_name
        counts[task] = counts.get(task, 0) + 1
    return counts


def _scheduler_view(scheduler: Scheduler) -> SchedulerView:
    status = scheduler.status()
    config = scheduler.config
    return SchedulerView(
        name=status.name,
        started_at=status.started_at,
        ready=status.ready,
        stopping=status.stopping,
        database_reachable=status.database_reachable,
        condition=status.condition,
        condition_since=status.condition_since,
        last_error=shown(status.last_error) if status.last_error else None,
        last_error_at=status.last_error_at,
        last_successful_poll=status.last_successful_poll,
        polling_strategy=status.polling_strategy,
        batch_size=status.batch_size,
        loop_restarts=status.loop_restarts,
        loop_lag_events=status.loop_lag_events,
        max_loop_lag_seconds=status.max_loop_lag,
        last_loop_lag_at=status.last_loop_lag_at,
        polling_interval=format_iso_duration(config.polling_interval),
        heartbeat_interval=format_iso_duration(config.heartbeat_interval),
        dead_after=format_iso_duration(config.dead_after),
        jobs=sorted(scheduler.jobs),
        running=[
            ExecutionView(
                task_name=e.task_name,
                task_instance=e.task_instance,
                execution_time=e.execution_time,
                started=e.started,
                version=e.version,
                fraction_dead=e.fraction_dead,
                failed_heartbeats=e.failed_heartbeats,
            )
            for e in status.running
        ],
    )


def _stored_view(definition: JobDefinition) -> JobView:
    """A job as the cluster's instances stored it (``ekbatan_jobs``)."""
    return JobView(
        name=definition.task_name,
        kind="recurring" if definition.kind == "recurring" else "one-time",
        schedule=definition.schedule,
        timeout=format_iso_duration(definition.timeout) if definition.timeout else None,
        max_concurrency=definition.max_concurrency,
        per_key=definition.keyed,
        running=0,
        timed_out_last_day=0,
        registered_here=False,
        app_version=definition.app_version,
        written_by=definition.written_by,
        written_at=definition.written_at,
        catch_up=definition.catch_up,
        missed_slots=definition.missed,
        caught_up_slots=definition.caught_up,
        skipped_slots=definition.skipped,
    )


def _own_view(scheduler: Scheduler, job_name: str, job: Job, stored: JobView | None) -> JobView:
    """A job registered here, as this instance runs it."""
    limits = scheduler.limits[job_name]
    recurring = isinstance(job, DistributedJob)
    schedule = scheduler.schedules[job_name].describe() if recurring else None
    own = scheduler.definitions.local[job_name].describe() if recurring else None
    return JobView(
        name=job_name,
        kind="recurring" if recurring else "one-time",
        schedule=schedule,
        timeout=format_iso_duration(limits.timeout) if limits.timeout else None,
        max_concurrency=limits.max_concurrency,
        per_key=limits.concurrency_key is not None,
        running=0,
        timed_out_last_day=0,
        registered_here=True,
        app_version=stored.app_version if stored is not None else scheduler.config.app_version,
        written_by=stored.written_by if stored is not None else None,
        written_at=stored.written_at if stored is not None else None,
        catch_up=job.catch_up().describe() if isinstance(job, DistributedJob) else None,
        overlap=job.overlap().describe()
        if isinstance(job, DistributedJob | PersistentScheduleJob)
        else None,
        own_schedule=own if own != schedule else None,
        missed_slots=stored.missed_slots if stored is not None else 0,
        caught_up_slots=stored.caught_up_slots if stored is not None else 0,
        skipped_slots=stored.skipped_slots if stored is not None else 0,
    )


@dataclass
class _Read:
    """What one read of the tasks got from the tables."""

    rows: list[ScheduledTask] = field(default_factory=list)
    pauses: dict[str, PauseInfo] = field(default_factory=dict)
    instances: list[InstanceInfo] = field(default_factory=list)
    kinds: dict[str, JobDefinition] = field(default_factory=dict)
    streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    """Consecutive missed slots of the rows' task instances (only where a streak goes on)."""
    now: datetime | None = None
    around: tuple[Holdings, Holdings] | None = None
    """What this instance held right before and right after the rows were read."""


class ReadModel:
    """The cluster as an operator reads it, through ``client`` (the web reads' own pool, the
    CLI's connection, or the scheduler's).

    ``scheduler`` is the scheduler running in this process, if any: it names the jobs
    registered here (a row of no such job is ``unresolved``), and the report judges its
    health. Without one (the CLI), no row counts as unresolved and a task's kind and
    schedule come from the jobs the cluster's instances stored (``ekbatan_jobs``).
    ``dead_after`` and ``overdue_after`` are the windows that judge a row ``dead`` or
    ``overdue`` (with a scheduler: its own)."""

    def __init__(
        self,
        client: SchedulerClient,
        *,
        dead_after: timedelta,
        overdue_after: timedelta,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.client = client
        self.scheduler = scheduler
        self.dead_after = dead_after
        self.overdue_after = overdue_after

    @classmethod
    def of(cls, client: SchedulerClient, scheduler: Scheduler) -> ReadModel:
        """The read model of ``scheduler``'s instance, reading through ``client``."""
        config = scheduler.config
        return cls(
            client,
            dead_after=config.dead_after,
            overdue_after=overdue_after(config.polling_interval),
            scheduler=scheduler,
        )

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The jobs registered here (none in the CLI)."""
        return self.scheduler.jobs if self.scheduler is not None else {}

    # -- the tasks -------------------------------------------------------------------------

    def _holdings(self) -> Holdings | None:
        return self.scheduler.holdings() if self.scheduler is not None else None

    async def _read(
        self,
        read: _Read,
        query: tuple[str | None, int, int],
        warnings: list[str],
        *,
        instances: bool,
    ) -> None:
        """Into ``read``: the rows of the page ``query`` (name, limit, offset; by execution
        time), the pauses, the instances (when asked for) and, last, the database's clock:
        every timestamp read before it is then at or before it (a heartbeat written between a
        clock read first and the rows showed a negative age). Raises what the reads raise."""
        name, limit, offset = query
        # what this instance held before the rows were read: a result recorded while they
        # were read shows as a row still picked, no longer held (not an orphaned claim)
        held = after = self._holdings()
        read.rows = await self.client.list(name, limit=limit, offset=offset)
        after = self._holdings()  # and right after
        if held is not None and after is not None:
            read.around = (held, after)
        read.pauses = await self.client.paused()
        if instances:
            try:
                read.instances = await self.client.instances()
            except SchemaMissingError as error:
                warnings.append(str(error))
        if self.scheduler is None and read.rows:
            read.kinds = await self.client.job_definitions()
        if read.rows:
            read.streaks = await self.client.missed_streaks({t.task_name for t in read.rows})
        read.now = await self.client.database_time()

    def task_view(
        self,
        task: ScheduledTask,
        now: datetime,
        *,
        include_task_data: bool = False,
        pause: PauseInfo | None = None,
        stored: JobDefinition | None = None,
        missed: int = 0,
    ) -> TaskView:
        """One row as every reader shows it; ``stored``: its job as the cluster stored it
        (where no scheduler runs here)."""
        job = self.jobs.get(task.task_name)
        age = heartbeat_age(task, now)
        kind: Literal["recurring", "one-time", "unknown"] = (
            "recurring"
            if isinstance(job, DistributedJob)
            else "one-time"
            if isinstance(job, OneTimeJob)
            else "unknown"
        )
        schedule = job.schedule().describe() if isinstance(job, DistributedJob) else None
        if job is None and stored is not None:
            kind = "recurring" if stored.kind == "recurring" else "one-time"
            schedule = stored.schedule
        return TaskView(
            name=task.task_name,
            instance=task.task_instance,
            kind=kind,
            schedule=schedule,
            state=derive_state(
                task,
                now,
                known=job is not None or self.scheduler is None,
                dead_after=self.dead_after,
                overdue_after=self.overdue_after,
                paused=pause is not None,
            ),
            paused=pause_view(pause) if pause is not None else None,
            execution_time=task.execution_time,
            picked=task.picked,
            picked_by=task.picked_by,
            last_heartbeat=task.last_heartbeat,
            heartbeat_age_seconds=age.total_seconds() if age is not None else None,
            fraction_dead=(age / self.dead_after) if age is not None else None,
            last_success=task.last_success,
            last_failure=task.last_failure,
            consecutive_failures=task.consecutive_failures,
            consecutive_missed_slots=missed,
            priority=task.priority,
            version=task.version,
            task_data=_task_data(task) if include_task_data else None,
        )

    def _views(self, read: _Read, include_task_data: bool) -> list[TaskView]:
        now = read.now
        if now is None:
            return []
        return [
            self.task_view(
                t,
                now,
                include_task_data=include_task_data,
                pause=read.pauses.get(t.task_name),
                stored=read.kinds.get(t.task_name),
                missed=read.streaks.get((t.task_name, t.task_instance), 0),
            )
            for t in read.rows
        ]

    @staticmethod
    def _paused(read: _Read, name: str | None) -> list[PauseView]:
        return [pause_view(p) for n, p in sorted(read.pauses.items()) if name is None or n == name]

    async def tasks(
        self,
        name: str | None = None,
        *,
        limit: int = 1000,
        offset: int = 0,
        include_task_data: bool = False,
    ) -> TaskPage:
        """A page of tasks (all, or those of ``name``) with their states and the pauses;
        raises what the reads raise (``ekbatan-jobs list``)."""
        read = _Read()
        await self._read(read, (name, limit, offset), [], instances=False)
        assert read.now is not None
        return TaskPage(
            database_time=read.now,
            tasks=self._views(read, include_task_data),
            paused=self._paused(read, name),
            next_offset=offset + limit if len(read.rows) == limit else None,
        )

    # -- the jobs, the instances, the history -----------------------------------------------

    async def job_views(self, name: str | None = None) -> list[JobView]:
        """Every job of the cluster (registered here, or in ``ekbatan_jobs`` by another
        instance), with the executions running now, those timed out in the last day, the
        slots its catch-up policy decided and the backfilled slots pending. Raises what the
        reads raise."""
        client = self.client
        definitions = await client.job_definitions()
        running = await client.running_counts()
        timed_out = await client.timed_out_counts()
        backfills = await client.backfill_counts()
        views = {n: _stored_view(d) for n, d in definitions.items()}
        if self.scheduler is not None:
            for job_name, job in self.scheduler.jobs.items():  # this instance's view wins
                views[job_name] = _own_view(self.scheduler, job_name, job, views.get(job_name))
        if self.scheduler is not None:
            for job_name, counts in (await client.schedule_counts()).items():
                if job_name in views:
                    views[job_name].schedules = counts
        for job_name, view in views.items():
            view.running = running.get(job_name, 0)
            view.timed_out_last_day = timed_out.get(job_name, 0)
            view.backfill_pending = backfills.get(job_name, 0)
        return [v for n, v in sorted(views.items()) if name is None or n == name]

    async def instance_views(self) -> list[InstanceView]:
        """The cluster's scheduler instances, with the age of what each last reported."""
        instances = await self.client.instances()
        now = await self.client.database_time()
        me = self.scheduler.name if self.scheduler is not None else None
        return [instance_view(i, now, me) for i in instances]

    async def history(
        self, name: str | None = None, *, limit: int = 50, before_id: int | None = None
    ) -> HistoryPage:
        """A page of executions, newest first (``next_before_id`` pages to older ones)."""
        records = await self.client.history(name, limit=limit, before_id=before_id)
        return HistoryPage(
            name=name,
            records=[history_record(r) for r in records],
            next_before_id=records[-1].id if len(records) == limit else None,
        )

    async def last_errors(self, tasks: list[TaskView]) -> dict[tuple[str, str], HistoryRecord]:
        """The latest failed execution of each failing task instance among ``tasks``, from
        the history (the dashboard's error messages): the last ``_HISTORY_DEPTH`` records of
        at most ``_MAX_FAILING_NAMES`` names."""
        names = list(dict.fromkeys(t.name for t in tasks if t.last_failure is not None))
        wanted = {(t.name, t.instance) for t in tasks if t.last_failure is not None}
        found: dict[tuple[str, str], HistoryRecord] = {}
        for name in names[:_MAX_FAILING_NAMES]:
            for record in (await self.history(name, limit=_HISTORY_DEPTH)).records:
                key = (record.task_name, record.task_instance)
                failed = record.outcome in (Outcome.FAILED, Outcome.PARKED)
                if failed and key in wanted and key not in found:
                    found[key] = record
        return found

    # -- the report of GET /jobs -----------------------------------------------------------

    async def _read_within(
        self,
        read: _Read,
        query: tuple[str | None, int, int],
        timeout: float,
        notes: tuple[list[str], list[str]],
    ) -> str | None:
        """``_read`` within ``timeout``: why it failed (a timeout, a refused connection), for
        the readiness rule, or None; a missing table is one of ``notes`` (problems,
        warnings). A failed read leaves no rows."""
        problems, warnings = notes
        failed: str | None = None
        try:
            async with asyncio.timeout(timeout):
                await self._read(read, query, warnings, instances=True)
        except TimeoutError:
            failed = f"database unreachable: no answer within {timeout:g}s"
        except SchemaMissingError as error:
            problems.append(str(error))
        except Exception as error:  # a probe answers 503 with the reason rather than 500
            failed = describe_failure(error, self.client.store.db.diagnose)
        if failed is not None:
            read.now = None
        if read.now is None:
            read.rows = []
        return failed

    async def report(
        self,
        name: str | None = None,
        *,
        limit: int = 1000,
        offset: int = 0,
        include_task_data: bool = False,
        timeout: float = 5.0,
        registered: Mapping[str, Job] | None = None,
    ) -> JobsReport:
        """``GET /jobs``: a page of tasks (all, or those of ``name``), the pauses, the live
        instances and the jobs, and the health of the cluster as this instance judges it.
        A read that fails or takes longer than ``timeout`` makes it unhealthy (or adds a
        warning while the scheduler's own connections get their answers); missing
        operations tables only add a warning. ``registered``: the application's jobs (by
        default the scheduler's)."""
        scheduler = self.scheduler
        assert scheduler is not None, "the report judges a running scheduler"
        problems: list[str] = []
        warnings: list[str] = []
        if not (registered if registered is not None else scheduler.jobs):
            warnings.append(
                "no job is registered on this instance: it runs nothing (ekbatan.jobs.modules, "
                "EKBATAN_JOBS__MODULES, names the modules of your @distributed_job classes)"
            )
        read = _Read()
        failed = await self._read_within(read, (name, limit, offset), timeout, (problems, warnings))
        now = read.now
        tasks = self._views(read, include_task_data)
        view = _scheduler_view(scheduler)
        if failed is not None:
            # Readiness follows the scheduler's own link to the database: a report that could
            # not be read (a slow read, the reads' own pool refused) while the scheduler's
            # loops get their answers says so, and stays healthy.
            if view.condition == "ok" and view.database_reachable:
                warnings.append(
                    f"this report could not read the table ({failed}); the scheduler's own "
                    "connections get their answers (condition ok)"
                )
            else:
                problems.append(failed)
        for task in tasks:
            if task.state == "dead":
                problems.append(
                    f"{task.name}/{task.instance} is dead: picked by {task.picked_by}, last "
                    f"heartbeat {_age(task.heartbeat_age_seconds)}; it will be revived and run "
                    "again"
                )
        jobs: list[JobView] = []
        if now is not None:
            try:
                async with asyncio.timeout(timeout):
                    jobs = await self.job_views(name)
            except TimeoutError:
                warnings.append(f"the job summary could not be read: no answer within {timeout:g}s")
            except Exception as error:
                warnings.append(f"the job summary could not be read: {describe_failure(error)}")
        problems += self._orphans(tasks, read.instances, now, read.around)
        problems += self._condition(view)
        return JobsReport(
            healthy=not problems,
            problems=problems,
            database_time=now,
            scheduler=view,
            tasks=tasks,
            paused=self._paused(read, name),
            instances=[instance_view(i, now, view.name) for i in read.instances],
            jobs=jobs,
            warnings=warnings,
            next_offset=offset + limit if now is not None and len(read.rows) == limit else None,
        )

    def _orphans(
        self,
        tasks: list[TaskView],
        instances: list[InstanceInfo],
        now: datetime | None,
        around: tuple[Holdings, Holdings] | None,
    ) -> list[str]:
        """Rows picked by a live instance that does not run them (a claim whose answer it
        never saw): this instance knows what it runs; another live instance that reported
        itself well after it last heartbeated the row does not run it either. Such a row is
        released by its instance within about one heartbeat interval, or revived after the
        dead window."""
        scheduler = self.scheduler
        if now is None or around is None or scheduler is None:
            return []
        held, now_held = around
        # A claim answered while the rows were read (or still in flight) has rows picked by
        # this instance that are no orphans: judged at the next report.
        judge_own = held.settled_since(now_held)
        grace = 2 * scheduler.config.heartbeat_interval
        seen = {i.name: i.last_seen for i in instances if i.alive}
        found = []
        for task in tasks:
            if task.state != "running" or task.last_heartbeat is None:
                continue
            if now - task.last_heartbeat <= grace:
                continue
            who = self._orphaned_by(task, seen, grace, held if judge_own else None, now_held)
            if who is not None:
                found.append(
                    f"{task.name}/{task.instance} is picked by {who}, which does not run it (no "
                    f"heartbeat for {_age(task.heartbeat_age_seconds)}): an orphaned claim; it "
                    "is released within a heartbeat interval, or revived after the dead window"
                )
        return found

    def _orphaned_by(
        self,
        task: TaskView,
        seen: dict[str, datetime],
        grace: timedelta,
        held: Holdings | None,
        now_held: Holdings,
    ) -> str | None:
        """Who holds ``task`` (running, its heartbeat older than ``grace``) without running
        it: this instance, when it runs no such execution (``held`` None: not judged now), or
        a live instance that reported itself well after the row's last heartbeat."""
        assert self.scheduler is not None and task.last_heartbeat is not None
        if task.picked_by == self.scheduler.name:
            key = (task.name, task.instance)
            if held is None or key in held.keys or key in now_held.keys:
                return None
            return "this instance"
        if task.picked_by in seen and seen[task.picked_by] - task.last_heartbeat > grace:
            return f"the live instance {task.picked_by}"
        return None

    def _condition(self, view: SchedulerView) -> list[str]:
        """This instance's loops have been failing for longer than two polling intervals."""
        since = view.condition_since
        if view.condition in ("ok", "unknown") or since is None or self.scheduler is None:
            return []
        if self.scheduler.db_time() - since < self.overdue_after:
            return []
        return [
            f"scheduler {view.name}: {view.condition} since {since.isoformat()}: {view.last_error}"
        ]


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s ago"
