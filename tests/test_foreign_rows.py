"""Rows of task names an instance does not know (another application sharing the table,
unresolved rows) cost its polls nothing: the plans reach the known names through our index
(migration V0004) and never read the others' rows, in a custom plan and in a generic one.
And what the polls claim is still the due rows of the known names, by priority then time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import scheduled_tasks
from ekbatan_fastapi.domain.rows import PollingStrategy
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.postgresql import statements as q
from ekbatan_fastapi.store.tasks import TaskStore

from .conftest import Database
from .helpers import db_now, is_mysql

T = scheduled_tasks
FOREIGN = 100_000
KNOWN = ["known-a", "known-b", "known-c"]


async def _fill(engine: AsyncEngine) -> None:
    """10^5 rows of ten foreign names, half of them long due, half due tomorrow (generated in
    the database); each known name has a few due rows and a future one."""
    if is_mysql(engine):
        foreign = (
            "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
            "version, priority) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
            f"WHERE i < {FOREIGN}) SELECT CONCAT('foreign-', i % 10), CONCAT('i', i), "
            "IF(i % 2 = 0, UTC_TIMESTAMP(6) - INTERVAL 1 DAY, UTC_TIMESTAMP(6) + INTERVAL 1 DAY), "
            "0, 1, 0 FROM n"
        )
    else:
        foreign = (
            "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
            "version, priority) SELECT 'foreign-' || (i % 10), 'i' || i, CASE WHEN i % 2 = 0 "
            "THEN now() - interval '1 day' ELSE now() + interval '1 day' END, false, 1, 0 "
            f"FROM generate_series(1, {FOREIGN}) AS i"
        )
    now = await db_now(engine)
    known = [
        {
            "task_name": name,
            "task_instance": f"due-{i}",
            "execution_time": now - timedelta(minutes=1),
        }
        for name in KNOWN
        for i in range(3)
    ] + [
        {"task_name": name, "task_instance": "later", "execution_time": now + timedelta(hours=1)}
        for name in KNOWN
    ]
    async with engine.begin() as conn:
        if is_mysql(engine):
            version = str((await conn.execute(text("SELECT VERSION()"))).scalar())
            depth = (
                "max_recursive_iterations" if "MariaDB" in version else "cte_max_recursion_depth"
            )
            await conn.execute(text(f"SET SESSION {depth} = 1000000"))
        await conn.execute(text(foreign))
        await conn.execute(
            insert(T), [r | {"picked": False, "version": 1, "priority": 0} for r in known]
        )
        await conn.execute(
            text("ANALYZE TABLE scheduled_tasks" if is_mysql(engine) else "ANALYZE scheduled_tasks")
        )


def _nodes(plan: dict[str, Any], cte: str | None = None) -> Iterator[dict[str, Any]]:
    """Every node of ``plan``, each with ``"CTE"``: the common table expression it computes
    (None: the main query)."""
    name = plan.get("Subplan Name", "")
    cte = name.removeprefix("CTE ") if name.startswith("CTE ") else cte
    yield {**plan, "CTE": cte}
    for child in plan.get("Plans", []):
        yield from _nodes(child, cte)


def _literal(value: Any) -> str:
    if isinstance(value, list):
        return "'{" + ",".join(value) + "}'"
    return str(value) if isinstance(value, int) else f"'{value}'"


async def _plan(
    engine: AsyncEngine, stmt: q.Statement, params: dict[str, Any], generic: bool
) -> list[dict[str, Any]]:
    types = {"names": "text[]", "limit": "int", "picked_by": "text"}
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        transaction = driver.transaction()
        await transaction.start()
        try:
            mode = "force_generic_plan" if generic else "force_custom_plan"
            await driver.execute(f"SET LOCAL plan_cache_mode = {mode}")
            order = ", ".join(types[n] for n in stmt.order)
            await driver.execute(f"PREPARE poll({order}) AS {stmt.sql}")
            args = ", ".join(_literal(params[n]) for n in stmt.order)
            answer = await driver.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE poll({args})")
        finally:
            await transaction.rollback()  # the claim is not kept (nor the PREPARE)
    plan = json.loads(answer) if isinstance(answer, str) else answer
    return list(_nodes(plan[0]["Plan"]))


@pytest.mark.parametrize("ahead_ms", [0, 500], ids=["due", "claim-ahead"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize("strategy", list(PollingStrategy))
async def test_postgres_polls_never_read_rows_of_other_task_names(
    any_database: Database,
    any_engine: AsyncEngine,
    strategy: PollingStrategy,
    generic: bool,
    ahead_ms: int,
) -> None:
    if is_mysql(any_engine):
        pytest.skip(
            "the plans of PostgreSQL (MySQL/MariaDB: test_mysql_polls_never_read_other_rows)"
        )
    await _fill(any_engine)
    t = "scheduled_tasks"
    window = q.window(50, locking=strategy == PollingStrategy.LOCK_AND_FETCH)
    make = q.lock_and_fetch if strategy == PollingStrategy.LOCK_AND_FETCH else q.fetch_candidates
    stmt = q.Statement("poll", make(t, "ekbatan_paused_tasks", window=window, ahead_ms=ahead_ms))
    nodes = await _plan(any_engine, stmt, {"names": KNOWN, "limit": 50, "picked_by": "me"}, generic)
    read = [n for n in nodes if n.get("Relation Name") == t]
    assert read, nodes
    for node in read:
        if node["Node Type"] == "ModifyTable":  # the claim itself, of the rows locked
            continue
        assert node["Node Type"] in ("Index Scan", "Index Only Scan", "Tid Scan"), node
        # ``held`` (read when the poll is about to sleep: the rows of its names that other
        # instances run) goes through db-scheduler's heartbeat index, which holds picked
        # rows only: of other names it reads those running elsewhere, never the 10^5 waiting
        allowed = {"ekbatan_task_name_priority_idx", "scheduled_tasks_pkey", None}
        if node["CTE"] == "held":
            allowed.add("last_heartbeat_idx")
        assert node.get("Index Name") in allowed, node
        removed = node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1)
        assert removed <= 20, node
        assert node["Actual Rows"] * node.get("Actual Loops", 1) <= 60, node
    # what it found: the nine due rows of the known names
    returned = nodes[0]["Actual Rows"]
    assert returned == 9


async def test_polls_claim_by_priority_then_time_within_and_across_names(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Several priorities within one name, a NULL priority (written by another program: it
    sorts first on PostgreSQL, last on MySQL/MariaDB), and rows of a name not asked for."""
    repo: TaskStore = open_store(any_engine, any_database.dialect).tasks
    now = await db_now(any_engine)
    rows = [
        ("a", "a-low-old", 1, 30),
        ("a", "a-high-new", 5, 1),
        ("a", "a-high-old", 5, 20),
        ("b", "b-mid", 3, 10),
        ("b", "b-null", None, 5),
        ("a", "a-future", 9, -60),
        ("other", "o-top", 99, 40),
    ]
    async with any_engine.begin() as conn:
        await conn.execute(
            insert(T),
            [
                {
                    "task_name": name,
                    "task_instance": instance,
                    "execution_time": now - timedelta(seconds=age),
                    "picked": False,
                    "version": 1,
                    "priority": priority,
                }
                for name, instance, priority, age in rows
            ],
        )
    null_first = not is_mysql(any_engine)
    expected = ["a-high-old", "a-high-new", "b-mid", "a-low-old"]
    expected = ["b-null", *expected] if null_first else [*expected, "b-null"]
    claimed: list[str] = []
    for _ in range(5):
        result = await repo.poll(["a", "b"], 1, "me", PollingStrategy.FETCH)
        claimed += [r.task_instance for r in result.claimed]
    assert claimed == expected
    # nothing due any more: the next due time (a full batch may leave it unread, MySQL/MariaDB)
    result = await repo.poll(["a", "b"], 1, "me", PollingStrategy.FETCH)
    assert result.claimed == []
    assert result.next_due is not None and result.next_due > now  # "a-future"
    for strategy in PollingStrategy:
        if strategy == PollingStrategy.LOCK_AND_FETCH and not repo.supports_skip_locked:
            continue
        async with any_engine.begin() as conn:
            await conn.execute(T.update().where(T.c.task_name != "other").values(picked=False))
        got = await repo.poll(["a", "b"], 2, "me", strategy)
        assert sorted(r.task_instance for r in got.claimed) == sorted(expected[:2]), strategy


async def _rows_read(conn: Any) -> int:
    rows = await conn.execute(text("SHOW SESSION STATUS LIKE 'Handler_read%'"))
    return sum(int(r[1]) for r in rows)


@pytest.mark.parametrize("ahead_ms", [0, 500], ids=["due", "claim-ahead"])
@pytest.mark.parametrize("count", [1, 3], ids=["one-name", "three-names"])
@pytest.mark.parametrize("strategy", list(PollingStrategy))
async def test_mysql_polls_never_read_other_rows(
    any_database: Database,
    any_engine: AsyncEngine,
    strategy: PollingStrategy,
    count: int,
    ahead_ms: int,
) -> None:
    """MySQL/MariaDB: with up to ``PER_NAME_MAX`` names a poll reads each name's due rows
    through our index (one ``UNION ALL`` part per name) and the chosen rows by primary key:
    the plan names no other index, and the server reads a few hundred rows, not the 50,000
    due foreign ones (the statements before read them all)."""
    if not is_mysql(any_engine):
        pytest.skip("the plans of MySQL/MariaDB (PostgreSQL: test_postgres_polls_never_read_...)")
    from ekbatan_fastapi.store.mysql import statements as mq

    await _fill(any_engine)
    store: Any = open_store(any_engine, any_database.dialect).tasks
    locking = strategy == PollingStrategy.LOCK_AND_FETCH
    if locking and not store.supports_skip_locked:
        pytest.skip(f"{any_database.dialect} has no FOR UPDATE SKIP LOCKED")
    t, p = "scheduled_tasks", "ekbatan_paused_tasks"
    make = mq.lock_due_per_name if locking else mq.candidates_per_name
    known = KNOWN[:count]
    sql = make(t, p, count, mq.due_by(ahead_ms))
    params = {"names": known, "limit": 50, **mq.name_params(known)}
    async with any_engine.connect() as conn:
        plan = [r._mapping for r in await conn.execute(store.db.sql("EXPLAIN " + sql), params)]
        await conn.rollback()
        before = await _rows_read(conn)
        found = list(await conn.execute(store.db.sql(sql), params))
        read = await _rows_read(conn) - before
        await conn.rollback()
    tables = [r for r in plan if r["table"] in ("scheduled_tasks", "r")]
    # each known name's part (the next-due read of the fetch strategy is the earlier one)
    parts = [r for r in tables if r["key"] == "ekbatan_task_name_priority_idx"]
    assert len(parts) >= count, plan
    for row in tables:
        if row["key"] != "ekbatan_task_name_priority_idx":
            assert row["key"] in ("PRIMARY", "execution_time_idx") or row is tables[0], plan
    assert len([r for r in found if r[2 if not locking else 0] is not None]) == 3 * count
    # the due rows of the known names: 9 index entries, 9 rows by key, the union's temporary
    # table, the counter read itself; never the 50,000 due foreign rows
    assert read < 500, (read, plan)
    # and the poll itself claims exactly the known names' due rows (with a lead, also a row
    # each that comes due within it)
    instances = [f"due-{i}" for i in range(3)]
    if ahead_ms:
        soon = await db_now(any_engine) + timedelta(milliseconds=ahead_ms - 50)
        async with any_engine.begin() as conn:
            await conn.execute(
                insert(T),
                [
                    {"task_name": name, "task_instance": "soon", "execution_time": soon}
                    | {"picked": False, "version": 1, "priority": 0}
                    for name in known
                ],
            )
        instances.append("soon")
    result = await store.poll(known, 50, "me", strategy, ahead=timedelta(milliseconds=ahead_ms))
    assert sorted(r.task_instance for r in result.claimed) == sorted(
        i for _ in known for i in instances
    )
    assert {r.task_name for r in result.claimed} == set(known)


@pytest.mark.parametrize("count", [1, 3], ids=["one-name", "three-names"])
async def test_mysql_fetch_poll_does_not_read_a_known_backlog_for_its_next_due_time(
    any_database: Database, any_engine: AsyncEngine, count: int
) -> None:
    """The fetch strategy's next due time is read only when fewer than a batch are due: with
    foreign rows, its ``MIN`` runs through our index, where a name's due rows come before its
    future ones, and read the whole backlog at every poll (20,204 rows for 20,000 due). When
    the batch is not full it is still read, and right."""
    if not is_mysql(any_engine):
        pytest.skip("the fetch statements of MySQL/MariaDB")
    from ekbatan_fastapi.store.mysql import statements as mq

    await _fill(any_engine)
    backlog = (
        "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
        "version, priority) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
        "WHERE i < 3000) SELECT :name, CONCAT('b', i), UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE, "
        "0, 1, 0 FROM n"
    )
    async with any_engine.begin() as conn:
        await conn.execute(text(backlog), {"name": KNOWN[0]})
        await conn.execute(text("ANALYZE TABLE scheduled_tasks"))
    store: Any = open_store(any_engine, any_database.dialect).tasks
    sql = store.db.sql(mq.candidates_per_name("scheduled_tasks", "ekbatan_paused_tasks", count))
    known = KNOWN[:count]
    full = {"names": known, "limit": 50, **mq.name_params(known)}
    async with any_engine.connect() as conn:
        before = await _rows_read(conn)
        rows = list(await conn.execute(sql, full))
        read = await _rows_read(conn) - before
        await conn.rollback()
        assert len(rows) == 50
        assert read < 500, read
        # KNOWN[1] alone: 3 due rows and one in an hour, which is the next due time
        single = store.db.sql(mq.candidates_per_name("scheduled_tasks", None, 1))
        before = await _rows_read(conn)
        rows = list(
            await conn.execute(single, {"names": [KNOWN[1]], "limit": 50, "name_0": KNOWN[1]})
        )
        # the count, the next due time and the rows: each through the name's own index range
        not_full = await _rows_read(conn) - before
        later = (
            await conn.execute(
                text(
                    "SELECT execution_time FROM scheduled_tasks WHERE task_instance = 'later' "
                    "AND task_name = :n"
                ),
                {"n": KNOWN[1]},
            )
        ).scalar_one()
        await conn.rollback()
    assert len(rows) == 3 and rows[0][1] == later
    assert not_full < 100, not_full
