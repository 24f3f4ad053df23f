"""What MySQL/MariaDB's server spends on many job names, and what a names table would save
(issue 17, "Names": a probe for the next round, not the library's code path).

With many names the poll's statements carry them as an ``IN`` list written into the text
(``store/mysql/hot.py``): the client escapes them once, but the server parses and converts the
list at every statement. This times, on a fresh ``scheduled_tasks`` holding one row per name
(due in 2099: an idle poll finds nothing), the library's own idle lock-and-fetch poll
(``TaskStore.poll``) against the same two statements (``statements.lock_due`` and
``statements.clock``, their texts unchanged but for the names) reading the names from a
session temporary table, and how long filling that table takes. Medians of ``--repeat``.

    .venv/bin/python bench/names_table_probe.py --url mysql+asyncmy://root@127.0.0.1:3306/test
    .venv/bin/python bench/names_table_probe.py --url ... --names 1000 10000 100000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncConnection  # noqa: E402

from ekbatan_fastapi.domain.rows import PollingStrategy  # noqa: E402
from ekbatan_fastapi.store.database import chunks  # noqa: E402
from ekbatan_fastapi.store.mysql import statements  # noqa: E402

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

_TABLE = "ekbatan_probe_names"
_BY_TABLE = f"task_name IN (SELECT name FROM {_TABLE})"


async def measure(url: str, sizes: tuple[int, ...], repeat: int) -> list[dict[str, Any]]:
    """One row per number of names: the idle poll's wall ms with the names in the text and
    from a temporary table, and the table's fill time."""
    if not common.is_mysql_url(url):
        raise SystemExit(
            f"names_table_probe.py measures MySQL/MariaDB only, not {url!r}: "
            "pass --url mysql+asyncmy://root@127.0.0.1:3306/test"
        )
    results: list[dict[str, Any]] = []
    async with common.fresh_task_store(url, "bench_names") as (engine, store):
        for size in sizes:
            names = [f"job-{i:06d}" for i in range(size)]
            await _fill(engine, names)
            in_text = await _timed_library(store, names, repeat)
            async with engine.connect() as conn:
                fill = await _names_table(conn, names)
                locks, clocks = await _timed_by_table(conn, repeat)
            results.append(
                {
                    "names": size,
                    "in_text_ms": in_text,
                    "table_ms": locks + clocks,
                    "table_lock_ms": locks,
                    "table_clock_ms": clocks,
                    "fill_s": fill,
                }
            )
            print(results[-1], flush=True)
    return results


async def _fill(engine: Any, names: list[str]) -> None:
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


async def _timed_library(store: Any, names: list[str], repeat: int) -> float:
    walls: list[float] = []
    for i in range(repeat + 2):  # two warm-ups (the first escapes and keeps the names)
        began = time.perf_counter()
        result = await store.poll(names, 50, "bench", PollingStrategy.LOCK_AND_FETCH)
        if i >= 2:
            walls.append((time.perf_counter() - began) * 1000)
        assert not result.claimed
    return statistics.median(walls)


async def _names_table(conn: AsyncConnection, names: list[str]) -> float:
    began = time.perf_counter()  # a new connection: no such table yet
    await conn.execute(
        text(f"CREATE TEMPORARY TABLE {_TABLE} (name VARCHAR(100) PRIMARY KEY) ENGINE=InnoDB")
    )
    for part in chunks(names, 5000):
        await conn.execute(
            text(f"INSERT INTO {_TABLE} (name) VALUES (:n)"), [{"n": n} for n in part]
        )
    await conn.commit()
    return time.perf_counter() - began


async def _timed_by_table(conn: AsyncConnection, repeat: int) -> tuple[float, float]:
    """Wall ms of the two statements apart: the due rows' lock, and the clock's next due time."""
    lock_due = statements.lock_due("scheduled_tasks", None).replace(
        "task_name IN :names", _BY_TABLE
    )
    clock = statements.clock("scheduled_tasks", None).replace("task_name IN :names", _BY_TABLE)
    assert _BY_TABLE in lock_due and _BY_TABLE in clock, "the statements' names changed form"
    walls: list[tuple[float, float]] = []
    for i in range(repeat + 2):
        began = time.perf_counter()
        async with conn.begin():
            rows = (await conn.execute(text(lock_due), {"limit": 50})).all()
            locked = time.perf_counter()
            (await conn.execute(text(clock))).all()
        if i >= 2:
            walls.append(((locked - began) * 1000, (time.perf_counter() - locked) * 1000))
        assert not rows
    return statistics.median(a for a, _ in walls), statistics.median(b for _, b in walls)


def table(results: list[dict[str, Any]]) -> str:
    headers = (
        "names",
        "idle poll, names in the text (ms)",
        "names from a temporary table (ms)",
        "of which the due rows' lock",
        "the next due time",
        "filling the table (s, once per connection)",
    )
    keys = ("in_text_ms", "table_ms", "table_lock_ms", "table_clock_ms")
    rows = [
        [f"{r['names']:,}", *(f"{r[k]:.2f}" for k in keys), f"{r['fill_s']:.3f}"] for r in results
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
