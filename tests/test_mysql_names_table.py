"""MySQL/MariaDB with many job names (issue #17, "Names"): from ``NAMES_TABLE_MIN`` names on,
the polls, their clock and the dead-execution check read the names from a session temporary
table filled once per connection, instead of parsing a list of every name in each statement's
text (store/mysql/names.py)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import make_url, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ekbatan_fastapi import scheduled_tasks
from ekbatan_fastapi.domain.rows import NewTask, PollingStrategy
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.migrate import create_schema
from ekbatan_fastapi.store.mysql.names import NAMES_TABLE_MIN
from ekbatan_fastapi.store.mysql.statements import NAMES_TABLE_PREFIX

from .conftest import Database
from .helpers import db_now

NAMES = [f"job-{i:04d}" for i in range(NAMES_TABLE_MIN + 100)]
OTHERS = [f"other-{i:04d}" for i in range(NAMES_TABLE_MIN)]


class _Sent:
    """The statements a store sent to the driver (its ``on_statement``)."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def __call__(self, name: str, sql: str) -> None:
        self.texts.append((name, sql))


@pytest.fixture
async def one_connection(any_database: Database) -> AsyncIterator[AsyncEngine]:
    """MySQL/MariaDB only: an engine of one pooled connection, so that a test can reach the
    session its statements ran on."""
    if not any_database.is_mysql:
        pytest.skip("MySQL/MariaDB's names table")
    engine = create_async_engine(any_database.url, pool_size=1, max_overflow=0)
    await create_schema(engine)
    yield engine
    await engine.dispose()


def _strategies(store: Any) -> list[PollingStrategy]:
    return [s for s in PollingStrategy if s != PollingStrategy.LOCK_AND_FETCH] + (
        [PollingStrategy.LOCK_AND_FETCH] if store.supports_skip_locked else []
    )


async def _due(store: Any, engine: AsyncEngine, names: list[str]) -> None:
    now = await db_now(engine)
    await store.insert_missing([NewTask(n, "i", now - timedelta(seconds=1)) for n in names])


async def _session_tables(engine: AsyncEngine) -> list[tuple[str, int]]:
    """The names tables of the engine's one connection (as its ``info`` records them; a
    temporary table is not listed by ``SHOW TABLES``), with their row counts."""
    async with engine.connect() as conn:
        found = []
        for key in list(conn.info):
            if isinstance(key, str) and key.startswith("ekbatan_names_table:"):
                name = key.split(":", 1)[1]
                count = await conn.scalar(text(f"SELECT COUNT(*) FROM {name}"))
                found.append((name, int(count or 0)))
        return sorted(found)


async def test_many_names_are_read_from_a_table_of_the_session(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    """Every strategy claims exactly the due rows of its names (not another service's), the
    statements carry no list of names, and the session holds one table of all the names."""
    store: Any = open_store(one_connection, any_database.dialect).tasks
    await _due(store, one_connection, [*NAMES[:30], *OTHERS[:20]])
    sent = store.on_statement = _Sent()
    for strategy in _strategies(store):
        result = await store.poll(NAMES, 50, "me", strategy)
        assert sorted(r.task_name for r in result.claimed) == NAMES[:30], strategy
        await store.release_orphans("me", set(), timedelta(0))
    tables = await _session_tables(one_connection)
    assert len(tables) == 1 and tables[0][1] == len(NAMES), tables
    assert all(":names" not in sql for _, sql in sent.texts), sent.texts
    if store.supports_skip_locked:
        assert any(tables[0][0] in sql for name, sql in sent.texts if name == "poll")


async def test_the_names_table_serves_the_pause_filter_the_lead_and_the_next_due_time(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    store: Any = open_store(one_connection, any_database.dialect).tasks
    now = await db_now(one_connection)
    await store.insert_missing(
        [
            NewTask(NAMES[0], "paused", now - timedelta(seconds=1)),
            NewTask(NAMES[1], "due", now - timedelta(seconds=1)),
            NewTask(NAMES[2], "soon", now + timedelta(seconds=30)),
            NewTask(NAMES[3], "later", now + timedelta(hours=2)),
            NewTask(OTHERS[0], "foreign-earlier", now + timedelta(seconds=5)),
        ]
    )
    async with one_connection.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ekbatan_paused_tasks (task_name, paused_at, paused_by) "
                "VALUES (:n, UTC_TIMESTAMP(6), 'test')"
            ),
            {"n": NAMES[0]},
        )
    for strategy in _strategies(store):
        result = await store.poll(NAMES, 50, "me", strategy, skip_paused=True)
        assert [r.task_instance for r in result.claimed] == ["due"], strategy
        # the next due time is this instance's own row, not the foreign one before it
        assert result.next_due is not None
        assert timedelta(seconds=20) < result.next_due - now < timedelta(seconds=40)
        ahead = await store.poll(
            NAMES, 50, "me", strategy, skip_paused=True, ahead=timedelta(minutes=1)
        )
        assert [r.task_instance for r in ahead.claimed] == ["soon"], strategy
        assert ahead.next_due is not None and ahead.next_due - now > timedelta(hours=1)
        await store.release_orphans("me", set(), timedelta(0))


async def test_the_dead_execution_check_reads_the_names_table(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    store: Any = open_store(one_connection, any_database.dialect).tasks
    await _due(store, one_connection, [NAMES[5], NAMES[6], OTHERS[1]])
    strategy = _strategies(store)[-1]
    claimed = (await store.poll([*NAMES, OTHERS[1]], 50, "me", strategy)).claimed
    assert len(claimed) == 3
    now = await db_now(one_connection)
    async with one_connection.begin() as conn:
        await conn.execute(
            update(scheduled_tasks)
            .where(scheduled_tasks.c.task_name != NAMES[6])
            .values(last_heartbeat=now - timedelta(hours=1))
        )
    revival = await store.revive_dead(NAMES, timedelta(minutes=1))
    assert [r.task_name for r in revival.revived] == [NAMES[5]]  # not the foreign one
    assert revival.next_death is not None  # NAMES[6]'s


async def test_a_session_that_lost_its_names_table_fills_it_again(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    """A reset session (a proxy's ``COM_RESET_CONNECTION``, a ``DROP``) loses its temporary
    tables: the statement that finds it gone fills it again and runs once more."""
    store: Any = open_store(one_connection, any_database.dialect).tasks
    await _due(store, one_connection, NAMES[:4])
    for strategy in _strategies(store):
        assert (await store.poll(NAMES, 1, "me", strategy)).claimed
        [(name, _)] = await _session_tables(one_connection)
        async with one_connection.connect() as conn:
            await conn.execute(text(f"DROP TEMPORARY TABLE {name}"))
        result = await store.poll(NAMES, 1, "me", strategy)
        assert len(result.claimed) == 1, strategy
        assert await _session_tables(one_connection) == [(name, len(NAMES))]
    await store.release_orphans("me", set(), timedelta(0))
    async with one_connection.connect() as conn:
        await conn.execute(text(f"DROP TEMPORARY TABLE {name}"))
    assert (await store.revive_dead(NAMES, timedelta(minutes=1))).revived == []


async def test_two_stores_with_other_names_on_one_connection_keep_apart(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    """Two schedulers on one engine (one session here) with different jobs: each names table
    is its own (its name a digest of the names), and names equal under the column's collation
    (``Job``, ``job``) are one row, matched as an ``IN`` list would."""
    ours: Any = open_store(one_connection, any_database.dialect).tasks
    theirs: Any = open_store(one_connection, any_database.dialect).tasks
    await _due(ours, one_connection, [NAMES[0], OTHERS[0], "Cased"])
    strategy = _strategies(ours)[-1]
    mine = await ours.poll([*NAMES, "Cased", "cased"], 50, "me", strategy)
    assert sorted(r.task_name for r in mine.claimed) == ["Cased", NAMES[0]]
    other = await theirs.poll(OTHERS, 50, "them", strategy)
    assert [r.task_name for r in other.claimed] == [OTHERS[0]]
    tables = await _session_tables(one_connection)
    assert sorted(n for _, n in tables) == [len(OTHERS), len(NAMES) + 1], tables


async def test_without_a_pool_the_names_stay_in_the_text(any_database: Database) -> None:
    """``NullPool``: every checkout is a new session, which would fill the table for every
    statement; the names go in the text as below ``NAMES_TABLE_MIN``."""
    if not any_database.is_mysql:
        pytest.skip("MySQL/MariaDB's names table")
    engine = create_async_engine(any_database.url, poolclass=NullPool)
    try:
        await create_schema(engine)
        store: Any = open_store(engine, any_database.dialect).tasks
        await _due(store, engine, NAMES[:2])
        sent = store.on_statement = _Sent()
        result = await store.poll(NAMES, 50, "me", _strategies(store)[-1])
        assert len(result.claimed) == 2
        assert all(NAMES_TABLE_PREFIX not in sql for _, sql in sent.texts)
    finally:
        await engine.dispose()


async def test_an_idle_poll_over_the_names_table_reads_a_few_rows(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    """The plans: the due rows through ``execution_time_idx`` (none here), the next due time
    by walking it in time order to this instance's first row; never the whole table (a
    ``MIN`` over the names' rows joined to the names table reads every one of them)."""
    store: Any = open_store(one_connection, any_database.dialect).tasks
    now = await db_now(one_connection)
    await store.insert_missing(
        [
            NewTask(name, f"i{k}", now + timedelta(hours=1 + k, seconds=i))
            for k in range(8)
            for i, name in enumerate(NAMES)
        ]
    )
    async with one_connection.begin() as conn:
        await conn.execute(text("ANALYZE TABLE scheduled_tasks"))
    strategy = _strategies(store)[-1]
    await store.poll(NAMES, 50, "me", strategy)  # fills the session's table
    async with one_connection.connect() as conn:
        status = text("SHOW SESSION STATUS LIKE 'Handler_read%'")
        before = sum(int(r[1]) for r in await conn.execute(status))
        await conn.commit()
    result = await store.poll(NAMES, 50, "me", strategy)
    async with one_connection.connect() as conn:
        read = sum(int(r[1]) for r in await conn.execute(status)) - before
        await conn.commit()
    [(table, _)] = await _session_tables(one_connection)
    async with one_connection.connect() as conn:
        polls = store._polls.by_table(False, 0, table, table + "_b")
        plans = [
            r._mapping
            for sql in polls
            for r in await conn.execute(
                text("EXPLAIN " + sql.text), {"limit": 50, "picked_by": "me"}
            )
        ]
        await conn.rollback()
    assert result.claimed == [] and result.next_due == now + timedelta(hours=1)
    assert len(NAMES) * 8 > 4000 and read < 200, (read, plans)
    assert all(p["type"] != "ALL" for p in plans if p["table"] == "scheduled_tasks"), plans


async def test_without_the_temporary_tables_privilege_the_names_go_in_the_text(
    any_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A user without ``CREATE TEMPORARY TABLES``: the first statement that needs the table
    fails, a warning names the grant, and from then on the names go in the text."""
    if not any_database.is_mysql:
        pytest.skip("MySQL/MariaDB's names table")
    url = make_url(any_database.url)
    user = f"ekb_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(url, poolclass=NullPool)
    limited = create_async_engine(url.set(username=user, password="pw"), pool_size=1)
    try:
        await create_schema(admin)
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
            await conn.execute(
                text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{url.database}`.* TO '{user}'@'%'")
            )
        store: Any = open_store(limited, any_database.dialect).tasks
        await _due(store, limited, NAMES[:2])
        strategy = _strategies(store)[-1]
        with pytest.raises(Exception) as refused:  # the driver's error, or SQLAlchemy's
            await store.poll(NAMES, 50, "me", strategy)
        assert "denied" in str(refused.value).lower()
        assert "GRANT CREATE TEMPORARY TABLES" in caplog.text
        assert len((await store.poll(NAMES, 50, "me", strategy)).claimed) == 2
        assert (await store.revive_dead(NAMES, timedelta(minutes=1))).revived == []
    finally:
        await limited.dispose()
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
        await admin.dispose()


def test_each_statement_opens_each_names_table_once() -> None:
    """MySQL cannot open one temporary table twice in a statement (``Can't reopen table``;
    MariaDB, which the suite runs on, can): every statement over the names reads the table
    and its twin at most once each, in every variant."""
    from ekbatan_fastapi.store.mysql import statements as mq

    k, k2 = f"{NAMES_TABLE_PREFIX}x", f"{NAMES_TABLE_PREFIX}x_b"
    texts = [mq.dead_candidates("t", k, k2)]
    for p in (None, "p"):
        for due in (mq.due_by(0), mq.due_by(500)):
            texts += [
                mq.candidates("t", p, due, k, k2),
                mq.lock_due("t", p, due, k),
                mq.clock("t", p, k, k2),
            ]
    for sql in texts:
        tables = re.findall(rf"\b{NAMES_TABLE_PREFIX}x(?:_b)?\b", sql)
        assert tables and len(tables) == len(set(tables)), sql


async def test_a_poll_over_the_names_table_reports_the_rows_peers_hold(
    any_database: Database, one_connection: AsyncEngine
) -> None:
    """With the names in a table, a lock-and-fetch poll still reports the rows of its names
    other instances hold (``PollResult.held``), read from the twin table: a survivor learns
    a held recurring row's next slot and wakes for it (issue #32), as with fewer names."""
    store: Any = open_store(one_connection, any_database.dialect).tasks
    if not store.supports_skip_locked:
        pytest.skip("lock-and-fetch (SKIP LOCKED) only")
    now = await db_now(one_connection)
    await store.insert_missing(
        [
            NewTask(NAMES[5], "recurring", now - timedelta(seconds=1)),
            NewTask(OTHERS[1], "foreign", now - timedelta(seconds=1)),
        ]
    )
    async with one_connection.begin() as conn:
        await conn.execute(
            update(scheduled_tasks)
            .where(scheduled_tasks.c.task_instance.in_(["recurring", "foreign"]))
            .values(picked=True, picked_by="peer", last_heartbeat=now, version=2)
        )
    sent = _Sent()
    store.on_statement = sent
    result = await store.poll(NAMES, 50, "me", PollingStrategy.LOCK_AND_FETCH, skip_paused=True)
    assert result.claimed == []
    assert [name for name, _ in result.held] == [NAMES[5]], "only our names' held rows"
    assert any(NAMES_TABLE_PREFIX in sql for _, sql in sent.texts), "read from the names table"
    mine = await store.poll(NAMES, 50, "peer", PollingStrategy.LOCK_AND_FETCH, skip_paused=True)
    assert mine.held == (), "an instance's own rows are not held by others"
