"""History growth (issue 17): ``ekbatan_execution_history`` at 10^7 rows.

Fills the history of a database of its own to ``--rows`` records (ten busy task names and a
``daily`` one, one record in 100,000; finished evenly over a span of which ``--expired`` lies
beyond the 7-day retention), then, in one run:

* **history page**: ``/jobs/{name}/history``'s query (``OperationsStore.history``, what the
  route calls), ``--pages`` times per case: a busy name's first page, its page half-way down,
  the rare name's first page, every name's first page; this version's statement (``now``) and
  the one before it (``task_name = ? ORDER BY id DESC``, ``before``);
* **claim/complete rate**: one in-process scheduler (history on, written into the same big
  table) drains ``--drain`` due one-time tasks of a no-op job, ``--rounds`` times without
  retention, then back to back while the retention runs (``HistoryRecorder.prune``: the
  scheduler's own code, here on the same engine and pool), then ``--rounds`` times after it;
* **retention**: every statement it sent (the edge read and the range delete of each batch)
  timed; the completion statements' times (``SchedulerObserver.results_written``) without
  and during it;
  sessions waiting for a lock, sampled every 50 ms.

    .venv/bin/python bench/history_growth.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/history_growth.py --url mysql+asyncmy://root@127.0.0.1:3306/test \
        --rows 1000000

The chart: ``bench/charts.py RESULTS.json docs/benchmarks/`` (with matplotlib) draws
``history-growth-<dialect>.png`` from ``--json``'s file.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import event, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from bench.common import describe_environment, percentile  # noqa: E402
from ekbatan_fastapi import (  # noqa: E402
    ExecutionContext,
    OneTimeJob,
    SchedulerObserver,
    create_schema,
    job_registry,
)
from ekbatan_fastapi.domain.rows import TaskKey  # noqa: E402
from ekbatan_fastapi.engine.history import HistoryRecorder  # noqa: E402

RETENTION = dt.timedelta(days=7)
BUSY = [f"job-{i}" for i in range(10)]
RARE = "daily"
RARE_EVERY = 100_000
NOOP = "bench-noop"
CHUNK = 1_000_000


def _is_mysql(url: str) -> bool:
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, name: str | None) -> AsyncIterator[str]:
    """A database of this run's own on the server (``name`` or a random one), with the
    library's tables; dropped afterwards."""
    name = name or f"ekbatan_hist_bench_{uuid.uuid4().hex[:8]}"
    mysql = _is_mysql(server_url)
    quoted = f"`{name}`" if mysql else f'"{name}"'
    admin = create_async_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {quoted}"))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        engine = create_async_engine(url, poolclass=NullPool)
        await create_schema(engine)
        await engine.dispose()
        yield url
    finally:
        with contextlib.suppress(Exception):
            async with admin.connect() as conn:
                force = "" if mysql else " WITH (FORCE)"
                await conn.execute(text(f"DROP DATABASE {quoted}{force}"))
        await admin.dispose()


_PG_FILL = """
INSERT INTO ekbatan_execution_history (task_name, task_instance, execution_time, picked_by,
    started_at, finished_at, outcome)
SELECT CASE WHEN i % :rare = 0 THEN :rare_name ELSE 'job-' || (i % 10) END, 'recurring', t,
       'bench', t - interval '5 milliseconds', t, 'succeeded'
FROM (SELECT i, CAST(:start AS timestamptz) + i * CAST(:step AS interval) AS t
      FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS i) AS s
"""

_MY_FILL = """
INSERT INTO ekbatan_execution_history (task_name, task_instance, execution_time, picked_by,
    started_at, finished_at, outcome)
SELECT CASE WHEN MOD(i, :rare) = 0 THEN :rare_name ELSE CONCAT('job-', MOD(i, 10)) END,
       'recurring', t, 'bench', t - INTERVAL 5000 MICROSECOND, t, 'succeeded'
FROM (SELECT :first + a.n + 1000 * b.n AS i,
             :start + INTERVAL ((:first + a.n + 1000 * b.n) * :step_us) MICROSECOND AS t
      FROM ekbatan_bench_seq a CROSS JOIN ekbatan_bench_seq b
      WHERE :first + a.n + 1000 * b.n <= :last) AS s
"""


async def fill(engine: AsyncEngine, rows: int, expired: float) -> dict[str, Any]:
    """``rows`` records finished evenly over a span whose oldest ``expired`` part is past the
    retention; returns the span and how long the fill took."""
    span = RETENTION / (1 - expired)
    step = span / rows
    mysql = engine.dialect.name in ("mysql", "mariadb")
    now = dt.datetime.now(dt.UTC)
    start = now - span
    began = time.perf_counter()
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with auto.connect() as conn:
        if mysql:
            await conn.execute(text("CREATE TABLE ekbatan_bench_seq (n INT PRIMARY KEY)"))
            await conn.execute(
                text(
                    "INSERT INTO ekbatan_bench_seq (n) VALUES "
                    + ",".join(f"({n})" for n in range(1000))
                )
            )
        for first in range(1, rows + 1, CHUNK):
            last = min(rows, first + CHUNK - 1)
            params: dict[str, Any] = {
                "rare": RARE_EVERY,
                "rare_name": RARE,
                "first": first,
                "last": last,
            }
            if mysql:
                params |= {
                    "start": start.replace(tzinfo=None),
                    "step_us": step // dt.timedelta(microseconds=1),
                }
                await conn.execute(text(_MY_FILL), params)
            else:
                params |= {"start": start, "step": step}
                await conn.execute(text(_PG_FILL), params)
            print(f"  filled {last:,} rows ({time.perf_counter() - began:.0f} s)", flush=True)
        if mysql:
            await conn.execute(text("DROP TABLE ekbatan_bench_seq"))
            await conn.execute(text("ANALYZE TABLE ekbatan_execution_history"))
        else:
            await conn.execute(text("VACUUM ANALYZE ekbatan_execution_history"))
    return {"span_days": span / dt.timedelta(days=1), "fill_s": time.perf_counter() - began}


# -- the history page ----------------------------------------------------------------------


async def history_pages(registry: Any, url: str, rows: int, pages: int) -> list[dict[str, Any]]:
    """p50/p99 of the history page, this version's statement and the one before it; on
    PostgreSQL also in a generic plan (``plan_cache_mode = force_generic_plan``: what a
    prepared statement may settle on)."""
    ops = registry.store.operations
    h = ops.tables.history
    cases = [
        ("busy name, first page", BUSY[3], None),
        ("busy name, half-way down", BUSY[3], rows // 2),
        ("rare name, first page", RARE, None),
        ("every name, first page", None, None),
    ]
    engines: dict[str, AsyncEngine] = {"auto": registry.engine}
    if not _is_mysql(url):
        engines["generic"] = create_async_engine(
            url,
            poolclass=NullPool,
            connect_args={"server_settings": {"plan_cache_mode": "force_generic_plan"}},
        )
    out = []
    try:
        for plan, engine in engines.items():
            for label, name, before in cases:
                for version in ("now", "before"):
                    if version == "before" and name is None:
                        continue
                    if version == "now":
                        stmt = ops.history_query(name, limit=50, before_id=before)
                    else:
                        stmt = (
                            select(h).where(h.c.task_name == name).order_by(h.c.id.desc()).limit(50)
                        )
                        if before is not None:
                            stmt = stmt.where(h.c.id < before)
                    took = []
                    found = 0
                    async with engine.connect() as conn:
                        for _ in range(pages if plan == "auto" else max(3, pages // 10)):
                            began = time.perf_counter()
                            found = len((await conn.execute(stmt)).fetchall())
                            took.append(time.perf_counter() - began)
                    row = {
                        "case": label,
                        "statement": version,
                        "plan": plan,
                        "records": found,
                        "p50_ms": percentile(took, 50) * 1000,  # type: ignore[operator]
                        "p99_ms": percentile(took, 99) * 1000,  # type: ignore[operator]
                        "max_ms": max(took) * 1000,
                    }
                    out.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if "generic" in engines:
            await engines["generic"].dispose()
    return out


class _LockWaits:
    """Samples, every 50 ms on a connection of its own, how many sessions of the database
    wait for a lock (PostgreSQL: ``pg_stat_activity``; InnoDB: ``innodb_trx``)."""

    def __init__(self, url: str) -> None:
        self.engine = create_async_engine(url, poolclass=NullPool)
        self.sql = (
            "SELECT trx_query FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
            if _is_mysql(url)
            else "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        self.phase = "alone"
        self.samples: dict[str, list[int]] = {}
        self.waiting: dict[str, collections.Counter[str]] = {}
        """Per phase: the waiting statements' first words, how often seen."""
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            while True:
                waiting = [str(q) for q in (await conn.execute(text(self.sql))).scalars()]
                self.samples.setdefault(self.phase, []).append(len(waiting))
                seen = self.waiting.setdefault(self.phase, collections.Counter())
                seen.update(" ".join(q.split())[:70] for q in waiting)
                await asyncio.sleep(0.05)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, dict[str, Any]]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.engine.dispose()
        return {
            phase: {
                "samples": len(v),
                "with_waits": sum(1 for n in v if n),
                "max": max(v),
                "statements": dict(self.waiting.get(phase, collections.Counter()).most_common(3)),
            }
            for phase, v in self.samples.items()
        }


# -- the scheduler and the retention ---------------------------------------------------------


class _Completions(SchedulerObserver):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def results_written(
        self,
        items: Any,
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        self.seconds.append(seconds)


class _Noop(OneTimeJob):
    def __init__(self) -> None:
        self.runs = 0

    def name(self) -> str:
        return NOOP

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs += 1


async def _add_due(engine: AsyncEngine, n: int, round_no: int) -> None:
    mysql = engine.dialect.name in ("mysql", "mariadb")
    async with engine.begin() as conn:
        if mysql:
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time,"
                    " picked, version, priority) SELECT :name, CONCAT(:prefix, n), "
                    "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, false, 1, 0 FROM "
                    "(SELECT a.n + 1000 * b.n AS n FROM ekbatan_bench_due a CROSS JOIN"
                    " ekbatan_bench_due b) AS s WHERE n < :n"
                ),
                {"name": NOOP, "prefix": f"r{round_no}-", "n": n},
            )
        else:
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time,"
                    " picked, version, priority) SELECT :name, :prefix || g,"
                    " now() - interval '1 minute', false, 1, 0 FROM generate_series(1, :n) AS g"
                ),
                {"name": NOOP, "prefix": f"r{round_no}-", "n": n},
            )


async def _drain(registry: Any, job: _Noop, n: int, round_no: int, timeout: float) -> float:
    """Executions per second while ``n`` due rows are claimed, run and completed."""
    target = job.runs + n
    await _add_due(registry.engine, n, round_no)
    began = time.perf_counter()
    registry.scheduler.request_poll()
    deadline = began + timeout
    while job.runs < target:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"drain {round_no}: {job.runs}/{target} after {timeout:.0f} s")
        await asyncio.sleep(0.005)
    return n / (time.perf_counter() - began)


class _Statements:
    """Every retention statement's time (SQLAlchemy's cursor events)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine.sync_engine
        self.times: dict[str, list[float]] = {"edge read": [], "range delete": []}
        self._began: dict[int, tuple[str, float]] = {}
        event.listen(self.engine, "before_cursor_execute", self._before)
        event.listen(self.engine, "after_cursor_execute", self._after)

    def _kind(self, statement: str) -> str | None:
        head = statement.lstrip()[:80].upper()
        if head.startswith("DELETE FROM EKBATAN_EXECUTION_HISTORY"):
            return "range delete"
        if head.startswith("SELECT EKBATAN_EXECUTION_HISTORY.FINISHED_AT"):
            return "edge read"
        return None

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        kind = self._kind(statement)
        if kind is not None:
            self._began[id(cursor)] = (kind, time.perf_counter())

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        found = self._began.pop(id(cursor), None)
        if found is not None:
            self.times[found[0]].append(time.perf_counter() - found[1])

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50) * 1000,  # type: ignore[operator]
        "p99_ms": percentile(values, 99) * 1000,  # type: ignore[operator]
        "max_ms": max(values) * 1000,
    }


async def rates_and_retention(
    registry: Any,
    url: str,
    job: _Noop,
    probe: _Completions,
    drain: int,
    rounds: int,
    batch_size: int,
) -> dict[str, Any]:
    ops = registry.store.operations
    engine: AsyncEngine = registry.engine
    if engine.dialect.name in ("mysql", "mariadb"):
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE ekbatan_bench_due (n INT PRIMARY KEY)"))
            await conn.execute(
                text(
                    "INSERT INTO ekbatan_bench_due (n) VALUES "
                    + ",".join(f"({n})" for n in range(1000))
                )
            )
    waits = _LockWaits(url)
    waits.start()
    timeout = max(60.0, drain / 50)
    rounds_out: list[dict[str, Any]] = []
    counter = 0
    try:
        await _drain(registry, job, min(drain, 1000), counter, timeout)  # warm up
        for _ in range(rounds):
            counter += 1
            probe.seconds.clear()
            rate = await _drain(registry, job, drain, counter, timeout)
            rounds_out.append({"phase": "alone", "rate": rate, "finish": _ms(probe.seconds)})
            print(json.dumps(rounds_out[-1]), flush=True)
        recorder = HistoryRecorder(
            ops, "bench-retention", history=True, retention=RETENTION, on_db_error=print
        )
        statements = _Statements(engine)
        batches: list[tuple[int, float]] = []
        began = time.perf_counter()
        waits.phase = "during retention"
        prune = asyncio.create_task(
            recorder.prune(batch_size=batch_size, on_batch=lambda n, s: batches.append((n, s)))
        )
        while not prune.done():
            counter += 1
            probe.seconds.clear()
            rate = await _drain(registry, job, drain, counter, timeout)
            phase = "during retention" if not prune.done() else "retention ended meanwhile"
            rounds_out.append({"phase": phase, "rate": rate, "finish": _ms(probe.seconds)})
            print(json.dumps(rounds_out[-1]), flush=True)
        pruned = await prune
        retention_s = time.perf_counter() - began
        statements.close()
        waits.phase = "after"
        for _ in range(rounds):
            counter += 1
            probe.seconds.clear()
            rate = await _drain(registry, job, drain, counter, timeout)
            rounds_out.append({"phase": "after", "rate": rate, "finish": _ms(probe.seconds)})
            print(json.dumps(rounds_out[-1]), flush=True)
    finally:
        lock_waits = await waits.stop()
    sizes = [n for n, _ in batches]
    return {
        "rounds": rounds_out,
        "lock_waits": lock_waits,
        "retention": {
            "pruned": pruned,
            "seconds": retention_s,
            "batches": len(batches),
            "batch_rows_max": max(sizes) if sizes else 0,
            "batch_rows_min": min(sizes) if sizes else 0,
            "batch": _ms([s for _, s in batches]),
            **{kind: _ms(times) for kind, times in statements.times.items()},
        },
    }


async def measure(
    server_url: str,
    *,
    rows: int,
    expired: float,
    pages: int,
    drain: int,
    rounds: int,
    batch_size: int = 5000,
    database: str | None = None,
    settle: float = 0.0,
) -> dict[str, Any]:
    info = describe_environment()
    info["load_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    async with fresh_database(server_url, database) as url:
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            filled = await fill(engine, rows, expired)
            async with engine.connect() as conn:
                version_sql = "SELECT VERSION()" if _is_mysql(url) else "SHOW server_version"
                info["server"] = str((await conn.execute(text(version_sql))).scalar_one())
        finally:
            await engine.dispose()
        print(f"filled {rows:,} rows in {filled['fill_s']:.0f} s", flush=True)
        await asyncio.sleep(settle)  # InnoDB flushes and purges after the fill for a while
        job = _Noop()
        completions = _Completions()
        registry = (
            job_registry()
            .connection_provider(url)
            .with_job(job)
            .shutdown_max_wait(dt.timedelta(seconds=5))
            # the scheduler's own retention stays out of the way: the harness runs it
            .customize_scheduler(lambda b: b.history_retention(dt.timedelta(days=3650)))
            .customize_scheduler(lambda b: b.observer(completions))
            .build()
        )
        await registry.start()
        try:
            assert await registry.wait_until_ready(30), registry.status()
            pages_out = await history_pages(registry, url, rows, pages)
            run = await rates_and_retention(
                registry, url, job, completions, drain, rounds, batch_size
            )
        finally:
            await registry.stop()
    info["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "info": info,
        "rows": rows,
        "expired": expired,
        "fill": filled,
        "pages": pages_out,
        **run,
    }


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(result: dict[str, Any]) -> str:
    lines = [
        "| history page (50 records) | statement | plan | p50 ms | p99 ms | max ms |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in result["pages"]:
        lines.append(
            f"| {r['case']} | {r['statement']} | {r['plan']} | {_f(r['p50_ms'], 2)} |"
            f" {_f(r['p99_ms'], 2)} | {_f(r['max_ms'], 2)} |"
        )
    ret = result["retention"]
    lines += [
        "",
        f"retention: {ret['pruned']:,} records in {ret['batches']} batches of"
        f" {ret['batch_rows_min']:,}-{ret['batch_rows_max']:,}, {ret['seconds']:.1f} s",
        "",
        "| retention statement | n | p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("edge read", "range delete", "batch"):
        s = ret[kind]
        lines.append(
            f"| {kind} | {s['n']} | {_f(s['p50_ms'], 2)} | {_f(s['p99_ms'], 2)} |"
            f" {_f(s['max_ms'], 2)} |"
        )
    lines += [
        "",
        "| drain round | executions/s | completion p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rounds"]:
        f = r["finish"]
        lines.append(
            f"| {r['phase']} | {r['rate']:,.0f} | {_f(f['p50_ms'], 2)} | {_f(f['p99_ms'], 2)} |"
            f" {_f(f['max_ms'], 2)} |"
        )
    alone = [r["rate"] for r in result["rounds"] if r["phase"] in ("alone", "after")]
    during = [r["rate"] for r in result["rounds"] if r["phase"] == "during retention"]
    if alone and during:
        a, d = percentile(alone, 50), percentile(during, 50)
        assert a is not None and d is not None
        lines += ["", f"median rate during retention / without (before and after): {d / a:.2f}x"]
    lines += [
        "",
        "| phase | samples (every 50 ms) | with a session waiting for a lock | max waiting |"
        " which statements waited |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for phase, w in result["lock_waits"].items():
        which = "; ".join(f"`{q}...` x{n}" for q, n in w["statements"].items()) or "-"
        lines.append(f"| {phase} | {w['samples']} | {w['with_waits']} | {w['max']} | {which} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="a server URL (a database to start from)")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--expired", type=float, default=0.1, help="part of the rows past retention")
    p.add_argument("--pages", type=int, default=200, help="history pages timed per case")
    p.add_argument("--drain", type=int, default=10_000, help="due rows per drain round")
    p.add_argument("--rounds", type=int, default=3, help="drain rounds before and after retention")
    p.add_argument("--batch-size", type=int, default=5000)
    p.add_argument("--database", help="the database to create (default: a random name)")
    p.add_argument("--settle", type=float, default=0.0, help="seconds to wait after the fill")
    p.add_argument("--json", type=Path, help="the results (bench/charts.py draws them)")
    args = p.parse_args(argv)
    if not 0 < args.expired < 1:
        p.error(f"--expired must be between 0 and 1 (a part of the rows), got {args.expired}")
    result = asyncio.run(
        measure(
            args.url,
            rows=args.rows,
            expired=args.expired,
            pages=args.pages,
            drain=args.drain,
            rounds=args.rounds,
            batch_size=args.batch_size,
            database=args.database,
            settle=args.settle,
        )
    )
    print(json.dumps(result["info"]))
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
