"""Schedules as data (``PersistentScheduleJob``): creating many, an instance's startup and the
poll with many not due, many due in the same second on two processes, and an update that
moves a slot earlier.

    python bench/schedules.py                      # a private PostgreSQL, 100,000 schedules
    python bench/schedules.py --url mysql+asyncmy://root@127.0.0.1:3306/test
    python bench/schedules.py --quick              # 2,000 schedules, 100 due (a smoke run)

Each part on a fresh database; one summary table at the end (``--json``: the figures too):

1. ``create_schedules`` of N schedules of one job (``DAILY`` at a time 12 hours away, each
   with its own data) in one call: schedules per second.
2. An instance's startup (to ``wait_until_ready``) and its RSS once ready, in a fresh
   process, with no schedule and with the N (median of 3 each): the schedules are rows, not
   loaded at startup.
3. The poll with those N schedules not due (after the table's statistics are refreshed, as
   autovacuum does shortly after a bulk insert): an instance with the job registered
   (polling every 0.1 s) runs for a few seconds; the duration of each poll as the scheduler's
   observer saw it (``SchedulerObserver.polled``, client side: the round trip and the event
   loop included), against the same on the empty table; and the poll statement's own time
   on the server (PostgreSQL: ``EXPLAIN ANALYZE``; MySQL/MariaDB: ``ANALYZE FORMAT=JSON`` of
   its two reads, in a transaction rolled back).
4. D schedules due in the same second, two scheduler processes (this script with
   ``--worker``; ``batch_size`` 500, ``claim_ahead`` 1 s): each slot's start lag (the job's
   start on this machine's clock minus the slot), duplicates (a slot started twice) and
   skipped slots (never started). The job notes its start in memory; a writer in each process
   inserts the notes every 0.1 s (``--insert-per-run``: the job inserts its own note, an
   SQLAlchemy ``INSERT`` whose CPU before its first wait delays the executions starting after
   it in that process: the job's cost, not the scheduler's).
5. An update that moves a schedule's next slot from 12 hours away to 3 s from now, made by
   this harness while the two processes run: how long after the new slot it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

from ekbatan_fastapi import (
    ExecutionContext,
    PersistentScheduleJob,
    SchedulerObserver,
    Schedules,
    job_registry,
)
from ekbatan_fastapi.store.tables import UTCDateTime

LEDGER = MetaData()
starts = Table(
    "bench_schedule_starts",
    LEDGER,
    Column("instance", String(100), nullable=False),
    Column("slot", DateTime(timezone=True).with_variant(UTCDateTime(), "mysql", "mariadb")),
    Column("started", DateTime(timezone=True).with_variant(UTCDateTime(), "mysql", "mariadb")),
    Column("pid", Integer, nullable=False),
)


class Digest(PersistentScheduleJob):
    """Notes each start: in memory for ``Notes`` to write (``engine`` None: nowhere), or, with
    ``each``, with an ``INSERT`` of its own."""

    def __init__(self, engine: AsyncEngine | None = None, *, each: bool = False) -> None:
        self.engine = engine
        self.each = each
        self.notes: list[dict[str, Any]] = []

    def name(self) -> str:
        return "digest"

    async def execute(self, ctx: ExecutionContext) -> None:
        started = datetime.now(UTC)
        if self.engine is None:
            return
        note = {
            "instance": ctx.task_instance,
            "slot": ctx.execution_time,
            "started": started,
            "pid": os.getpid(),
        }
        if not self.each:
            self.notes.append(note)
            return
        async with self.engine.begin() as conn:
            await conn.execute(insert(starts).values(**note))


async def write_notes(job: Digest, engine: AsyncEngine, stop: asyncio.Event) -> None:
    """Insert the job's notes every 0.1 s (one statement), and the last ones once ``stop``."""
    while True:
        stopping = stop.is_set()
        notes, job.notes = job.notes, []
        if notes:
            async with engine.begin() as conn:
                await conn.execute(insert(starts), notes)
        if stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


class PollTimes(SchedulerObserver):
    def __init__(self) -> None:
        self.durations: list[float] = []

    def polled(self, duration: float, claimed: int) -> None:
        self.durations.append(duration)


def _registry(
    url: str, job: Digest, poll: float, observer: Any = None, *, batch: int = 0, ahead: float = 0
) -> Any:
    builder = (
        job_registry()
        .connection_provider(url)
        .with_job(job)
        .poll_interval(timedelta(seconds=poll))
        .heartbeat_interval(timedelta(seconds=1))
    )
    if observer is not None:
        builder.customize_scheduler(lambda b: b.observer(observer))
    if batch:
        builder.customize_scheduler(lambda b: b.batch_size(batch))
    if ahead:
        builder.customize_scheduler(lambda b: b.claim_ahead(timedelta(seconds=ahead)))
    return builder.build()


def _far_daily() -> Any:
    at = (datetime.now(UTC) + timedelta(hours=12)).time().replace(microsecond=0)
    return Schedules.daily(at)


async def measure_create(url: str, n: int) -> dict[str, Any]:
    registry = _registry(url, Digest(), 10.0)
    schedule = _far_daily()
    items = [(f"user-{i}", schedule, {"user_id": i}) for i in range(n)]
    began, cpu = time.perf_counter(), time.process_time()
    made = await registry.client.create_schedules("digest", items)
    took, cpu = time.perf_counter() - began, time.process_time() - cpu
    await registry.connection.dispose()
    assert made == n, made
    return {"n": n, "seconds": took, "per_second": n / took, "client_cpu": cpu}


async def measure_poll(url: str, seconds: float) -> dict[str, Any]:
    observer = PollTimes()
    registry = _registry(url, Digest(), 0.1, observer)
    async with registry:
        await registry.wait_until_ready(30)
        await asyncio.sleep(seconds)
    durations = observer.durations[2:]  # the first polls warm the connections
    return {
        "polls": len(durations),
        "median_ms": statistics.median(durations) * 1000,
        "p99_ms": (common.percentile(durations, 99) or 0) * 1000,
    }


async def _workers(url: str, count: int, options: list[str]) -> list[asyncio.subprocess.Process]:
    procs = []
    for _ in range(count):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", url, *options, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"READY", line
        procs.append(proc)
    return procs


async def measure_due(
    url: str, due: int, engine: AsyncEngine, options: list[str]
) -> dict[str, Any]:
    async with engine.begin() as conn:
        await conn.run_sync(LEDGER.create_all)
    registry = _registry(url, Digest(), 10.0)
    procs = await _workers(url, 2, options)
    try:
        slot = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
        same = Schedules.daily(slot.time())
        await registry.client.create_schedules(
            "digest", [(f"due-{i}", same, {"i": i}) for i in range(due)]
        )
        # the update, once they ran: from 12 hours away to 3 s from now
        await registry.client.create_schedule("digest", "moved", _far_daily(), {"moved": True})
        await _until(engine, due, 60)
        moved_slot = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
        await registry.client.update_schedule(
            "digest", "moved", schedule=Schedules.daily(moved_slot.time())
        )
        await _until(engine, due + 1, 30)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            await proc.wait()
        await registry.connection.dispose()
    async with engine.connect() as conn:
        rows = list(await conn.execute(select(starts)))
    due_rows = [r for r in rows if r.instance.startswith("due-")]
    lags = [(r.started - r.slot).total_seconds() for r in due_rows]
    per = {r.instance for r in due_rows}
    moved = [r for r in rows if r.instance == "moved"]
    return {
        "due": due,
        "started": len(due_rows),
        "duplicates": len(due_rows) - len(per),
        "skipped": due - len(per),
        "lag_p50_ms": (common.percentile(lags, 50) or 0) * 1000,
        "lag_p99_ms": (common.percentile(lags, 99) or 0) * 1000,
        "lag_max_ms": max(lags, default=0) * 1000,
        "processes": sorted({r.pid for r in due_rows}).__len__(),
        "moved_lag_ms": (
            (moved[0].started - moved[0].slot).total_seconds() * 1000 if moved else None
        ),
        "moved_slot_ok": bool(moved) and moved[0].slot == moved_slot,
    }


async def _until(engine: AsyncEngine, count: int, seconds: float) -> None:
    """Until ``count`` starts are recorded (at most ``seconds``): read every 0.2 s."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await _count(engine) >= count:
            return
        await asyncio.sleep(0.2)


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(starts))).scalar_one())


async def analyze(url: str) -> None:
    """Table statistics after the bulk insert, as autovacuum's analyze (PostgreSQL) and
    InnoDB's persistent statistics recalculation (MySQL/MariaDB) have them shortly after."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            mysql = engine.dialect.name in ("mysql", "mariadb")
            await conn.execute(
                text("ANALYZE TABLE scheduled_tasks" if mysql else "ANALYZE scheduled_tasks")
            )
    finally:
        await engine.dispose()


async def worker(url: str, batch: int, ahead: float, each: bool) -> None:
    engine = create_async_engine(url, pool_size=5, max_overflow=5)
    job = Digest(engine, each=each)
    registry = _registry(url, job, 1.0, batch=batch, ahead=ahead)
    stop = asyncio.Event()
    import signal

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with registry:
        await registry.wait_until_ready(30)
        print("READY", flush=True)
        await write_notes(job, engine, stop)
    await engine.dispose()


async def startup(url: str) -> None:
    """``--startup``: one instance's start to ready and its RSS then, as JSON on stdout."""
    began = time.perf_counter()
    registry = _registry(url, Digest(), 1.0)
    async with registry:
        await registry.wait_until_ready(60)
        ready = time.perf_counter() - began
        await asyncio.sleep(1.0)  # a poll or more, with the schedules in the table
        print(json.dumps({"seconds": ready, "rss_mb": _rss_mb()}), flush=True)


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def measure_startup(url: str, runs: int = 3) -> dict[str, Any]:
    """``--startup`` in ``runs`` fresh processes: the median start and RSS."""
    seconds, rss = [], []
    for _ in range(runs):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--startup", url, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, out
        figures = json.loads(out.decode().strip().splitlines()[-1])
        seconds.append(figures["seconds"])
        rss.append(figures["rss_mb"])
    return {"seconds": statistics.median(seconds), "rss_mb": statistics.median(rss)}


async def poll_on_server(url: str) -> dict[str, Any]:
    """The poll statement's time on the server: PostgreSQL's ``EXPLAIN ANALYZE`` of the
    statement the scheduler sends (lock-and-fetch, 100 rows at most); MySQL/MariaDB's
    ``ANALYZE FORMAT=JSON`` of its two reads (the due rows, locked; the clock and the next due
    time), each in a transaction rolled back. Median of 20."""
    registry = _registry(url, Digest(), 10.0)
    tasks: Any = registry.store.tasks
    names = list(registry.jobs)
    times: list[float] = []
    try:
        if common.is_mysql_url(url):
            times = await _mysql_poll_times(tasks, names)
        else:
            times = await _postgres_poll_times(tasks, names)
    finally:
        await registry.connection.dispose()
    return {"server_ms": statistics.median(times)}


async def _postgres_poll_times(tasks: Any, names: list[str]) -> list[float]:
    from ekbatan_fastapi.domain.rows import PollingStrategy

    stmt = tasks._poll_statement(PollingStrategy.LOCK_AND_FETCH, True, len(names), 100)
    args = stmt.args({"limit": 100, "picked_by": "bench", "names": names})
    times = []
    async with tasks.db.engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        for _ in range(20):
            tr = driver.transaction()
            await tr.start()
            plan = await driver.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {stmt.sql}", *args)
            await tr.rollback()
            found = json.loads(plan) if isinstance(plan, str) else plan
            times.append(found[0]["Planning Time"] + found[0]["Execution Time"])
    return times


async def _mysql_poll_times(tasks: Any, names: list[str]) -> list[float]:
    from ekbatan_fastapi.store.mysql import statements as mq

    _, lock_due, clock = tasks._polls.scan(True, 0)
    reads = [
        (lock_due.text, {"names": names, "limit": 100}),
        (clock.text, {"names": names, "picked_by": "bench"}),
    ]
    if len(names) <= mq.PER_NAME_MAX:
        due = tasks._polls.per_name(True, len(names), 0)[1]
        reads[0] = (due.text, {"limit": 100, **mq.name_params(names)})
    times = []
    async with tasks.db.engine.connect() as conn:
        for _ in range(20):
            total = 0.0
            for sql, params in reads:
                found = await conn.execute(tasks.db.sql("ANALYZE FORMAT=JSON " + sql), params)
                plan = json.loads(found.scalar_one())
                total += plan["query_block"]["r_total_time_ms"]
                total += plan.get("query_optimization", {}).get("r_total_time_ms", 0.0)
            await conn.rollback()
            times.append(total)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a PostgreSQL or MySQL/MariaDB server on this machine")
    parser.add_argument("--n", type=int, default=100_000, help="schedules created (100,000)")
    parser.add_argument("--due", type=int, default=1000, help="schedules due at once (1,000)")
    parser.add_argument("--quick", action="store_true", help="2,000 schedules, 100 due")
    parser.add_argument("--batch", type=int, default=500, help="the processes' batch_size (500)")
    parser.add_argument(
        "--claim-ahead", type=float, default=1.0, help="the processes' claim_ahead, s (1.0)"
    )
    parser.add_argument(
        "--insert-per-run", action="store_true", help="the job inserts its own note (see above)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--startup", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        await worker(args.worker, args.batch, args.claim_ahead, args.insert_per_run)
        return
    if args.startup:
        await startup(args.startup)
        return
    options = ["--batch", str(args.batch), "--claim-ahead", str(args.claim_ahead)]
    options += ["--insert-per-run"] if args.insert_per_run else []
    n, due = (2000, 100) if args.quick else (args.n, args.due)
    load = os.getloadavg()[0]
    with common.private_postgres(args.url) as server:
        results: dict[str, Any] = {"server": server.kind}
        async with common.fresh_schema(server.url, "ekbatan_bench_sched") as url:
            results["version"] = await _version(url)
            results["startup_empty"] = await measure_startup(url)
            results["poll_empty"] = await measure_poll(url, 3.0)  # the baseline: no rows
            results["create"] = await measure_create(url, n)
            await analyze(url)
            results["startup"] = await measure_startup(url)
            results["poll"] = await measure_poll(url, 3.0)
            results["poll_server"] = await poll_on_server(url)
        async with common.fresh_schema(server.url, "ekbatan_bench_sched") as url:
            engine = create_async_engine(url, pool_size=2)
            try:
                results["due"] = await measure_due(url, due, engine, options)
            finally:
                await engine.dispose()
    results["load"] = [load, os.getloadavg()[0]]
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    print(_summary(results, args))


async def _version(url: str) -> str:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            query = "SELECT VERSION()" if common.is_mysql_url(url) else "SHOW server_version"
            return str((await conn.execute(text(query))).scalar_one())
    finally:
        await engine.dispose()


def _summary(r: dict[str, Any], args: argparse.Namespace) -> str:
    """One Markdown table of the figures (docs/BENCHMARKS.md takes it as it is)."""
    c, p, e, d = r["create"], r["poll"], r["poll_empty"], r["due"]
    s0, s1 = r["startup_empty"], r["startup"]
    n, due = f"{c['n']:,}", f"{d['due']:,}"
    job = "an INSERT per run" if args.insert_per_run else "notes written every 0.1 s"
    rows = [
        ("measure", "target", "figure"),
        ("---", "---:", "---:"),
        (f"create_schedules: {n} in one call", ">= 20,000/s",
         f"{c['per_second']:,.0f}/s ({c['seconds']:.2f} s; client CPU {c['client_cpu']:.2f} s)"),
        ("startup to ready / RSS: no schedule", "",
         f"{s0['seconds']:.2f} s / {s0['rss_mb']:.0f} MB"),
        (f"startup to ready / RSS: {n} schedules", "no growth",
         f"{s1['seconds']:.2f} s / {s1['rss_mb']:.0f} MB"),
        (f"poll statement on the server, {n} not due", "<= 2 ms",
         f"{r['poll_server']['server_ms']:.2f} ms"),
        (f"poll as the scheduler saw it, median / p99: {n} not due", "",
         f"{p['median_ms']:.2f} / {p['p99_ms']:.2f} ms ({p['polls']} polls)"),
        ("poll as the scheduler saw it, median / p99: no row", "",
         f"{e['median_ms']:.2f} / {e['p99_ms']:.2f} ms ({e['polls']} polls)"),
        (f"{due} due in one second, 2 processes ({job}): start lag p50 / p99 / max",
         "p99 <= 50 ms",
         f"{d['lag_p50_ms']:.0f} / {d['lag_p99_ms']:.0f} / {d['lag_max_ms']:.0f} ms"),
        ("duplicates / skipped", "0 / 0", f"duplicates {d['duplicates']}, skipped {d['skipped']}"),
        ("update moving the next slot earlier: start after the new slot", "<= 1 s",
         f"{d['moved_lag_ms']:.1f} ms (slot as updated: {d['moved_slot_ok']})"
         if d["moved_lag_ms"] is not None else "never started"),
    ]  # fmt: skip
    head = (
        f"\nSchedules as data on {r['server']} {r['version']}: batch_size {args.batch}, "
        f"claim_ahead {args.claim_ahead} s; load average {r['load'][0]:.1f} at the start, "
        f"{r['load'][1]:.1f} at the end ({os.cpu_count()} CPUs)\n"
    )
    return head + "\n".join("| " + " | ".join(row) + " |" for row in rows)


if __name__ == "__main__":
    asyncio.run(main())
