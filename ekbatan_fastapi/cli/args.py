"""The command line of ``ekbatan-jobs`` (argparse)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..domain.job import RECURRING_INSTANCE

__all__ = ["parser"]

_DESCRIPTION = """\
Operate ekbatan-fastapi's jobs tables: apply the migrations, list the tasks and the jobs, read
the execution history, run a task now, pause and resume it cluster-wide, backfill a recurring
job's slots, and see what an application's startup would change (plan).

The database is --url, or the application's database setting (the jobs-config slot of its
settings), read as the application reads it: EKBATAN_... environment variables and the YAML
file of EKBATAN_CONFIG_FILE (--config).
"""

_EPILOG = """\
exit codes: 0 ok, 1 failed, 2 bad usage or settings, 3 unknown task,
4 database unreachable, 5 schema missing (run `ekbatan-jobs migrate`),
6 conflict (the task is running, or paused without --force)
"""


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
        type=float,
        default=default(5.0),
        metavar="SECONDS",
        help="give up reaching the database after this long (default 5)",
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

    p = command("list", "the rows of scheduled_tasks, with their state")
    p.add_argument("task", nargs="?", help="only this task's rows")
    p.add_argument("--limit", type=int, default=1000, help="at most this many rows (1000)")

    p = command("history", "executions, newest first")
    p.add_argument("task", nargs="?", help="only this task's executions")
    p.add_argument("--limit", type=int, default=20, help="at most this many (20, up to 1000)")
    p.add_argument("--before", type=int, metavar="ID", help="page: executions before this id")

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
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --force: how long to wait for an instance to claim the run (30)",
    )

    p = command("pause", "pause a task cluster-wide: no instance claims it until resumed")
    p.add_argument("task")
    p.add_argument("--reason", required=True, help="why (shown on /jobs and in `list`)")
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
    command("instances", "the scheduler instances, live and recently gone")
    command(
        "jobs",
        "the cluster's jobs: schedule, timeout, concurrency limit, running now, timed out",
    )
    return main


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
