"""What MySQL/MariaDB spends on many job names: the names in each statement's text against the
library's names table (issue 17, "Names"; ``store/mysql/names.py``).

From ``NAMES_TABLE_MIN`` (500) names on, the library reads an instance's names from a session
temporary table, filled once per pooled connection; below it (and on an engine without a pool)
they go in the statements' text as an ``IN`` list, which the server parses at every statement.
On a fresh ``scheduled_tasks`` holding one row per name (due in 2099: an idle poll finds
nothing), this times the library's own idle lock-and-fetch poll (``TaskStore.poll``) and
dead-execution check (``TaskStore.revive_dead``) both ways (the text form by switching the
store's names table off), the client CPU of a poll, and the first poll on a new connection
(which fills the table). Medians of ``--repeat``.

    .venv/bin/python bench/names_table_probe.py --url mysql+asyncmy://root@127.0.0.1:3306/test
    .venv/bin/python bench/names_table_probe.py --url ... --names 1000 10000 100000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

from ekbatan_fastapi.domain.rows import PollingStrategy  # noqa: E402
from ekbatan_fastapi.store.database import chunks  # noqa: E402
from ekbatan_fastapi.store.dialects import open_store  # noqa: E402

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

_DEAD_AFTER = timedelta(minutes=1)


async def measure(url: str, sizes: tuple[int, ...], repeat: int) -> list[dict[str, Any]]:
    """One row per number of names: poll and dead-check wall ms, names in the text and from
    the table; the poll's client CPU ms both ways; the first poll on a new connection."""
    if not common.is_mysql_url(url):
        raise SystemExit(
            f"names_table_probe.py measures MySQL/MariaDB only, not {url!r}: "
            "pass --url mysql+asyncmy://root@127.0.0.1:3306/test"
        )
    results: list[dict[str, Any]] = []
    async with common.fresh_schema(url, "bench_names") as db_url:
        for size in sizes:
            names = [f"job-{i:06d}" for i in range(size)]
            engine = create_async_engine(db_url, pool_size=2, max_overflow=0)
            try:
                await _fill(engine, names)
                row = await _both_ways(engine, names, repeat)
            finally:
                await engine.dispose()
            results.append({"names": size, **row})
            print(results[-1], flush=True)
    return results


async def _fill(engine: AsyncEngine, names: list[str]) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE TABLE scheduled_tasks"))
        for part in chunks(names, 5000):
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, "
                    "picked, version) VALUES (:n, 'recurring', '2099-01-01', 0, 1)"
                ),
                [{"n": n} for n in part],
            )
        await conn.execute(text("ANALYZE TABLE scheduled_tasks"))


async def _both_ways(engine: AsyncEngine, names: list[str], repeat: int) -> dict[str, float]:
    dialect = engine.dialect.name
    by_table: Any = open_store(engine, dialect).tasks
    in_text: Any = open_store(engine, dialect).tasks
    in_text._names.enabled = False  # the form below NAMES_TABLE_MIN, at any count

    async def poll(store: Any) -> None:
        result = await store.poll(names, 50, "bench", PollingStrategy.LOCK_AND_FETCH)
        assert not result.claimed

    async def dead(store: Any) -> None:
        assert not (await store.revive_dead(names, _DEAD_AFTER)).revived

    began = time.perf_counter()
    await poll(by_table)  # a new connection: fills the table
    first = (time.perf_counter() - began) * 1000
    text_poll, text_cpu = await _timed(lambda: poll(in_text), repeat)
    table_poll, table_cpu = await _timed(lambda: poll(by_table), repeat)
    text_dead, _ = await _timed(lambda: dead(in_text), repeat)
    table_dead, _ = await _timed(lambda: dead(by_table), repeat)
    return {
        "text_poll_ms": text_poll,
        "table_poll_ms": table_poll,
        "text_dead_ms": text_dead,
        "table_dead_ms": table_dead,
        "text_cpu_ms": text_cpu,
        "table_cpu_ms": table_cpu,
        "first_poll_ms": first,
    }


async def _timed(run: Callable[[], Awaitable[None]], repeat: int) -> tuple[float, float]:
    """Median wall and client-CPU ms of ``run`` after two warm-ups (the first escapes the
    names, or fills the second pooled connection's table)."""
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(repeat + 2):
        began, cpu = time.perf_counter(), time.process_time()
        await run()
        if i >= 2:
            walls.append((time.perf_counter() - began) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def table(results: list[dict[str, Any]]) -> str:
    headers = (
        "names",
        "idle poll, names in the text (ms)",
        "idle poll, names table (ms)",
        "dead-execution check, text / table (ms)",
        "client CPU per poll, text / table (ms)",
        "first poll on a new connection (fills the table, ms)",
    )
    rows = [
        [
            f"{r['names']:,}",
            f"{r['text_poll_ms']:.2f}",
            f"{r['table_poll_ms']:.2f}",
            f"{r['text_dead_ms']:.2f} / {r['table_dead_ms']:.2f}",
            f"{r['text_cpu_ms']:.2f} / {r['table_cpu_ms']:.2f}",
            f"{r['first_poll_ms']:.0f}",
        ]
        for r in results
    ]
    return common.markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="mysql+asyncmy://... (MySQL 8 / MariaDB)")
    parser.add_argument("--names", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args.url, tuple(args.names), args.repeat))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
