"""The commands of ``ekbatan-jobs``: each reads or changes the tables through the same
repositories as the scheduler, and reports through ``Output``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect

from ..connection import ConnectionProvider, repository_class
from ..errors import ScheduleError
from ..job import RECURRING_INSTANCE
from ..migrate import migrate, migrations_folder
from ..operations.repository import OperationsRepository
from ..operations.tables import HISTORY, INSTANCES, PAUSED
from ..repository.base import TaskRepository
from ..schedules import parse_schedule
from ..schema import DEFAULT_TABLE_NAME
from .output import Output, row_view

if TYPE_CHECKING:
    from ..settings import EkbatanSettings

__all__ = ["COMMANDS", "EXIT", "CliError", "Context", "connect"]


class EXIT:
    """The exit codes (documented in docs/cli.md)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    """A bad argument or setting (argparse uses 2 as well)."""
    UNKNOWN_TASK = 3
    UNREACHABLE = 4
    SCHEMA_MISSING = 5
    CONFLICT = 6
    """The task is running right now, or paused (run-now without --force)."""


class CliError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Context:
    args: argparse.Namespace
    provider: ConnectionProvider
    dialect: str
    repo: TaskRepository
    ops: OperationsRepository
    out: Output
    dead_after: timedelta
    overdue_after: timedelta

    def safe_url(self) -> str:
        return self.provider.engine.url.render_as_string(hide_password=True)


# -- setup ----------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> EkbatanSettings:
    from ..settings import EkbatanSettings

    return EkbatanSettings(_config_file=args.config) if args.config else EkbatanSettings()


async def connect(args: argparse.Namespace, out: Output) -> Context:
    """Read the settings, build a one-connection pool and check that the database answers
    within ``--connect-timeout``."""
    settings = _settings(args)
    url: Any = args.url or settings.jobs_datasource().sqlalchemy_url()
    # the dialect decides the driver's name of the connect timeout; no connection yet
    url_dialect = ConnectionProvider.from_url(url).dialect
    timeout_key = "timeout" if url_dialect == "postgresql" else "connect_timeout"
    provider = ConnectionProvider.from_url(
        url, pool_size=1, connect_args={timeout_key: args.connect_timeout}
    )
    dialect = args.dialect or provider.dialect
    repo = repository_class(dialect)(provider.engine, DEFAULT_TABLE_NAME)
    knobs = settings.jobs
    ctx = Context(
        args=args,
        provider=provider,
        dialect=dialect,
        repo=repo,
        ops=OperationsRepository(repo),
        out=out,
        dead_after=knobs.heartbeat_interval * knobs.missed_heartbeats_limit,
        overdue_after=max(2 * knobs.polling_interval, timedelta(seconds=1)),
    )
    try:
        async with asyncio.timeout(args.connect_timeout + 2):
            async with provider.engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
    except Exception as error:
        await provider.dispose()
        reason = str(getattr(error, "orig", None) or error) or type(error).__name__
        raise CliError(
            EXIT.UNREACHABLE,
            f"cannot reach the database at {ctx.safe_url()} within {args.connect_timeout:g} s: "
            f"{reason}",
        ) from None
    return ctx


async def _require_tables(ctx: Context, *tables: str) -> None:
    def missing(sync_conn: Any) -> list[str]:
        inspector = inspect(sync_conn)
        return [t for t in tables if not inspector.has_table(t)]

    async with ctx.provider.engine.connect() as conn:
        absent = await conn.run_sync(missing)
    if absent:
        raise CliError(
            EXIT.SCHEMA_MISSING,
            f"table {', '.join(absent)} does not exist in {ctx.safe_url()}: run "
            f"`ekbatan-jobs migrate` (or apply migrations/{migrations_folder(ctx.dialect)}/)",
        )


async def _require_task(ctx: Context, name: str) -> None:
    """A task is known when the table has a row of it, it is paused, or it has history."""
    if await ctx.repo.list_tasks(name, limit=1):
        return
    if name in await ctx.ops.paused() or await ctx.ops.history(name, limit=1):
        return
    raise CliError(
        EXIT.UNKNOWN_TASK,
        f"unknown task {name!r}: the table has no row, pause or history of it "
        "(`ekbatan-jobs list` shows the tasks)",
    )


def _operator() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:200]


# -- commands -------------------------------------------------------------------------------


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
    await _require_tables(ctx, DEFAULT_TABLE_NAME)
    paused = await ctx.ops.paused() if await has_table(ctx, PAUSED) else {}
    rows = await ctx.repo.list_tasks(ctx.args.task, limit=ctx.args.limit)
    now = await ctx.repo.db_now()
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


async def has_table(ctx: Context, table: str) -> bool:
    async with ctx.provider.engine.connect() as conn:
        return bool(await conn.run_sync(lambda sync: inspect(sync).has_table(table)))


async def cmd_history(ctx: Context) -> None:
    await _require_tables(ctx, DEFAULT_TABLE_NAME, HISTORY, PAUSED)
    if ctx.args.task is not None:
        await _require_task(ctx, ctx.args.task)
    records = await ctx.ops.history(ctx.args.task, limit=ctx.args.limit, before_id=ctx.args.before)
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
    await _require_tables(ctx, DEFAULT_TABLE_NAME, HISTORY, PAUSED)
    name = ctx.args.task
    await _require_task(ctx, name)
    by = ctx.args.by or _operator()
    await ctx.ops.pause(name, by, ctx.args.reason)
    ctx.out.done(
        f"paused {name} (by {by}: {ctx.args.reason})",
        {"task": name, "paused": True, "paused_by": by, "reason": ctx.args.reason},
    )


async def cmd_resume(ctx: Context) -> None:
    await _require_tables(ctx, DEFAULT_TABLE_NAME, HISTORY, PAUSED)
    name = ctx.args.task
    await _require_task(ctx, name)
    skipped_to: datetime | None = None
    if ctx.args.skip_missed:
        skipped_to = await _skip_missed(ctx, name)
    resumed = await ctx.ops.resume(name)
    if resumed and ctx.repo.supports_notify:
        await ctx.repo.notify(None)
    message = f"resumed {name}" if resumed else f"{name} was not paused"
    if skipped_to is not None:
        message += f"; its overdue slot was skipped, next run {skipped_to.isoformat()}"
    ctx.out.done(
        message,
        {
            "task": name,
            "resumed": resumed,
            "next_execution_time": skipped_to.isoformat() if skipped_to else None,
        },
    )


async def _skip_missed(ctx: Context, name: str) -> datetime | None:
    """Move an overdue recurring row to its next future slot (while still paused)."""
    row = await ctx.repo.get(name, RECURRING_INSTANCE)
    now = await ctx.repo.db_now()
    if row is None or row.picked or row.execution_time > now:
        return None
    if not ctx.args.schedule:
        raise CliError(
            EXIT.USAGE,
            f"{name} is overdue since {row.execution_time.isoformat()}; to skip to its next slot "
            "the CLI needs the job's schedule, which the table does not store: add "
            "--schedule 'FIXED_RATE|PT1H' (the job's schedule in db-scheduler's form), or "
            "resume through the application (client.resume(name, skip_missed=True))",
        )
    try:
        schedule = parse_schedule(ctx.args.schedule)
    except ScheduleError as error:
        raise CliError(EXIT.USAGE, f"--schedule: {error}") from None
    following = schedule.next_execution_time(row.execution_time, now)
    if following is None or not await ctx.repo.reschedule(
        name, RECURRING_INSTANCE, following, expected_version=row.version
    ):
        raise CliError(EXIT.CONFLICT, f"{name} changed meanwhile (it may be running); try again")
    return following


async def cmd_run_now(ctx: Context) -> None:
    await _require_tables(ctx, DEFAULT_TABLE_NAME)
    name, instance = ctx.args.task, ctx.args.instance
    await _require_task_row(ctx, name, instance)
    pause = None
    if await has_table(ctx, PAUSED):
        pause = (await ctx.ops.paused()).get(name)
    if pause is not None and not ctx.args.force:
        raise CliError(
            EXIT.CONFLICT,
            f"{name} is paused (by {pause.paused_by} at {pause.paused_at.isoformat()}"
            f"{': ' + pause.reason if pause.reason else ''}); resume it, or pass --force to run "
            "it once anyway",
        )
    if pause is None:
        await make_due(ctx, name, instance)
        ctx.out.done(
            f"{name}/{instance} is due now; a running instance claims it at its next poll",
            {"task": name, "instance": instance, "due_now": True, "forced": False},
        )
        return
    from .force import forced_run

    claimed_by = await forced_run(ctx, name, instance, pause)
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


async def _require_task_row(ctx: Context, name: str, instance: str) -> None:
    if await ctx.repo.get(name, instance) is None:
        if await ctx.repo.list_tasks(name, limit=1):
            raise CliError(EXIT.UNKNOWN_TASK, f"task {name} has no instance {instance!r}")
        raise CliError(
            EXIT.UNKNOWN_TASK,
            f"unknown task {name!r}: the table has no row of it (`ekbatan-jobs list` shows them)",
        )


async def make_due(ctx: Context, name: str, instance: str) -> int:
    """Move the row to now (counters kept); its new version."""
    if not await ctx.repo.reschedule(name, instance, None):
        row = await ctx.repo.get(name, instance)
        if row is not None and row.picked:
            raise CliError(
                EXIT.CONFLICT, f"{name}/{instance} is running right now on {row.picked_by}"
            )
        raise CliError(EXIT.CONFLICT, f"{name}/{instance} changed meanwhile; try again")
    if ctx.repo.supports_notify:
        await ctx.repo.notify(None)
    row = await ctx.repo.get(name, instance)
    return row.version if row is not None else 0


async def cmd_instances(ctx: Context) -> None:
    await _require_tables(ctx, INSTANCES)
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
        for i in await ctx.ops.instances(ctx.dead_after)
    ]
    ctx.out.table(views, json_value={"instances": views})


COMMANDS = {
    "migrate": cmd_migrate,
    "list": cmd_list,
    "history": cmd_history,
    "run-now": cmd_run_now,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "instances": cmd_instances,
}
