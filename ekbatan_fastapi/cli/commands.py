"""The commands of ``ekbatan-jobs``: each reads or changes the tables through the same client
as the application (``SchedulerClient``, without a scheduler), and reports through
``Output``."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime

from ..domain.durations import format_iso_duration
from ..domain.errors import ScheduleError
from ..domain.schedules import parse_schedule
from ..domain.tasks import paused_message
from ..store.migrate import migrate, migrations_folder
from .context import EXIT, CliError, Context
from .output import row_view
from .planning import cmd_backfill, cmd_plan

__all__ = ["COMMANDS"]


async def _require_task(ctx: Context, name: str) -> None:
    """A task is known when the table has a row of it, it is paused, or it has history."""
    if not await ctx.client.is_known(name):
        raise CliError(
            EXIT.UNKNOWN_TASK,
            f"unknown task {name!r}: the table has no row, pause or history of it "
            "(`ekbatan-jobs list` shows the tasks)",
        )


async def _require_task_row(ctx: Context, name: str, instance: str) -> None:
    if await ctx.client.get(name, instance) is None:
        if await ctx.client.list(name, limit=1):
            raise CliError(EXIT.UNKNOWN_TASK, f"task {name} has no instance {instance!r}")
        raise CliError(
            EXIT.UNKNOWN_TASK,
            f"unknown task {name!r}: the table has no row of it (`ekbatan-jobs list` shows them)",
        )


def _operator() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:200]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


async def cmd_migrate(ctx: Context) -> None:
    results = await migrate(ctx.provider.engine, ctx.dialect, dry_run=ctx.args.dry_run)
    folder = migrations_folder(ctx.dialect)
    for result in results:
        if result.checksum_changed:
            ctx.out.warn(
                f"V{result.version:04d} has changed since it was applied (checksum differs); "
                "it is not applied again"
            )
    ctx.out.table(
        [
            {"version": f"V{r.version:04d}", "description": r.description, "status": r.status}
            for r in results
        ],
        json_value={
            "dialect": ctx.dialect,
            "folder": folder,
            "dry_run": ctx.args.dry_run,
            "migrations": [r.as_dict() for r in results],
        },
        title=f"migrations/{folder} on {ctx.safe_url()}"
        + (" (dry run)" if ctx.args.dry_run else ""),
    )


async def cmd_list(ctx: Context) -> None:
    rows = await ctx.client.list(ctx.args.task, limit=ctx.args.limit)
    paused = await ctx.client.paused()
    now = await ctx.client.database_time()  # last: every time read above is at or before it
    views = [
        row_view(r, now, paused.get(r.task_name), ctx.dead_after, ctx.overdue_after) for r in rows
    ]
    ctx.out.table(
        views,
        json_value={"database_time": now.isoformat(), "tasks": views},
        columns=(
            "task_name",
            "task_instance",
            "state",
            "execution_time",
            "picked_by",
            "heartbeat_age",
            "last_success",
            "last_failure",
            "consecutive_failures",
        ),
    )


async def cmd_history(ctx: Context) -> None:
    if ctx.args.task is not None:
        await _require_task(ctx, ctx.args.task)
    records = await ctx.client.history(
        ctx.args.task, limit=ctx.args.limit, before_id=ctx.args.before
    )
    views = [
        {
            "id": r.id,
            "task_name": r.task_name,
            "task_instance": r.task_instance,
            "execution_time": r.execution_time.isoformat(),
            "picked_by": r.picked_by,
            "started_at": r.started_at.isoformat(),
            "finished_at": r.finished_at.isoformat(),
            "duration_seconds": round(r.duration_seconds, 6),
            "outcome": r.outcome,
            "error_class": r.error_class,
            "error_message": r.error_message,
        }
        for r in records
    ]
    ctx.out.table(
        views,
        json_value={"history": views},
        columns=(
            "id",
            "task_name",
            "task_instance",
            "execution_time",
            "picked_by",
            "duration_seconds",
            "outcome",
            "error_class",
            "error_message",
        ),
    )


async def cmd_pause(ctx: Context) -> None:
    name = ctx.args.task
    await _require_task(ctx, name)
    by = ctx.args.by or _operator()
    await ctx.client.pause(name, ctx.args.reason, paused_by=by)
    ctx.out.done(
        f"paused {name} (by {by}: {ctx.args.reason})",
        {"task": name, "paused": True, "paused_by": by, "reason": ctx.args.reason},
    )


async def cmd_resume(ctx: Context) -> None:
    name = ctx.args.task
    await _require_task(ctx, name)
    skipped_to: datetime | None = None
    if ctx.args.skip_missed:
        schedule = None
        if ctx.args.schedule:
            try:
                schedule = parse_schedule(ctx.args.schedule)
            except ScheduleError as error:
                raise CliError(EXIT.USAGE, f"--schedule: {error}") from None
        skipped_to = await ctx.client.skip_missed(name, schedule)
    resumed = await ctx.client.resume(name)
    message = f"resumed {name}" if resumed else f"{name} was not paused"
    if skipped_to is not None:
        message += f"; its overdue slot was skipped, next run {skipped_to.isoformat()}"
    ctx.out.done(
        message,
        {"task": name, "resumed": resumed, "next_execution_time": _iso(skipped_to)},
    )


async def cmd_run_now(ctx: Context) -> None:
    name, instance = ctx.args.task, ctx.args.instance
    await _require_task_row(ctx, name, instance)
    pause = (await ctx.client.paused()).get(name)
    if pause is not None and not ctx.args.force:
        raise CliError(EXIT.CONFLICT, paused_message(name, pause, "--force"))
    claimed_by = await ctx.client.run_now(
        name, instance, force=ctx.args.force, wait=ctx.args.wait, force_hint="--force"
    )
    if pause is None:
        ctx.out.done(
            f"{name}/{instance} is due now; a running instance claims it at its next poll",
            {"task": name, "instance": instance, "due_now": True, "forced": False},
        )
        return
    ctx.out.done(
        f"{name}/{instance} was claimed by {claimed_by}; the task stays paused",
        {
            "task": name,
            "instance": instance,
            "due_now": True,
            "forced": True,
            "claimed_by": claimed_by,
        },
    )


async def cmd_jobs(ctx: Context) -> None:
    """The cluster's jobs as their instances registered them (``ekbatan_jobs``), with the
    executions running now and those timed out in the last day."""
    definitions = await ctx.client.job_definitions()
    if not definitions and not await ctx.store.jobs.look():
        ctx.out.warn(
            "the job definitions table (ekbatan_jobs) is missing: run `ekbatan-jobs migrate`"
        )
    running = await ctx.client.running_counts()
    timed_out = await ctx.client.timed_out_counts()
    views = [
        {
            "name": d.task_name,
            "kind": d.kind,
            "schedule": d.schedule,
            "timeout": format_iso_duration(d.timeout) if d.timeout is not None else None,
            "max_concurrency": d.max_concurrency,
            "per_key": d.keyed,
            "running": running.get(d.task_name, 0),
            "timed_out_last_day": timed_out.get(d.task_name, 0),
            "app_version": d.app_version,
            "written_by": d.written_by,
            "written_at": d.written_at.isoformat(),
            "catch_up": d.catch_up,
            "missed_slots": d.missed,
            "caught_up_slots": d.caught_up,
            "skipped_slots": d.skipped,
        }
        for d in sorted(definitions.values(), key=lambda d: d.task_name)
    ]
    ctx.out.table(
        views,
        json_value={"jobs": views},
        columns=(
            "name",
            "kind",
            "schedule",
            "timeout",
            "max_concurrency",
            "running",
            "timed_out_last_day",
            "catch_up",
            "skipped_slots",
            "app_version",
        ),
    )


async def cmd_instances(ctx: Context) -> None:
    views = [
        {
            "name": i.name,
            "host": i.host,
            "pid": i.pid,
            "started_at": i.started_at.isoformat(),
            "last_seen": i.last_seen.isoformat(),
            "library_version": i.library_version,
            "alive": i.alive,
        }
        for i in await ctx.client.instances()
    ]
    ctx.out.table(views, json_value={"instances": views})


COMMANDS: dict[str, Callable[[Context], Awaitable[None]]] = {
    "migrate": cmd_migrate,
    "list": cmd_list,
    "history": cmd_history,
    "run-now": cmd_run_now,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "instances": cmd_instances,
    "jobs": cmd_jobs,
    "plan": cmd_plan,
    "backfill": cmd_backfill,
}
