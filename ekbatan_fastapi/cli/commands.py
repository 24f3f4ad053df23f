"""The commands of ``ekbatan-jobs``: each reads or changes the tables through the same client
as the application (``SchedulerClient``, without a scheduler), and reports through
``Output``."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime

from ..client.views import CancelRunningResult, PauseResult, ResumeResult, RunNowResult
from ..domain.errors import ScheduleError
from ..domain.schedules import parse_schedule
from ..domain.tasks import paused_message
from ..store.migrate import migrate, migrations_folder
from .context import EXIT, CliError, Context
from .planning import cmd_backfill, cmd_plan
from .schedules import cmd_schedules

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
    page = await ctx.reads.tasks(ctx.args.task, limit=ctx.args.limit, offset=ctx.args.offset)
    value = page.model_dump(mode="json")
    ctx.out.table(
        value["tasks"],
        json_value=value,
        columns=(
            "name",
            "instance",
            "state",
            "execution_time",
            "picked_by",
            "heartbeat_age_seconds",
            "last_success",
            "last_failure",
            "consecutive_failures",
            "consecutive_missed_slots",
        ),
    )
    if page.next_offset is not None and not ctx.out.json_mode:
        ctx.out.warn(f"more rows follow: --offset {page.next_offset} shows the next page")


async def cmd_history(ctx: Context) -> None:
    if ctx.args.task is not None:
        await _require_task(ctx, ctx.args.task)
    page = await ctx.reads.history(ctx.args.task, limit=ctx.args.limit, before_id=ctx.args.before)
    value = page.model_dump(mode="json")
    ctx.out.table(
        value["records"],
        json_value=value,
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
    if page.next_before_id is not None and not ctx.out.json_mode:
        ctx.out.warn(f"older executions follow: --before {page.next_before_id} shows them")


async def cmd_pause(ctx: Context) -> None:
    name = ctx.args.task
    await _require_task(ctx, name)
    by = ctx.args.by or _operator()
    await ctx.client.pause(name, ctx.args.reason, paused_by=by)
    info = (await ctx.client.paused()).get(name)
    if info is None:  # resumed by someone else in between
        raise CliError(EXIT.CONFLICT, f"{name!r} was resumed meanwhile; pause it again")
    detail = f"paused {name} (by {by}: {ctx.args.reason})"
    result = PauseResult(
        name=name,
        paused_by=info.paused_by,
        paused_at=info.paused_at,
        reason=info.reason,
        detail=detail,
    )
    ctx.out.done(detail, result.model_dump(mode="json"))


async def cmd_cancel(ctx: Context) -> None:
    name, instance = ctx.args.task, ctx.args.instance
    by = ctx.args.by or _operator()
    reason = ctx.args.reason or None
    running_on = await ctx.client.cancel_running(name, instance, reason, requested_by=by)
    detail = f"asked {running_on} to stop {name}/{instance} (within one heartbeat interval)"
    result = CancelRunningResult(
        name=name,
        instance=instance,
        running_on=running_on,
        requested_by=by,
        reason=reason,
        detail=detail,
    )
    ctx.out.done(detail, result.model_dump(mode="json"))


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
    detail = f"resumed {name}" if resumed else f"{name} was not paused"
    if skipped_to is not None:
        detail += f"; its overdue slot was skipped, next run {skipped_to.isoformat()}"
    result = ResumeResult(
        name=name,
        resumed=resumed,
        skip_missed=ctx.args.skip_missed,
        detail=detail,
        next_execution_time=skipped_to,
    )
    ctx.out.done(detail, result.model_dump(mode="json"))


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
        detail = f"{name}/{instance} is due now; a running instance claims it at its next poll"
        result = RunNowResult(name=name, instance=instance, detail=detail)
    else:
        detail = f"{name}/{instance} was claimed by {claimed_by}; the task stays paused"
        result = RunNowResult(
            name=name, instance=instance, detail=detail, forced=True, claimed_by=claimed_by
        )
    ctx.out.done(detail, result.model_dump(mode="json"))


async def cmd_jobs(ctx: Context) -> None:
    """The cluster's jobs as their instances registered them (``ekbatan_jobs``), with the
    executions running now and those timed out in the last day."""
    views = await ctx.reads.job_views()
    if not views and not await ctx.store.jobs.look():
        ctx.out.warn(
            "the job definitions table (ekbatan_jobs) is missing: run `ekbatan-jobs migrate`"
        )
    value = {"jobs": [v.model_dump(mode="json") for v in views]}
    ctx.out.table(
        value["jobs"],
        json_value=value,
        columns=(
            "name",
            "kind",
            "schedule",
            "timeout",
            "max_concurrency",
            "running",
            "timed_out_last_day",
            "catch_up",
            "overlap",
            "skipped_slots",
            "app_version",
        ),
    )


async def cmd_instances(ctx: Context) -> None:
    value = {"instances": [i.model_dump(mode="json") for i in await ctx.reads.instance_views()]}
    ctx.out.table(
        value["instances"],
        json_value=value,
        columns=(
            "name",
            "host",
            "pid",
            "started_at",
            "last_seen",
            "last_seen_age_seconds",
            "library_version",
            "alive",
        ),
    )


COMMANDS: dict[str, Callable[[Context], Awaitable[None]]] = {
    "migrate": cmd_migrate,
    "list": cmd_list,
    "history": cmd_history,
    "run-now": cmd_run_now,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "cancel": cmd_cancel,
    "instances": cmd_instances,
    "jobs": cmd_jobs,
    "plan": cmd_plan,
    "backfill": cmd_backfill,
    "schedules": cmd_schedules,
}
