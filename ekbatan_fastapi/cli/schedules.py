"""``ekbatan-jobs schedules list|create|update|delete|pause|resume``: the schedules of a
``PersistentScheduleJob`` (docs/schedules.md#schedules-as-data), through the same client
verbs as the application. The CLI loads no jobs: data is checked as JSON here, and a typed
job's model checks it when a slot runs."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from ..domain.errors import ScheduleError
from .context import EXIT, CliError, Context

__all__ = ["cmd_schedules"]

_COLUMNS = ("instance_id", "schedule", "state", "next_time", "runs", "max_runs", "end_at", "error")


def _instant(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise ScheduleError(
            f"{option} {text!r} is not an ISO-8601 instant with a zone; e.g. "
            "2027-01-01T00:00:00+00:00"
        )
    return value


def _data(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CliError(EXIT.USAGE, f"--data is not JSON ({error}): {text[:80]!r}") from None


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The fields ``update`` was given."""
    given: dict[str, Any] = {}
    if args.schedule is not None:
        given["schedule"] = args.schedule
    if args.data is not None:
        given["data"] = _data(args.data)
    if args.start_at is not None:
        given["start_at"] = _instant(args.start_at, "--start-at")
    if args.end_at is not None:
        given["end_at"] = _instant(args.end_at, "--end-at")
    if args.max_runs is not None:
        given["max_runs"] = args.max_runs
    return given


async def cmd_schedules(ctx: Context) -> None:
    args, client = ctx.args, ctx.client
    client.unregistered_schedules = True
    if args.verb == "list":
        found = await client.list_schedules(
            args.job, limit=args.limit, offset=args.offset, state=args.state, search=args.search
        )
        rows = [s.to_json() for s in found]
        value = {
            "job": args.job,
            "schedules": rows,
            "next_offset": args.offset + args.limit if len(rows) == args.limit else None,
        }
        ctx.out.table(rows, json_value=value, columns=_COLUMNS)
        return
    if args.id is None:
        raise CliError(EXIT.USAGE, f"schedules {args.verb} needs the schedule's id after the job")
    where = f"{args.job}/{args.id}"
    if args.verb == "create":
        if args.schedule is None:
            raise CliError(EXIT.USAGE, "schedules create needs --schedule SPEC")
        created = await client.create_schedule(
            args.job,
            args.id,
            args.schedule,
            _data(args.data),
            replace=args.replace,
            start_at=_instant(args.start_at, "--start-at"),
            end_at=_instant(args.end_at, "--end-at"),
            max_runs=args.max_runs,
        )
        if not created:
            raise CliError(EXIT.CONFLICT, f"{where} exists; pass --replace to replace it")
        info = await client.get_schedule(args.job, args.id)
        shown = info.to_json() if info else {}
        ctx.out.done(f"created {where}, next slot {shown.get('next_time')}", shown)
    elif args.verb == "update":
        given = _changes(args)
        if not given:
            raise CliError(
                EXIT.USAGE,
                "schedules update needs what to change: --schedule, --data, --start-at, "
                "--end-at or --max-runs",
            )
        info = await client.update_schedule(args.job, args.id, **given)
        ctx.out.done(
            f"updated {where}; it takes effect from the next slot ({info.next_time})",
            info.to_json(),
        )
    elif args.verb == "delete":
        if not await client.delete_schedule(args.job, args.id):
            raise CliError(EXIT.UNKNOWN_TASK, f"no schedule {where}")
        ctx.out.done(f"deleted {where}", {"job": args.job, "instance_id": args.id})
    elif args.verb == "pause":
        await client.pause_schedule(args.job, args.id, args.reason, paused_by="cli")
        ctx.out.done(f"paused {where}", {"job": args.job, "instance_id": args.id})
    else:
        resumed = await client.resume_schedule(args.job, args.id)
        detail = f"resumed {where}" if resumed else f"{where} was not paused"
        ctx.out.done(detail, {"job": args.job, "instance_id": args.id, "resumed": resumed})
