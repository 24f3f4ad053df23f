"""The command line of ``ekbatan-jobs`` (argparse)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..client.schedules import SCHEDULE_STATES
from ..domain.job import RECURRING_INSTANCE

__all__ = ["parser", "seconds", "whole_number"]

_DESCRIPTION = """\
Operate ekbatan-fastapi's jobs tables: apply the migrations, list the tasks and the jobs, read
the execution history, run a task now, stop a running execution, pause and resume a task
cluster-wide, backfill a recurring job's slots, and see what an application's startup would
change (plan).

The database is --url, or the application's database setting (the jobs-config slot of its
settings), read as the application reads it: EKBATAN_... environment variables and the YAML
file of EKBATAN_CONFIG_FILE (--config).
"""

_EPILOG = """\
exit codes: 0 ok, 1 failed, 2 bad usage or settings, 3 unknown task (or, for cancel, not running),
4 database unreachable, 5 schema missing (run `ekbatan-jobs migrate`),
6 conflict (the task is running, or paused without --force)
"""


MAX_LIST_LIMIT = 100_000
"""``list --limit``: the rows one listing holds in memory at most."""
MAX_OFFSET = 2**31 - 1
"""``list --offset``: as ``GET /jobs?offset=`` is bounded."""
MAX_HISTORY_LIMIT = 1000
"""``history --limit``: the client's page size at most."""
MAX_ID = 2**63 - 1
"""``history --before``: the history table's ``bigint`` ids."""
MAX_SECONDS = 3600.0
"""``--connect-timeout`` and ``run-now --wait``: an hour at most."""


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``; anything else is a usage
    error (exit code 2) naming the value and the range, as the settings' errors do."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a whole number; give one from {low} to {high}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


def seconds(high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds above zero and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a number of seconds; give one above 0, up to {high:g}"
            )
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"must be above 0 and up to {high:g}, got {text}")
        return value

    return parse


def _common(p: argparse.ArgumentParser, suppress: bool) -> None:
    """Options accepted before and after the command (after it, they override)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--url", default=default(None), help="database URL (instead of settings)")
    p.add_argument(
        "--config", default=default(None), help="settings YAML file (like EKBATAN_CONFIG_FILE)"
    )
    p.add_argument(
        "--dialect",
        choices=("postgresql", "mysql", "mariadb", "mysql5"),
        default=default(None),
        help="override the dialect read from the URL (mysql5: MySQL before 8)",
    )
    p.add_argument(
        "--pooler",
        choices=("none", "pgbouncer-session", "pgbouncer-transaction"),
        default=default(None),
        help="what sits between us and PostgreSQL (default: the pooler setting, else none); "
        "pgbouncer-transaction for PgBouncer's transaction pooling",
    )
    p.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON, for scripts"
    )
    p.add_argument(
        "--connect-timeout",
        type=seconds(MAX_SECONDS),
        default=default(5.0),
        metavar="SECONDS",
        help="give up reaching the database after this long (default 5, up to 3600)",
    )


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="ekbatan-jobs",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(main, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _common(common, suppress=True)
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, parents=[common])

    p = command("migrate", "apply the SQL migrations of the database's dialect (idempotent)")
    p.add_argument("--dry-run", action="store_true", help="only show what would be done")

    _reading_commands(command)

    p = command("run-now", "make a task due now (its failure counters are kept)")
    p.add_argument("task")
    p.add_argument("--instance", default=RECURRING_INSTANCE, help="a one-time task's instance")
    p.add_argument(
        "--force",
        action="store_true",
        help="also when the task is paused: it runs once on a live instance and stays paused",
    )
    p.add_argument(
        "--wait",
        type=seconds(MAX_SECONDS),
        default=30.0,
        metavar="SECONDS",
        help="with --force: how long to wait for an instance to claim the run (30, up to 3600)",
    )

    p = command("pause", "pause a task cluster-wide: no instance claims it until resumed")
    p.add_argument("task")
    p.add_argument("--reason", required=True, help="why (shown on /jobs and in `list`)")
    p.add_argument("--by", help="who (default cli:<user>@<host>)")

    p = command(
        "cancel",
        "stop a running execution, wherever it runs (within one heartbeat interval); a "
        "recurring job goes on with its next slot, a one-time task is removed",
    )
    p.add_argument("task")
    p.add_argument("--instance", default=RECURRING_INSTANCE, help="a one-time task's instance")
    p.add_argument("--reason", help="why (recorded in the history)")
    p.add_argument("--by", help="who (default cli:<user>@<host>)")

    p = command("resume", "resume a paused task; an overdue slot runs once")
    p.add_argument("task")
    p.add_argument(
        "--skip-missed", action="store_true", help="skip an overdue slot: go to the next one"
    )
    p.add_argument(
        "--schedule",
        metavar="SPEC",
        help="the job's schedule (e.g. 'FIXED_RATE|PT1H'), needed by --skip-missed when overdue",
    )

    _schedule_commands(command)
    add_schedules_command(command)
    command("instances", "the scheduler instances, live and recently gone")
    command(
        "jobs",
        "the cluster's jobs: schedule, timeout, concurrency limit, running now, timed out",
    )
    return main


def _reading_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """``list`` and ``history``, whose numbers are bounded (docs/cli.md)."""
    p = command("list", "the rows of scheduled_tasks, with their state")
    p.add_argument("task", nargs="?", help="only this task's rows")
    p.add_argument(
        "--limit",
        type=whole_number(1, MAX_LIST_LIMIT),
        default=1000,
        help=f"at most this many rows (1000, up to {MAX_LIST_LIMIT:,})",
    )
    p.add_argument(
        "--offset",
        type=whole_number(0, MAX_OFFSET),
        default=0,
        help="page: skip this many rows (by execution time; the next page: next_offset)",
    )

    p = command("history", "executions, newest first")
    p.add_argument("task", nargs="?", help="only this task's executions")
    p.add_argument(
        "--limit",
        type=whole_number(1, MAX_HISTORY_LIMIT),
        default=20,
        help=f"at most this many (20, up to {MAX_HISTORY_LIMIT})",
    )
    p.add_argument(
        "--before",
        type=whole_number(1, MAX_ID),
        metavar="ID",
        help="page: executions before this id (a positive id from a previous page)",
    )


def _schedule_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """``plan`` and ``backfill`` (see docs/schedules.md)."""
    p = command(
        "plan",
        "what an application's startup would change (schedules, rows), changing nothing",
    )
    p.add_argument(
        "--jobs",
        required=True,
        metavar="MODULE:ATTR",
        help="the application's jobs: a list of jobs, a function returning them, or its "
        "JobRegistry (e.g. myapp.jobs:JOBS)",
    )
    p.add_argument(
        "--app-version", help="the version the application runs as (default: jobs.app-version)"
    )

    p = command("backfill", "run each slot of a recurring job's schedule in a window once more")
    p.add_argument("task")
    p.add_argument("--start", required=True, help="ISO-8601 with a zone: the window's start")
    p.add_argument("--end", required=True, help="ISO-8601 with a zone: the window's end (open)")
    p.add_argument(
        "--force", action="store_true", help="also when the job is paused (the rows then wait)"
    )


_VERBS = ("list", "create", "update", "delete", "pause", "resume")


def add_schedules_command(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    p = command(
        "schedules",
        "the schedules of a PersistentScheduleJob: list, create, update, delete, pause, resume",
    )
    p.add_argument("verb", choices=_VERBS)
    p.add_argument("job", help="the PersistentScheduleJob's name")
    p.add_argument("id", nargs="?", help="the schedule's id (all verbs but list)")
    p.add_argument("--schedule", metavar="SPEC", help="e.g. 'CRON|0 8 * * 1-5|Europe/Berlin'")
    p.add_argument("--data", metavar="JSON", help="the schedule's data, e.g. '{\"user_id\": 42}'")
    p.add_argument("--start-at", metavar="ISO", help="no slot before (ISO-8601 with a zone)")
    p.add_argument("--end-at", metavar="ISO", help="no slot after (ISO-8601 with a zone)")
    p.add_argument("--max-runs", type=whole_number(1, 2**31 - 1), help="at most this many runs")
    p.add_argument("--replace", action="store_true", help="create: replace an existing one")
    p.add_argument("--reason", help="pause: why")
    p.add_argument("--state", choices=SCHEDULE_STATES, help="list: only this state")
    p.add_argument(
        "--search", metavar="TEXT", help="list: only ids that contain TEXT (any case, literally)"
    )
    p.add_argument("--limit", type=whole_number(1, 1000), default=100, help="list: page size")
    p.add_argument("--offset", type=whole_number(0, 2**31 - 1), default=0, help="list: skip")
