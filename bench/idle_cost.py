"""Idle cost: what one idle instance with 100 registered recurring jobs (all due far in the
future) sends to the database, by statement kind, and its memory.

    python bench/idle_cost.py                   # private PostgreSQL with pg_stat_statements, 60 s
    python bench/idle_cost.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/idle_cost.py --quick           # 10 jobs, 3 s

One worker process (this script with ``--worker``) registers J recurring jobs with a yearly
cron schedule (``0 0 1 1 *``: the next slot is weeks or months away) and the library's
defaults (polling interval PT10S, heartbeat PT10S, history on, LISTEN/NOTIFY on). Once it is
ready and a settling time has passed, the harness measures a window of W seconds:

* server side (when the server has ``pg_stat_statements`` preloaded, as the private cluster
  does): ``pg_stat_statements_reset`` for the benchmark's database at the window's start,
  the calls per statement at its end, read from another database so that the harness's own
  statements do not count;
* client side (always): every statement the instance's SQLAlchemy engine sends, counted by a
  ``before_cursor_execute`` hook in the worker (the LISTEN connection's driver-level
  LISTEN/UNLISTEN are not SQLAlchemy statements; the server-side count includes them).

Each statement is classified (poll, heartbeat, dead-execution check, instance report, ...)
and reported per second and per polling interval; with the worker's RSS (VmRSS) and the CPU
it used during the window. Goal: at most one poll statement per polling interval, whatever the
number of jobs, and no wake-up unless something is due.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

THIS_FILE = Path(__file__).resolve()
DEFAULT_JOBS = 100
DEFAULT_DURATION = 60.0
SETTLE = 2.0
UNRESOLVED = 1000
"""Rows of unknown task names, 20 days overdue, that the cleanup after the window deletes."""
POLLING_INTERVAL = 10.0
"""The library's default (PT10S); the worker does not change it unless told."""

_KINDS: list[tuple[str, re.Pattern[str]]] = [
    (
        "poll (claim due rows)",
        re.compile(
            r"FOR UPDATE SKIP LOCKED.*claimed AS|LEFT JOIN LATERAL|"
            r"execution_time ASC\s+(LIMIT \S+\s+)?FOR UPDATE SKIP LOCKED",  # MySQL/MariaDB
            re.S | re.I,
        ),
    ),
    (
        "poll: clock and next due time (MySQL/MariaDB)",
        re.compile(r"^\s*SELECT UTC_TIMESTAMP\(6\) AS db_now, \(SELECT MIN", re.I),
    ),
    ("optimistic claim", re.compile(r"WITH candidates AS", re.I)),
    ("heartbeat", re.compile(r"SET last_heartbeat = now\(\)", re.I)),
    ("dead-execution check", re.compile(r"WITH dead AS", re.I)),
    ("completion", re.compile(r"WITH d AS \(\s*SELECT \* FROM unnest", re.I)),
    ("instance report", re.compile(r"ekbatan_scheduler_instances", re.I)),
    ("history insert", re.compile(r"INSERT INTO ekbatan_execution_history", re.I)),
    ("history / unresolved cleanup", re.compile(r"DELETE FROM", re.I)),
    ("LISTEN / UNLISTEN / NOTIFY", re.compile(r"^\s*(UN)?LISTEN|pg_notify", re.I)),
    ("database clock (now())", re.compile(r"^\s*SELECT now\(\)", re.I)),
    (
        "driver / catalog",
        re.compile(
            r"pg_catalog|pg_type|pg_namespace|^\s*SHOW |"
            r"^\s*(BEGIN|COMMIT|ROLLBACK)|^\s*SET ",
            re.I,
        ),
    ),
]


def classify(sql: str) -> str:
    for kind, pattern in _KINDS:
        if pattern.search(sql):
            return kind
    return "other"


@dataclasses.dataclass
class IdleRun:
    jobs: int
    duration: float
    polling_interval: float
    server_counts: dict[str, int] | None
    """Calls per statement kind, from pg_stat_statements (None: not available)."""
    client_counts: dict[str, int]
    server_statements: list[dict[str, Any]]
    rss_kib: int | None
    cpu_seconds: float | None
    errors: list[str]
    connections: int | None = None
    """The instance's connections to the database during the window (server side)."""
    startup: dict[str, float] = dataclasses.field(default_factory=dict)
    """The worker's own timings and memory: ``ready_s`` (start to ready), ``rss_ready_kib``,
    ``rss_before_kib`` (before the registry was built), ``cleanup_s`` (the unresolved-row
    cleanup over every name, after the window), ``recurring_rows_s`` (startup's read of the
    recurring rows)."""

    @property
    def counts(self) -> dict[str, int]:
        return self.server_counts if self.server_counts is not None else self.client_counts

    @property
    def source(self) -> str:
        return "pg_stat_statements" if self.server_counts is not None else "client hook"

    @property
    def per_second(self) -> float:
        return sum(self.counts.values()) / self.duration

    @property
    def polls_per_interval(self) -> float:
        polls = self.counts.get("poll (claim due rows)", 0)
        return polls / (self.duration / self.polling_interval)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "source": self.source,
            "statements_per_second": self.per_second,
            "polls_per_interval": self.polls_per_interval,
        }


async def _stat_reset(server: common.ServerInfo, database: str) -> None:
    engine = create_async_engine(server.url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            oid = (
                await conn.execute(
                    text("SELECT oid FROM pg_database WHERE datname = :d"), {"d": database}
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "SELECT pg_stat_statements_reset(CAST(0 AS oid), CAST(:oid AS oid), "
                    "CAST(0 AS bigint))"
                ),
                {"oid": oid},
            )
    finally:
        await engine.dispose()


async def _stat_read(server: common.ServerInfo, database: str) -> list[dict[str, Any]]:
    engine = create_async_engine(server.url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT s.query, s.calls FROM pg_stat_statements s "
                    "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :d "
                    "ORDER BY s.calls DESC"
                ),
                {"d": database},
            )
            return [{"query": r[0], "calls": int(r[1])} for r in rows]
    finally:
        await engine.dispose()


async def _connections(server: common.ServerInfo, database: str) -> int | None:
    mysql = common.is_mysql_url(server.url)
    sql = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = :d"
        if mysql
        else "SELECT count(*) FROM pg_stat_activity WHERE datname = :d"
    )
    engine = create_async_engine(server.url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(sql), {"d": database})).scalar_one())
    except Exception:
        return None
    finally:
        await engine.dispose()


async def run_idle(
    server: common.ServerInfo,
    *,
    jobs: int = DEFAULT_JOBS,
    duration: float = DEFAULT_DURATION,
    settle: float = SETTLE,
    polling_interval: float | None = None,
) -> IdleRun:
    errors: list[str] = []
    server_statements: list[dict[str, Any]] = []
    server_counts: dict[str, int] | None = None
    client_counts: dict[str, int] = {}
    rss = cpu = connections = None
    startup: dict[str, float] = {}
    ready_within = 120.0 + jobs / 100  # 100,000 schedules: minutes on a loaded 2-core machine
    async with common.fresh_schema(server.url, "ekbatan_idle") as db_url:
        database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
        with tempfile.TemporaryDirectory(prefix="ekbatan-idle-") as work:
            result = Path(work) / "counts.json"
            args = [sys.executable, str(THIS_FILE), "--worker", "--url", db_url]
            args += ["--jobs", str(jobs), "--result", str(result)]
            args += ["--deadline", repr(time.monotonic() + ready_within + settle + duration + 300)]
            if polling_interval is not None:
                args += ["--polling-interval", repr(polling_interval)]
            child = await common.Child.spawn(args, Path(work) / "worker.log", "idle worker")
            try:
                await child.expect("ready", ready_within)
                await asyncio.sleep(settle)
                await child.send("mark")
                await child.expect("marked", 30.0)
                if server.stat_statements:
                    await _stat_reset(server, database)
                cpu_before = common.process_cpu_seconds(child.pid)
                await asyncio.sleep(duration)
                if server.stat_statements:
                    server_statements = await _stat_read(server, database)
                connections = await _connections(server, database)
                rss = common.process_rss_kib(child.pid)
                cpu_after = common.process_cpu_seconds(child.pid)
                if cpu_before is not None and cpu_after is not None:
                    cpu = cpu_after - cpu_before
                await child.send("stop")
                await child.expect("done", 60.0 + jobs / 100)
                answer = json.loads(result.read_text())
                client_counts, startup = answer["counts"], answer["startup"]
            except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                await child.close(30.0)
    if server.stat_statements:
        counter: collections.Counter[str] = collections.Counter()
        for statement in server_statements:
            if "pg_stat_statements" in statement["query"]:
                continue
            counter[classify(statement["query"])] += statement["calls"]
        server_counts = dict(counter)
    return IdleRun(
        jobs=jobs,
        duration=duration,
        polling_interval=polling_interval or POLLING_INTERVAL,
        server_counts=server_counts,
        client_counts=client_counts,
        server_statements=server_statements,
        rss_kib=rss,
        cpu_seconds=cpu,
        errors=errors,
        connections=connections,
        startup=startup,
    )


def format_table(run: IdleRun) -> str:
    lines = [
        f"| statement kind ({run.source}) | statements in {run.duration:g} s | per second "
        f"| per polling interval ({run.polling_interval:g} s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    intervals = run.duration / run.polling_interval
    for kind, calls in sorted(run.counts.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {kind} | {calls} | {calls / run.duration:.2f} | {calls / intervals:.2f} |")
    total = sum(run.counts.values())
    lines.append(f"| **all** | {total} | {total / run.duration:.2f} | {total / intervals:.2f} |")
    rss = f"{run.rss_kib / 1024:.1f} MiB" if run.rss_kib else "n/a"
    cpu = f"{run.cpu_seconds:.2f} s" if run.cpu_seconds is not None else "n/a"
    lines.append("")
    lines.append(
        f"{run.jobs} recurring jobs, idle; RSS {rss}; CPU {cpu} in {run.duration:g} s; "
        f"poll statements per polling interval: {run.polls_per_interval:.2f} (goal <= 1); "
        f"connections to the database: {run.connections}"
    )
    if run.startup:
        st = run.startup
        lines.append("")
        lines.append(
            f"startup: registry built in {st.get('build_s', 0):.2f} s, ready "
            f"{st.get('ready_s', 0):.2f} s after start; event loop blocked at most "
            f"{st.get('block_start_s', 0):.3f} s from start to ready, "
            f"{st.get('block_idle_s', 0):.3f} s from ready to the window's end (the scheduler's "
            f"monitor, which reports blocks >= 1 s: {st.get('monitor_max_lag_s', 0):.2f} s); "
            f"RSS {st.get('rss_before_kib', 0) / 1024:.1f} MiB before the registry, "
            f"{st.get('rss_ready_kib', 0) / 1024:.1f} MiB when ready; "
            f"unresolved-row cleanup over {run.jobs} names {st.get('cleanup_s', 0):.2f} s "
            f"(deleted {st.get('cleanup_deleted', 0):.0f}); recurring-row read "
            f"{st.get('recurring_rows_s', 0):.2f} s"
        )
        if run.cpu_seconds is not None and "probe_cpu_per_s" in st:
            probe = st["probe_cpu_per_s"] * run.duration
            lines.append("")
            lines.append(
                f"of the window's CPU, the harness's own event-loop probe (measured alone "
                f"before the start): {probe:.2f} s; the scheduler's: "
                f"{max(0.0, run.cpu_seconds - probe):.2f} s"
            )
    return "\n".join(lines)


# -- the worker -----------------------------------------------------------------------------


_PROBE_ALONE = 2.0
"""Seconds the worker runs the block probe alone before the scheduler starts, to report its
own CPU (it wakes every 10 ms: about 2 % of a core here, inside the window's CPU)."""


class _BlockProbe:
    """The longest stretch the event loop did not run this task (a 10 ms sleep's lateness)."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            self.longest = max(self.longest, loop.time() - before - 0.01)

    def take(self) -> float:
        """The longest block since the last ``take``."""
        longest, self.longest = self.longest, 0.0
        return longest


async def _worker(args: argparse.Namespace) -> int:
    from sqlalchemy import event

    from ekbatan_fastapi import (
        DistributedJob,
        ExecutionContext,
        Schedule,
        SchedulerObserver,
        Schedules,
    )
    from ekbatan_fastapi.domain.job import RECURRING_INSTANCE

    class FarJob(DistributedJob):
        def __init__(self, name: str) -> None:
            self._name = name

        def name(self) -> str:
            return self._name

        def schedule(self) -> Schedule:
            return Schedules.cron("0 0 1 1 *")

        async def execute(self, ctx: ExecutionContext) -> None:
            print(f"unexpected execution of {ctx.task_name}", file=sys.stderr, flush=True)

    rss_before = common.process_rss_kib(os.getpid()) or 0
    names = [f"idle-{j:03d}" for j in range(args.jobs)]
    began = time.monotonic()
    counts: collections.Counter[str] = collections.Counter()

    # PostgreSQL's hot statements (the poll among them) go to asyncpg directly, past
    # SQLAlchemy's events: an observer's ``statement_sent`` sees those.
    class Counted(SchedulerObserver):
        def statement_sent(self, name: str, sql: str) -> None:
            counts[classify(sql)] += 1

    registry = common.worker_registry(
        args.url,
        [FarJob(name) for name in names],
        name=f"idle-{os.getpid()}",
        polling_interval=args.polling_interval,
        customize=lambda b: b.observer(Counted()),
    )
    build_s = time.monotonic() - began

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        counts[classify(statement)] += 1

    def mark(command: str) -> None:
        if command == "mark":
            counts.clear()
            print("marked", flush=True)

    event.listen(registry.engine.sync_engine, "before_cursor_execute", count)
    commands = common.stdin_commands()
    blocked = _BlockProbe()
    probe = asyncio.create_task(blocked.run())
    alone = time.process_time()
    await asyncio.sleep(_PROBE_ALONE)  # what the probe costs by itself (part of the CPU)
    probe_cpu = (time.process_time() - alone) / _PROBE_ALONE
    blocked.take()
    began = time.monotonic()
    await registry.start()
    startup: dict[str, float] = {
        "rss_before_kib": rss_before,
        "build_s": build_s,
        "probe_cpu_per_s": probe_cpu,
    }
    try:
        if not await registry.wait_until_ready(60.0 + args.jobs / 100):
            return 1
        startup["ready_s"] = time.monotonic() - began
        startup["rss_ready_kib"] = common.process_rss_kib(os.getpid()) or 0
        startup["block_start_s"] = blocked.take()
        print("ready", flush=True)
        await common.wait_for_stop(commands, args.deadline, mark, most=10)
        startup["block_idle_s"] = blocked.take()
        startup["monitor_max_lag_s"] = registry.scheduler.lag.max_lag
        probe.cancel()
        window = dict(counts)
        # after the window (not counted in it): the hourly cleanup and startup's read, once
        tasks = registry.scheduler.store.tasks
        from sqlalchemy import insert

        from ekbatan_fastapi import scheduled_tasks

        old = dt.datetime.now(dt.UTC) - dt.timedelta(days=20)
        async with registry.engine.begin() as conn:  # 1,000 unresolved rows to clean up
            await conn.execute(
                insert(scheduled_tasks),
                [
                    {"task_name": f"gone-{i}", "task_instance": "x", "execution_time": old}
                    | {"picked": False, "version": 1, "priority": 0}
                    for i in range(UNRESOLVED)
                ],
            )
        began = time.monotonic()
        deleted = await tasks.delete_unresolved(names, dt.timedelta(days=14))
        startup["cleanup_s"] = time.monotonic() - began
        startup["cleanup_deleted"] = deleted
        began = time.monotonic()
        await tasks.recurring_rows(names, RECURRING_INSTANCE)
        startup["recurring_rows_s"] = time.monotonic() - began
    finally:
        await registry.stop()
    await common.write_result(args.result, {"counts": window, "startup": startup})
    return 0


# -- command line ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.harness_parser(__doc__)
    p.add_argument("--jobs", type=int, default=None, help=f"recurring jobs ({DEFAULT_JOBS})")
    p.add_argument("--duration", type=float, default=None, help="window, seconds (60)")
    p.add_argument("--polling-interval", type=float, default=None, help="default: PT10S")
    p.add_argument("--quick", action="store_true", help="10 jobs, 3 s")
    p.add_argument("--json", type=Path)
    # worker mode (internal)
    common.add_worker_arguments(p)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        args.jobs = args.jobs or DEFAULT_JOBS
        return asyncio.run(_worker(args))
    jobs = args.jobs or (10 if args.quick else DEFAULT_JOBS)
    duration = args.duration or (3.0 if args.quick else DEFAULT_DURATION)
    with common.private_postgres(args.url) as server:
        run = asyncio.run(
            run_idle(server, jobs=jobs, duration=duration, polling_interval=args.polling_interval)
        )
        kind = server.kind
    print(f"server: {kind}")
    print(format_table(run))
    for error in run.errors:
        print(f"! {error}")
    if args.json:
        args.json.write_text(json.dumps(run.as_dict(), indent=2))
    return 0 if not run.errors else 1


if __name__ == "__main__":
    sys.exit(main())
