"""``ekbatan-jobs plan`` (what an application's startup would change, changing nothing) and
``ekbatan-jobs backfill`` (run a window of a recurring job's slots once more)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..domain.job import Job
from ..engine.config import SchedulerConfig
from ..engine.scheduler import Scheduler
from .context import EXIT, CliError, Context

__all__ = ["cmd_backfill", "cmd_plan", "load_jobs"]


def load_jobs(spec: str) -> list[Job]:
    """The jobs named by ``module:attribute``: a Job, an iterable of jobs, a JobRegistry, or a
    callable (no arguments) returning one of those."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CliError(
            EXIT.USAGE,
            f"--jobs {spec!r}: expected MODULE:ATTRIBUTE, e.g. myapp.jobs:JOBS (a list of jobs, "
            "a function returning them, or the application's JobRegistry)",
        )
    try:
        value: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise CliError(EXIT.USAGE, f"--jobs {spec!r}: {error}") from None
    if callable(value) and not isinstance(value, Job):
        value = value()
    jobs = getattr(value, "jobs", value)
    if isinstance(jobs, dict):
        jobs = list(jobs.values())
    if isinstance(jobs, Job):
        jobs = [jobs]
    if not isinstance(jobs, Iterable) or not all(isinstance(j, Job) for j in jobs):
        raise CliError(
            EXIT.USAGE,
            f"--jobs {spec!r} is {type(value).__name__}, not jobs: name a list of Job instances, "
            "a function returning them, or a JobRegistry",
        )
    return list(jobs)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


async def cmd_plan(ctx: Context) -> None:
    """What startup of an application with these jobs would change now: per recurring job,
    the action, the stored and the new schedule, the next run before and after."""
    jobs = load_jobs(ctx.args.jobs)
    version = ctx.args.app_version or ctx.settings.jobs.app_version
    config = SchedulerConfig(app_version=version, scheduler_name="ekbatan-jobs-plan")
    scheduler = Scheduler(ctx.store, jobs, config)
    changes = await scheduler.startup.plan()
    views = [
        {
            "job": c.task_name,
            "action": c.action,
            "old_schedule": c.old_schedule,
            "new_schedule": c.new_schedule,
            "next_before": _iso(c.next_before),
            "next_after": _iso(c.next_after),
            "reason": c.reason,
        }
        for c in changes
    ]
    ctx.out.table(views, json_value={"app_version": version, "changes": views})


def _when(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            EXIT.USAGE, f"--{what} {text!r} is not an ISO-8601 time, e.g. 2026-11-30T00:00Z"
        ) from None
    if value.tzinfo is None:
        raise CliError(EXIT.USAGE, f"--{what} {text!r} needs a zone, e.g. {text}Z or {text}+01:00")
    return value


async def cmd_backfill(ctx: Context) -> None:
    """Insert one row per slot of the job's stored schedule in [--start, --end)."""
    args = ctx.args
    result = await ctx.client.backfill(
        args.task,
        _when(args.start, "start"),
        _when(args.end, "end"),
        force=args.force,
        force_hint="--force",
    )
    first = _iso(result.slots[0]) if result.slots else "-"
    ctx.out.done(
        f"{args.task}: {len(result.slots)} slots from {first}, {result.inserted} new "
        "(the others were already waiting)",
        json_value={
            "task": args.task,
            "slots": [s.isoformat() for s in result.slots],
            "inserted": result.inserted,
        },
    )
