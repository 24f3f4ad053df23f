"""Poll statement time as rows of other task names grow (issue 17's first bend).

For each size F of foreign rows (ten task names this scheduler does not know, half of their
rows long due, half due tomorrow: another application sharing the table, or unresolved rows),
the table also holds what the workers know: ``bench-noop`` with 20,000 due rows and ten
recurring jobs due in an hour. It times, on PostgreSQL, the poll statements the scheduler
sends (``TaskStore.statements``' text, asyncpg prepared, 50 rows, each run in a transaction
rolled back so that every run sees the same table):

* ``claim``: lock-and-fetch, 50 due rows claimed;
* ``fetch``: the fetch strategy's candidate read;
* ``idle``: lock-and-fetch with only the recurring names (nothing due: an idle instance's poll),

each with the statement of this version (per known name, ``window``) and the one before it
(rows read in time order, names filtered: ``--before``), in a custom and a generic plan
(``plan_cache_mode``). Figures are medians of ``--repeat`` runs.

    .venv/bin/python bench/foreign_rows.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ekbatan_fastapi.store.postgresql import statements as q  # noqa: E402
from ekbatan_fastapi.store.tables import create_schema  # noqa: E402

KNOWN_DUE = 20_000
RECURRING = [f"job-{i}" for i in range(10)]
SIZES = (0, 10_000, 100_000, 1_000_000)


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def _fill(conn: asyncpg.Connection, foreign: int) -> None:
    await conn.execute("TRUNCATE scheduled_tasks")
    await conn.execute(
        "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, version,"
        " priority) SELECT 'foreign-' || (i % 10), 'i' || i, CASE WHEN i % 2 = 0 THEN now() -"
        " interval '1 day' ELSE now() + interval '1 day' END, false, 1, 0"
        " FROM generate_series(1, $1) AS i",
        foreign,
    )
    await conn.execute(
        "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, version,"
        " priority) SELECT 'bench-noop', 'n' || i, now() - interval '1 minute', false, 1, 0"
        " FROM generate_series(1, $1) AS i",
        KNOWN_DUE,
    )
    await conn.execute(
        "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, version,"
        " priority) SELECT unnest($1::text[]), 'recurring', now() + interval '1 hour', false, 1, 0",
        RECURRING,
    )
    await conn.execute("VACUUM ANALYZE scheduled_tasks")


async def _timed(conn: asyncpg.Connection, sql: str, args: list[Any], generic: bool) -> float:
    mode = "force_generic_plan" if generic else "force_custom_plan"
    await conn.execute(f"SET plan_cache_mode = {mode}")
    stmt = await conn.prepare(sql)
    tr = conn.transaction()
    await tr.start()
    try:
        began = time.perf_counter()
        await stmt.fetch(*args)
        return (time.perf_counter() - began) * 1000
    finally:
        await tr.rollback()


async def measure(url: str, sizes: tuple[int, ...], repeat: int) -> list[dict[str, Any]]:
    base = _plain(url)
    name = f"bench_foreign_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(base)
    await admin.execute(f"CREATE DATABASE {name}")
    results: list[dict[str, Any]] = []
    try:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(url.rsplit("/", 1)[0] + f"/{name}")
        await create_schema(engine, operations=True)
        await engine.dispose()
        conn = await asyncpg.connect(base.rsplit("/", 1)[0] + f"/{name}")
        try:
            for size in sizes:
                await _fill(conn, size)
                for version, window in (("now", True), ("before", False)):
                    for generic in (False, True):
                        row: dict[str, Any] = {
                            "foreign": size,
                            "statement": version,
                            "plan": "generic" if generic else "custom",
                        }
                        for kind in ("claim", "fetch", "idle"):
                            locking = kind != "fetch"
                            w = q.window(50, locking=locking) if window else None
                            make = q.lock_and_fetch if locking else q.fetch_candidates
                            stmt = q.Statement("poll", make("scheduled_tasks", None, window=w))
                            names = RECURRING if kind == "idle" else ["bench-noop", *RECURRING]
                            params = {"names": names, "limit": 50, "picked_by": "bench"}
                            args = stmt.args(params)
                            took = [
                                await _timed(conn, stmt.sql, args, generic)
                                for _ in range(repeat + 1)
                            ][1:]
                            row[kind] = statistics.median(took)
                        results.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            await conn.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| foreign rows | statement | plan | claim 50 ms | fetch ms | idle poll ms |",
        "| ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['foreign']:,} | {r['statement']} | {r['plan']} | {r['claim']:.2f} | "
            f"{r['fetch']:.2f} | {r['idle']:.2f} |"
        )
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for version in ("now", "before"):
        for plan, style in (("custom", "-"), ("generic", "--")):
            for kind, marker in (("claim", "o"), ("idle", "s")):
                pts = [
                    (max(r["foreign"], 1), r[kind])
                    for r in results
                    if r["statement"] == version and r["plan"] == plan
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, style, marker=marker, label=f"{kind}, {version}, {plan}")
    ax.set_xscale("symlog", linthresh=10_000)
    ax.set_yscale("log")
    ax.set_xlabel("rows of task names the scheduler does not know")
    ax.set_ylabel("statement time, ms (median)")
    ax.set_title("Poll statement time vs foreign rows (PostgreSQL)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--url", required=True, help="postgresql+asyncpg://... (a database to start from)"
    )
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--json", type=Path)
    p.add_argument("--chart", type=Path)
    args = p.parse_args(argv)
    results = asyncio.run(measure(args.url, tuple(args.sizes), args.repeat))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.chart:
        print(f"chart: {chart(results, args.chart)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
