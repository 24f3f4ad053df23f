"""The dead-execution check's cost with many job names (issue 17, "Names").

In a database of its own, times the task store's ``revive_dead(names, dead_after)``: the
statement the housekeeper sends once per heartbeat interval and at the moment the next picked
row would die. For each number of picked rows (all alive: nothing to revive, the common case),
``--repeat`` checks after two warm-ups; per check the client's CPU (``time.process_time``:
building and encoding the parameters, decoding the answer) and the wall time (the round
trip, which is mostly the server's work); and the same for an idle poll (lock-and-fetch, 50
rows, nothing due). Medians.

    .venv/bin/python bench/revive_names.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/revive_names.py --url ... --names 100000 --picked 0 1000
    .venv/bin/python bench/revive_names.py --url mysql+asyncmy://root@127.0.0.1:3306/test  # MariaDB

Run it from another checkout (``PYTHONPATH=<checkout>``) to compare versions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from ekbatan_fastapi.domain.rows import PollingStrategy  # noqa: E402

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]


async def measure(
    url: str, names: int, picked: tuple[int, ...], repeat: int
) -> list[dict[str, Any]]:
    """One row per number of picked rows: client CPU and wall ms per check (medians)."""
    job_names = [f"job-{i}" for i in range(names)]
    results: list[dict[str, Any]] = []
    async with common.fresh_task_store(url, "bench_revive") as (engine, store):
        for count in picked:
            await _fill(engine, count)
            results.append(await _timed(store, job_names, count, repeat))
            print(results[-1], flush=True)
    return results


_FILL = {
    "postgresql": (
        "SELECT 'job-' || i, 'r', now(), true, 'x', now() + interval '1 hour', 1 "
        "FROM generate_series(1, :n) AS i",
        "ANALYZE scheduled_tasks",
    ),
    "mysql": (  # MariaDB's sequence engine (MySQL 8 has no seq_ tables)
        "SELECT concat('job-', seq), 'r', UTC_TIMESTAMP(6), 1, 'x', "
        "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 1 FROM seq_1_to_1000000 LIMIT :n",
        "ANALYZE TABLE scheduled_tasks",
    ),
}


async def _fill(engine: Any, count: int) -> None:
    """``count`` picked rows, alive for an hour: nothing to revive."""
    rows, analyze = _FILL[engine.dialect.name]
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE TABLE scheduled_tasks"))  # no dead rows left behind
        if count:
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, "
                    "picked, picked_by, last_heartbeat, version) " + rows
                ),
                {"n": count},
            )
        await conn.execute(text(analyze))


async def _timed(store: Any, names: list[str], count: int, repeat: int) -> dict[str, Any]:
    cpu: list[float] = []
    wall: list[float] = []
    poll_cpu: list[float] = []
    poll_wall: list[float] = []
    for i in range(repeat + 2):  # two warm-ups
        began_cpu, began = time.process_time(), time.perf_counter()
        revival = await store.revive_dead(names, timedelta(seconds=40))
        checked_cpu, checked = time.process_time(), time.perf_counter()
        result = await store.poll(names, 50, "bench", PollingStrategy.LOCK_AND_FETCH)
        if i >= 2:
            cpu.append((checked_cpu - began_cpu) * 1000)
            wall.append((checked - began) * 1000)
            poll_cpu.append((time.process_time() - checked_cpu) * 1000)
            poll_wall.append((time.perf_counter() - checked) * 1000)
        assert not revival.revived and not result.claimed
    return {
        "names": len(names),
        "picked": count,
        "cpu_ms": statistics.median(cpu),
        "wall_ms": statistics.median(wall),
        "poll_cpu_ms": statistics.median(poll_cpu),
        "poll_wall_ms": statistics.median(poll_wall),
    }


def table(results: list[dict[str, Any]]) -> str:
    headers = (
        "names",
        "picked rows",
        "client CPU ms per check",
        "wall ms per check",
        "idle poll: client CPU ms",
        "wall ms",
    )
    keys = ("cpu_ms", "wall_ms", "poll_cpu_ms", "poll_wall_ms")
    rows = [
        [f"{r['names']:,}", f"{r['picked']:,}", *(f"{r[k]:.2f}" for k in keys)] for r in results
    ]
    return common.markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", required=True, help="postgresql+asyncpg://... or mysql+asyncmy://... (MariaDB)"
    )
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--picked", type=int, nargs="+", default=[0, 1000])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args.url, args.names, tuple(args.picked), args.repeat))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
