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
    .venv/bin/python bench/foreign_rows.py --url mysql+asyncmy://root@127.0.0.1:3306/test

On MySQL/MariaDB the statements are the task store's (``store/mysql/statements.py``): ``claim``
= the locking read of 50 due rows and the claim ``UPDATE`` (one transaction, rolled back),
``fetch`` = the fetch strategy's candidate read, ``idle`` = the locking read and the clock read
an idle poll sends. There is no plan cache to force, so the plan is ``-``; beside each time the
rows the server read for it (the session's ``Handler_read_*`` counters: index and table reads,
less the counters' own cost), which is what grows when a statement reads foreign rows.
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

from bench.common import asyncpg_dsn, mysql_numbers, other_service_rows  # noqa: E402
from ekbatan_fastapi.store.migrate import create_schema  # noqa: E402
from ekbatan_fastapi.store.mysql import statements as mq  # noqa: E402
from ekbatan_fastapi.store.postgresql import statements as q  # noqa: E402

KNOWN_DUE = 20_000
RECURRING = [f"job-{i}" for i in range(10)]
SIZES = (0, 10_000, 100_000, 1_000_000)


def _on_database(url: str, name: str) -> str:
    """``url`` on database ``name`` (a socket directory in the query stays where it is)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def _fill(conn: asyncpg.Connection, foreign: int) -> None:
    await conn.execute("TRUNCATE scheduled_tasks")
    for sql in other_service_rows("postgresql", foreign, prefix="foreign-", instance="i"):
        await conn.execute(sql)
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
    base = asyncpg_dsn(url)
    name = f"bench_foreign_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(base)
    await admin.execute(f"CREATE DATABASE {name}")
    results: list[dict[str, Any]] = []
    try:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(_on_database(url, name))
        await create_schema(engine, operations=True)
        await engine.dispose()
        conn = await asyncpg.connect(asyncpg_dsn(_on_database(url, name)))
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
                            polled = names if window else q.names_literal(names)
                            params = {"names": polled, "limit": 50, "picked_by": "bench"}
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


# -- MySQL / MariaDB -------------------------------------------------------------------------

_HANDLER = (
    "SELECT SUM(VARIABLE_VALUE) FROM information_schema.SESSION_STATUS "
    "WHERE VARIABLE_NAME LIKE 'HANDLER_READ%'"
)


def is_mysql(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("mysql", "mariadb")


async def _mysql_fill(conn: Any, foreign: int) -> None:
    from sqlalchemy import text

    # TRUNCATE (InnoDB makes the table anew), not DELETE: the rows a DELETE marks stay in the
    # indexes until the purge thread removes them, and every later read walks past them (a
    # size measured after another was 1.5-4x slower than the same size on a fresh table).
    await conn.execute(text("TRUNCATE TABLE scheduled_tasks"))
    version = str((await conn.execute(text("SELECT VERSION()"))).scalar())
    backend = "mariadb" if "mariadb" in version.lower() else "mysql"
    if backend == "mysql":  # for the recursive CTE of mysql_numbers
        await conn.execute(text("SET SESSION cte_max_recursion_depth = 4294967295"))
    cols = "task_name, task_instance, execution_time, picked, version, priority"
    if foreign:
        for sql in other_service_rows(backend, foreign, prefix="foreign-", instance="i"):
            await conn.execute(text(sql))
    await conn.execute(
        text(
            f"INSERT INTO scheduled_tasks ({cols}) SELECT 'bench-noop', CONCAT('n', i), "
            "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, 0, 1, 0 "
            f"FROM {mysql_numbers(backend, KNOWN_DUE)}"
        )
    )
    for name in RECURRING:
        await conn.execute(
            text(
                f"INSERT INTO scheduled_tasks ({cols}) VALUES "
                "(:n, 'recurring', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 0, 1, 0)"
            ),
            {"n": name},
        )
    await conn.commit()
    await conn.execute(text("ANALYZE TABLE scheduled_tasks"))
    await conn.commit()


async def _mysql_timed(conn: Any, steps: list[tuple[Any, dict[str, Any]]]) -> tuple[float, int]:
    """The steps in one transaction (rolled back): ms, and the rows the server read."""
    from sqlalchemy import text

    handler = text(_HANDLER)
    base0 = int((await conn.execute(handler)).scalar())
    base1 = int((await conn.execute(handler)).scalar())
    own = base1 - base0  # what one counter read adds
    await conn.commit()
    await conn.execute(text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
    try:
        began = time.perf_counter()
        for stmt, params in steps:
            result = await conn.execute(stmt, params)
            if result.returns_rows:
                rows = list(result)
                if "keys" in params and not params["keys"]:
                    params["keys"].extend((r[0], r[1]) for r in rows)
        took = (time.perf_counter() - began) * 1000
    finally:
        await conn.rollback()
    after = int((await conn.execute(handler)).scalar())
    return took, after - base1 - own


async def measure_mysql(url: str, sizes: tuple[int, ...], repeat: int) -> list[dict[str, Any]]:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from ekbatan_fastapi.store.dialects import open_store

    name = f"bench_foreign_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    async with admin.connect() as c:
        await c.execute(text(f"CREATE DATABASE `{name}`"))
    results: list[dict[str, Any]] = []
    engine = create_async_engine(_on_database(url, name), poolclass=NullPool)
    try:
        await create_schema(engine, operations=True)
        store = open_store(engine, engine.dialect.name).tasks
        # the dialect's statement texts (its statements module), as the store compiles them
        sql = store.db.sql  # type: ignore[attr-defined]
        clock = sql(mq.clock("scheduled_tasks", None))
        claim = sql(mq.claim("scheduled_tasks"))
        known = ["bench-noop", *RECURRING]

        def poll_sql(version: str, names: list[str]) -> tuple[Any, Any, dict[str, Any]]:
            """(candidates, lock_due, their parameters) of this version or the one before."""
            if version == "before":
                candidates = sql(mq.candidates("scheduled_tasks", None))
                lock_due = sql(mq.lock_due("scheduled_tasks", None))
                return candidates, lock_due, {"names": names, "limit": 50}
            candidates = sql(mq.candidates_per_name("scheduled_tasks", None, len(names)))
            lock_due = sql(mq.lock_due_per_name("scheduled_tasks", None, len(names)))
            return candidates, lock_due, {"names": names, "limit": 50, **mq.name_params(names)}

        async with engine.connect() as conn:
            for size in sizes:
                await _mysql_fill(conn, size)
                await conn.commit()
                for version in ("now", "before"):
                    row: dict[str, Any] = {"foreign": size, "statement": version, "plan": "-"}
                    for kind in ("claim", "fetch", "idle"):
                        took: list[tuple[float, int]] = []
                        for _ in range(repeat + 1):
                            if kind == "claim":
                                _, lock_due, params = poll_sql(version, known)
                                keys: list[Any] = []
                                steps = [
                                    (lock_due, params | {"keys": keys}),
                                    (claim, {"keys": keys, "picked_by": "bench", "now": None}),
                                ]
                            elif kind == "fetch":
                                candidates, _, params = poll_sql(version, known)
                                steps = [(candidates, params)]
                            else:
                                _, lock_due, params = poll_sql(version, RECURRING)
                                steps = [
                                    (lock_due, params),
                                    (clock, {"names": RECURRING, "picked_by": "bench"}),
                                ]
                            took.append(await _mysql_timed(conn, steps))
                        took = took[1:]
                        row[kind] = statistics.median(t for t, _ in took)
                        row[f"{kind}_rows"] = max(r for _, r in took)
                    results.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        await engine.dispose()
        async with admin.connect() as c:
            await c.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        await admin.dispose()
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| foreign rows | statement | plan | claim 50 ms | fetch ms | idle poll ms |",
        "| ---: | --- | --- | ---: | ---: | ---: |",
    ]
    if results and "claim_rows" in results[0]:
        lines = [
            "| foreign rows | statement | claim 50 ms | rows read | fetch ms | rows read "
            "| idle poll ms | rows read |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results:
            lines.append(
                f"| {r['foreign']:,} | {r['statement']} | {r['claim']:.2f} | {r['claim_rows']:,} "
                f"| {r['fetch']:.2f} | {r['fetch_rows']:,} | {r['idle']:.2f} | {r['idle_rows']:,} |"
            )
        return "\n".join(lines)
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
    mysql = bool(results) and results[0]["plan"] == "-"
    plans = (("-", "-"),) if mysql else (("custom", "-"), ("generic", "--"))
    for version in ("now", "before"):
        for plan, style in plans:
            for kind, marker in (("claim", "o"), ("idle", "s")):
                pts = [
                    (max(r["foreign"], 1), r[kind])
                    for r in results
                    if r["statement"] == version and r["plan"] == plan
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    label = f"{kind}, {version}" + ("" if mysql else f", {plan}")
                    ax.plot(xs, ys, style, marker=marker, label=label)
    ax.set_xscale("symlog", linthresh=10_000)
    ax.set_yscale("log")
    ax.set_xlabel("rows of task names the scheduler does not know")
    ax.set_ylabel("statement time, ms (median)")
    server = "MySQL/MariaDB" if mysql else "PostgreSQL"
    ax.set_title(f"Poll statement time vs foreign rows ({server})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--url", help="postgresql+asyncpg://... or mysql+asyncmy://... (a database to start from)"
    )
    p.add_argument("--from-json", type=Path, help="no run: table and chart of an earlier --json")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--json", type=Path)
    p.add_argument("--chart", type=Path)
    args = p.parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    elif args.url:
        run = measure_mysql if is_mysql(args.url) else measure
        results = asyncio.run(run(args.url, tuple(args.sizes), args.repeat))
    else:
        p.error("give --url (or --from-json)")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.chart:
        print(f"chart: {chart(results, args.chart)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
