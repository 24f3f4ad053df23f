"""Building the ``/jobs`` report: every row with its derived state (the rules are the
domain's, ``ekbatan_fastapi.domain.tasks``), the pauses, the instances, and the cluster's
health. The dead-after window is this instance's ``heartbeat_interval x
missed_heartbeats_limit``: every instance is expected to share them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.exc import DBAPIError

from ..domain.codec import TaskDataError
from ..domain.durations import format_iso_duration
from ..domain.errors import DatabaseUnavailable, SchemaMissingError
from ..domain.job import DistributedJob, Job, OneTimeJob
from ..domain.records import ExecutionRecord, InstanceInfo, PauseInfo
from ..domain.tasks import ScheduledTask, derive_state, heartbeat_age, overdue_after
from ..domain.text import redact
from ..engine.running import Holdings
from ..store.database import Diagnosis
from .state import EkbatanState
from .views import (
    ExecutionView,
    HistoryRecord,
    InstanceView,
    JobsReport,
    JobView,
    PauseView,
    SchedulerView,
    TaskView,
)

Diagnose = Callable[[BaseException], Diagnosis]

__all__ = [
    "build_report",
    "describe_failure",
    "history_record",
    "instance_view",
    "job_views",
    "pause_view",
    "scheduler_view",
    "task_view",
]


def describe_failure(error: BaseException, diagnose: Diagnose | None = None) -> str:
    """What a failed read of the tasks means: the database's diagnosis (``unreachable``,
    ``read-only``, a pooler mismatch, ...) for driver and connection errors, else what
    failed."""
    if isinstance(error, DatabaseUnavailable):  # it names where already
        return redact(str(error))
    if diagnose is not None and isinstance(error, DBAPIError | OSError):
        return redact(diagnose(error).message)
    what = redact(f"{type(error).__name__}: {error}")
    if isinstance(error, DBAPIError | OSError):
        return f"database unreachable: {what}"
    return f"cannot read the tasks: {what}"


def _task_data(task: ScheduledTask) -> Any:
    if task.task_data is None:
        return None
    try:
        return task.data
    except TaskDataError:
        return f"<{len(task.task_data)} bytes, not JSON>"


def pause_view(pause: PauseInfo) -> PauseView:
    return PauseView(
        name=pause.task_name,
        paused_by=pause.paused_by,
        paused_at=pause.paused_at,
        reason=pause.reason,
    )


def instance_view(instance: InstanceInfo, now: datetime | None, me: str) -> InstanceView:
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
        error_message=redact(record.error_message) if record.error_message else None,
    )


def task_view(
    task: ScheduledTask,
    now: datetime,
    state: EkbatanState,
    *,
    include_task_data: bool,
    pause: PauseInfo | None = None,
) -> TaskView:
    config = state.registry.config
    job = state.registry.jobs.get(task.task_name)
    age = heartbeat_age(task, now)
    return TaskView(
        name=task.task_name,
        instance=task.task_instance,
        kind=(
            "recurring"
            if isinstance(job, DistributedJob)
            else "one-time"
            if isinstance(job, OneTimeJob)
            else "unknown"
        ),
        schedule=job.schedule().describe() if isinstance(job, DistributedJob) else None,
        state=derive_state(
            task,
            now,
            known=job is not None,
            dead_after=config.dead_after,
            overdue_after=overdue_after(config.polling_interval),
            paused=pause is not None,
        ),
        paused=pause_view(pause) if pause is not None else None,
        execution_time=task.execution_time,
        picked=task.picked,
        picked_by=task.picked_by,
        last_heartbeat=task.last_heartbeat,
        heartbeat_age_seconds=age.total_seconds() if age is not None else None,
        fraction_dead=(age / config.dead_after) if age is not None else None,
        last_success=task.last_success,
        last_failure=task.last_failure,
        consecutive_failures=task.consecutive_failures,
        priority=task.priority,
        version=task.version,
        task_data=_task_data(task) if include_task_data else None,
    )


def scheduler_view(state: EkbatanState) -> SchedulerView:
    status = state.registry.status()
    config = state.registry.config
    return SchedulerView(
        name=status.name,
        started_at=status.started_at,
        ready=status.ready,
        stopping=status.stopping,
        database_reachable=status.database_reachable,
        condition=status.condition,
        condition_since=status.condition_since,
        last_error=redact(status.last_error) if status.last_error else None,
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
        jobs=sorted(state.registry.jobs),
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


async def build_report(
    state: EkbatanState,
    *,
    name: str | None = None,
    limit: int = 1000,
    offset: int = 0,
    include_task_data: bool = False,
    timeout: float = 5.0,
) -> JobsReport:
    """Read the table (all rows, or those of ``name``), the pauses and the live instances,
    and judge the cluster's health. Missing operations tables only add a warning."""
    problems: list[str] = []
    warnings: list[str] = []
    if not state.jobs:
        warnings.append(
            "no job is registered on this instance: it runs nothing (ekbatan.jobs.modules, "
            "EKBATAN_JOBS__MODULES, names the modules of your @distributed_job classes)"
        )
    now: datetime | None = None
    tasks: list[TaskView] = []
    pauses: dict[str, PauseInfo] = {}
    instances: list[InstanceInfo] = []
    # what this instance held before the rows were read: a result recorded while they were
    # read shows as a row still picked, no longer held (not an orphaned claim)
    held = after = state.registry.scheduler.holdings()
    try:
        async with asyncio.timeout(timeout):
            rows = await state.client.list(name, limit=limit, offset=offset)
            after = state.registry.scheduler.holdings()  # and right after
            pauses = await state.client.paused()
            try:
                instances = await state.client.instances()
            except SchemaMissingError as error:
                warnings.append(str(error))
            # The clock last: every timestamp read above is then at or before it (a heartbeat
            # written between a clock read first and the rows showed a negative age).
            now = await state.client.database_time()
    except TimeoutError:
        problems.append(f"database unreachable: no answer within {timeout:g}s")
    except SchemaMissingError as error:
        problems.append(str(error))
    except Exception as error:  # a probe answers 503 with the reason rather than 500
        problems.append(describe_failure(error, state.registry.store.db.diagnose))
    else:
        tasks = [
            task_view(
                t,
                now,
                state,
                include_task_data=include_task_data,
                pause=pauses.get(t.task_name),
            )
            for t in rows
        ]
    for task in tasks:
        if task.state == "dead":
            problems.append(
                f"{task.name}/{task.instance} is dead: picked by {task.picked_by}, last "
                f"heartbeat {_age(task.heartbeat_age_seconds)}; it will be revived and run again"
            )
    jobs = await job_views(state, name, warnings) if now is not None else []
    problems += _orphans(state, tasks, instances, now, (held, after))
    scheduler = scheduler_view(state)
    problems += _condition(state, scheduler)
    return JobsReport(
        healthy=not problems,
        problems=problems,
        database_time=now,
        scheduler=scheduler,
        tasks=tasks,
        paused=[pause_view(p) for n, p in sorted(pauses.items()) if name is None or n == name],
        instances=[instance_view(i, now, scheduler.name) for i in instances],
        jobs=jobs,
        warnings=warnings,
    )


async def job_views(state: EkbatanState, name: str | None, warnings: list[str]) -> list[JobView]:
    """Every job of the cluster (registered here, or in ``ekbatan_jobs`` by another instance),
    with the executions running now, those timed out in the last day, the slots its catch-up
    policy decided and the backfilled slots pending. What cannot be read only adds a warning."""
    client = state.client
    try:
        definitions = await client.job_definitions()
        running = await client.running_counts()
        timed_out = await client.timed_out_counts()
        backfills = await client.backfill_counts()
    except Exception as error:
        warnings.append(f"the job summary could not be read: {describe_failure(error)}")
        return []
    views: dict[str, JobView] = {}
    for task_name, definition in definitions.items():
        views[task_name] = JobView(
            name=task_name,
            kind="recurring" if definition.kind == "recurring" else "one-time",
            schedule=definition.schedule,
            timeout=format_iso_duration(definition.timeout) if definition.timeout else None,
            max_concurrency=definition.max_concurrency,
            per_key=definition.keyed,
            running=running.get(task_name, 0),
            timed_out_last_day=timed_out.get(task_name, 0),
            registered_here=False,
            app_version=definition.app_version,
            catch_up=definition.catch_up,
            missed_slots=definition.missed,
            caught_up_slots=definition.caught_up,
            skipped_slots=definition.skipped,
            backfill_pending=backfills.get(task_name, 0),
        )
    for job_name, job in state.registry.jobs.items():  # this instance's own view wins
        views[job_name] = _own_view(state, job_name, job, views.get(job_name))
        views[job_name].running = running.get(job_name, 0)
        views[job_name].timed_out_last_day = timed_out.get(job_name, 0)
        views[job_name].backfill_pending = backfills.get(job_name, 0)
    return [v for n, v in sorted(views.items()) if name is None or n == name]


def _own_view(state: EkbatanState, job_name: str, job: Job, stored: JobView | None) -> JobView:
    """A job registered here, as this instance runs it."""
    scheduler = state.registry.scheduler
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
        app_version=stored.app_version if stored is not None else state.registry.config.app_version,
        catch_up=job.catch_up().describe() if isinstance(job, DistributedJob) else None,
        own_schedule=own if own != schedule else None,
        missed_slots=stored.missed_slots if stored is not None else 0,
        caught_up_slots=stored.caught_up_slots if stored is not None else 0,
        skipped_slots=stored.skipped_slots if stored is not None else 0,
    )


def _orphans(
    state: EkbatanState,
    tasks: list[TaskView],
    instances: list[InstanceInfo],
    now: datetime | None,
    around: tuple[Holdings, Holdings],
) -> list[str]:
    """Rows picked by a live instance that does not run them (a claim whose answer it never
    saw): this instance knows what it runs; another live instance that reported itself well
    after it last heartbeated the row does not run it either. Such a row is released by its
    instance within about one heartbeat interval, or revived after the dead window."""
    if now is None:
        return []
    scheduler = state.registry.scheduler
    held, now_held = around
    # A claim answered while the rows were read (or still in flight) has rows picked by this
    # instance that are no orphans: judged at the next report.
    judge_own = held.settled_since(now_held)
    grace = 2 * state.registry.config.heartbeat_interval
    seen = {i.name: i.last_seen for i in instances if i.alive}
    found = []
    for task in tasks:
        if task.state != "running" or task.last_heartbeat is None:
            continue
        if now - task.last_heartbeat <= grace:
            continue
        if task.picked_by == scheduler.name:
            key = (task.name, task.instance)
            if not judge_own or key in held.keys or key in now_held.keys:
                continue
            who = "this instance"
        elif task.picked_by in seen and seen[task.picked_by] - task.last_heartbeat > grace:
            who = f"the live instance {task.picked_by}"
        else:
            continue
        found.append(
            f"{task.name}/{task.instance} is picked by {who}, which does not run it (no "
            f"heartbeat for {_age(task.heartbeat_age_seconds)}): an orphaned claim; it is "
            "released within a heartbeat interval, or revived after the dead window"
        )
    return found


def _condition(state: EkbatanState, scheduler: SchedulerView) -> list[str]:
    """This instance's loops have been failing for longer than two polling intervals."""
    since = scheduler.condition_since
    if scheduler.condition in ("ok", "unknown") or since is None:
        return []
    lasting = overdue_after(state.registry.config.polling_interval)
    if state.registry.scheduler.db_time() - since < lasting:
        return []
    return [
        f"scheduler {scheduler.name}: {scheduler.condition} since {since.isoformat()}: "
        f"{scheduler.last_error}"
    ]


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s ago"
