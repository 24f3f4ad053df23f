"""The search of a ``PersistentScheduleJob``'s schedules (``list_schedules(..., search=)``, what
``GET /jobs/{name}/schedules?search=`` and the dashboard's search box run) against the plain
listing: N schedules of the job and N of another job, a page of 50, the median of 20 calls
(client side), and the plan of each statement (``EXPLAIN``).

    python bench/schedule_search.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
    python bench/schedule_search.py --url mysql+asyncmy://root@127.0.0.1:3306/test

It creates the database ``ekbatan_bench_search`` on that server and drops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from ekbatan_fastapi import ExecutionContext, PersistentScheduleJob
from ekbatan_fastapi.registry import job_registry
from ekbatan_fastapi.store.migrate import create_schema

DATABASE = "ekbatan_bench_search"
CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain listing", {}),
    ("search 'user-4242' (11 ids match)", {"search": "user-4242"}),
    ("search 'zzz' (none: every row of the job is read)", {"search": "zzz"}),
    ("search '50%' (literal, none)", {"search": "50%"}),
]


class Job(PersistentScheduleJob):
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


async def median_ms(call: Callable[[], Awaitable[list[Any]]], runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def main(server: str, n: int) -> None:
    mysql = server.startswith(("mysql", "mariadb"))
    quote = "`" if mysql else '"'
    admin = create_async_engine(server, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{DATABASE}{quote}"))
        await conn.execute(text(f"CREATE DATABASE {quote}{DATABASE}{quote}"))
    url = server.rsplit("/", 1)[0] + "/" + DATABASE
    engine = create_async_engine(url)
    try:
        await create_schema(engine)
        builder = job_registry().connection_provider(url).with_jobs([Job("digest"), Job("other")])
        registry = builder.build()
        client = registry.client
        for job in ("digest", "other"):
            for start in range(0, n, 10_000):
                ids = range(start, min(n, start + 10_000))
                await client.create_schedules(
                    job, [(f"user-{i}", "DAILY|07:30|Europe/Berlin", {"user_id": i}) for i in ids]
                )
        async with engine.connect() as conn:
            await conn.execute(
                text(("ANALYZE TABLE " if mysql else "ANALYZE ") + "scheduled_tasks")
            )
        print(f"{n:,} schedules of the job, {n:,} of another; a page of 50, median of 20 calls")
        for label, options in CASES:
            ms = await median_ms(lambda o=options: client.list_schedules("digest", limit=50, **o))
            print(f"  {label}: {ms:.1f} ms")
        search = " AND lower(task_instance) LIKE lower('%zzz%') ESCAPE '/'"
        hint = "FORCE INDEX (PRIMARY) " if mysql else ""
        if not mysql:
            search = " AND task_instance ILIKE '%zzz%' ESCAPE '/'"
        for label, where, hinted in [("plain", "", ""), ("search", search, hint)]:
            sql = (
                f"EXPLAIN SELECT * FROM scheduled_tasks {hinted}WHERE task_name = 'digest'"
                f"{where} ORDER BY execution_time, task_instance LIMIT 50"
            )
            async with engine.connect() as conn:
                rows = (await conn.execute(text(sql))).fetchall()
            print(f"  plan, {label}: " + " | ".join(" ".join(map(str, r)) for r in rows))
        await registry.connection.dispose()
    finally:
        await engine.dispose()
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{DATABASE}{quote}"))
        await admin.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a server URL (the database is created)")
    parser.add_argument("-n", type=int, default=100_000, help="schedules of each job")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.n))
