"""``run_job``: one execution of a job with a real ``ExecutionContext``, without a scheduler.

Without a database nothing is written anywhere: the job's ``execute`` runs once with the slot,
data and heartbeat state given. With ``database=`` the execution is a real claim of its row in
``scheduled_tasks`` (inserted if missing), ``ctx.transaction()`` commits the job's effects with
the slot's completion on that database, and the result and its history are recorded as the
scheduler records them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..domain.backfill import backfill_instance
from ..domain.codec import encode_task_data
from ..domain.context import (
    ExecutionContext,
    HeartbeatState,
    TransactionOpener,
    execution_context,
)
from ..domain.errors import ConfigurationError
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job, OneTimeJob, data_model_of
from ..domain.rows import NewTask
from ..engine.config import SchedulerConfig
from ..engine.execution import Execution
from ..engine.transaction import SlotTransaction
from ..registry import JobRegistry, SchedulerBuilder, job_registry

__all__ = ["DEFAULT_INSTANCE", "run_job"]

DEFAULT_INSTANCE = "test"
"""The ``task_instance`` of a one-time job's execution when ``run_job`` is given none."""

Flag = bool | Callable[[], bool]


def _flag(value: Flag) -> Callable[[], bool]:
    return value if callable(value) else (lambda: bool(value))


def _instance(job: Job, instance: str | None, slot: datetime, is_backfill: bool) -> str:
    if instance is not None:
        return instance
    if isinstance(job, DistributedJob):
        return backfill_instance(slot) if is_backfill else RECURRING_INSTANCE
    return DEFAULT_INSTANCE


def _no_database(label: str) -> TransactionOpener:
    def refuse(target: Any = None) -> Any:
        raise ConfigurationError(
            f"{label}: ctx.transaction() needs the jobs database, and run_job was given "
            "none: pass run_job(job, database=...) with a database URL or AsyncEngine whose "
            "jobs tables exist (e.g. the ekbatan_database_url fixture of "
            "ekbatan_fastapi.testing.pytest_plugin)"
        )

    return refuse


async def _execute(job: Job, ctx: ExecutionContext) -> None:
    """``async def execute`` on this loop; a plain ``def`` in a worker thread (as scheduled)."""
    if job.is_async:
        await job.execute(ctx)  # type: ignore[misc]
    else:
        await asyncio.to_thread(job.execute, ctx)


async def run_job(
    job: Job,
    *,
    data: Any = None,
    execution_time: datetime | None = None,
    instance: str | None = None,
    heartbeat: HeartbeatState | None = None,
    shutting_down: Flag = False,
    timed_out: Flag = False,
    consecutive_failures: int = 0,
    version: int = 1,
    picked_by: str = "ekbatan-testing",
    is_backfill: bool = False,
    database: str | URL | AsyncEngine | None = None,
    dialect: str | None = None,
) -> ExecutionContext:
    """Run ``job.execute`` once and return the context it was given; an exception the job
    raises propagates unchanged.

    * ``data``: the task data (``ctx.data``), JSON-encoded and decoded as the scheduler does;
      for a typed job (``OneTimeJob[Invoice]``) a dict of the model's fields or the model,
      validated as ``client.schedule`` validates it (``TaskDataInvalid`` names the fields
      that do not fit), and ``ctx.data`` is the model instance, as in production;
    * ``execution_time``: the slot (``ctx.execution_time``; default: now, UTC);
    * ``instance``: ``ctx.task_instance`` (default: ``recurring`` for a recurring job, its
      backfill instance with ``is_backfill``, ``test`` for a one-time job);
    * ``heartbeat``: the ``HeartbeatState`` the job sees (e.g. with ``failed_heartbeats=2``);
    * ``shutting_down`` / ``timed_out``: what ``ctx.is_shutting_down`` / ``ctx.is_timed_out``
      answer: a bool, or a callable asked each time (flip it while the job runs);
    * ``database``: a URL or AsyncEngine of a database with the jobs tables: the execution
      claims its row there (``version`` and ``picked_by`` are then the claim's),
      ``ctx.transaction()`` commits on it, and the result and history are recorded. Without
      one, ``ctx.transaction()`` raises a ``ConfigurationError`` that says so.
    """
    slot = execution_time if execution_time is not None else datetime.now(UTC)
    if slot.tzinfo is None:
        raise ConfigurationError(
            f"execution_time must be an aware datetime, got {slot!r}; e.g. "
            "datetime(2026, 1, 2, 2, 0, tzinfo=UTC)"
        )
    if not isinstance(job, DistributedJob | OneTimeJob):
        raise ConfigurationError(
            f"run_job takes a DistributedJob or OneTimeJob instance, got {job!r}"
        )
    name = job.name()
    task_instance = _instance(job, instance, slot, is_backfill)
    # Through the typed job's model as client.schedule does (a dict or the model; what does
    # not fit raises TaskDataInvalid here), then decoded into it by ctx.data as in production.
    model = data_model_of(job)
    task_data = encode_task_data(model, data, where=f"{name}/{task_instance}")
    if heartbeat is None:
        defaults = SchedulerConfig()
        heartbeat = HeartbeatState(defaults.heartbeat_interval, defaults.dead_after)
    ctx = execution_context(
        task_name=name,
        task_instance=task_instance,
        execution_time=slot,
        picked_by=picked_by,
        version=version,
        task_data=task_data,
        heartbeat_state=heartbeat,
        consecutive_failures=consecutive_failures,
        shutting_down=_flag(shutting_down),
        timed_out=_flag(timed_out),
        transactions=_no_database(f"{name}/{task_instance}"),
        is_backfill=is_backfill,
        data_model=model,
    )
    if database is None:
        await _execute(job, ctx)
        return ctx
    registry = _registry(job, database, picked_by, dialect)
    try:
        await _run_claimed(registry, job, ctx)
    finally:
        await registry.connection.dispose()
    return ctx


def _registry(
    job: Job, database: str | URL | AsyncEngine, picked_by: str, dialect: str | None
) -> JobRegistry:
    def configure(b: SchedulerBuilder) -> None:
        b.listen(False).scheduler_name(picked_by)
        if dialect is not None:
            b.dialect(dialect)

    return (
        job_registry()
        .connection_provider(database)
        .with_job(job)
        .customize_scheduler(configure)
        .build()
    )


async def _run_claimed(registry: JobRegistry, job: Job, ctx: ExecutionContext) -> None:
    """Claim the execution's row, run the job with ``ctx.transaction()`` on the database,
    record the result as the scheduler would (unless the transaction did), re-raise."""
    store, scheduler = registry.store, registry.scheduler
    await scheduler.recorder.check()
    task = NewTask(ctx.task_name, ctx.task_instance, ctx.execution_time, ctx.task_data)
    await store.tasks.upsert(task, replace=True)
    row = await store.tasks.claim_now(ctx.task_name, ctx.task_instance, ctx.picked_by)
    if row is None:
        raise ConfigurationError(
            f"{ctx.task_name}/{ctx.task_instance} is picked by another execution in this "
            "database (a scheduler running it, or a run left unfinished): run_job needs an "
            "unpicked row; use a fresh test database"
        )
    now = await store.tasks.db_now()
    scheduler.link.observed(now)
    execution = Execution(
        row, job, ctx.heartbeat_state, now, schedule=scheduler.definitions.schedule(ctx.task_name)
    )
    execution.slot = ctx.execution_time
    execution.backfill = ctx.is_backfill
    ctx.version, ctx.picked_by = row.version, row.picked_by or ctx.picked_by
    ctx.transactions = SlotTransaction(
        execution,
        tasks=store.tasks,
        operations=store.operations,
        history=scheduler.recorder,
        config=registry.config,
        link=scheduler.link,
        observer=scheduler.observer,
    )
    error: Exception | None = None
    try:
        await _execute(job, ctx)
    except Exception as exc:
        error = exc
    if execution.settled is None:
        await _record(registry, execution, error)
    if error is not None:
        raise error


async def _record(registry: JobRegistry, execution: Execution, error: Exception | None) -> None:
    """The completion and history the completer would write."""
    store, recorder = registry.store, registry.scheduler.recorder
    execution.error = error
    execution.finished_at = await store.tasks.db_now()
    finish = execution.finish(
        execution.finished_at,
        error=error,
        cancelled=False,
        fallback_delay=registry.config.polling_interval,
    )
    inline = store.tasks.writes_history_with_finish and recorder.enabled
    history = [execution.record(finish)] if inline else []
    recorded = await store.tasks.finish(
        [finish], history=history, picked_by=execution.row.picked_by
    )
    if recorder.enabled and not inline:
        ok = execution.row.key in recorded
        await store.operations.insert_history([execution.record(finish, ok)])
