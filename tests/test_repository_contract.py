"""The repository's lease protocol, checked statement by statement on every available database.

Each write must say exactly which rows it wrote: the scheduler relies on the answer to know
whether it still owns an execution (base.py documents the protocol).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import scheduled_tasks
from ekbatan_fastapi.domain.rows import Finish, FinishKind, NewTask, Owned, Revival
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.tasks import TaskStore

from .conftest import MYSQL_SESSION_TIME_ZONE, Database
from .helpers import db_now, is_mysql

T = scheduled_tasks


@pytest.fixture
def repo(any_database: Database, any_engine: AsyncEngine) -> TaskStore:
    return open_store(any_engine, any_database.dialect).tasks


async def _due_rows(engine: AsyncEngine, name: str, n: int) -> list[tuple[str, str]]:
    due = await db_now(engine) - timedelta(seconds=1)
    keys = [(name, f"i{i:04d}") for i in range(n)]
    async with engine.begin() as conn:
        await conn.execute(
            insert(T),
            [
                {"task_name": k[0], "task_instance": k[1], "execution_time": due}
                | {"picked": False, "version": 1, "priority": 0}
                for k in keys
            ],
        )
    return keys


async def _bump_version(engine: AsyncEngine, key: tuple[str, str]) -> None:
    """What a revival by another instance does to our row."""
    async with engine.begin() as conn:
        await conn.execute(
            update(T)
            .where(T.c.task_name == key[0], T.c.task_instance == key[1])
            .values(version=T.c.version + 1)
        )


async def test_timestamps_are_utc_whatever_the_session_time_zone(
    repo: TaskStore, any_engine: AsyncEngine
) -> None:
    if is_mysql(any_engine):
        async with any_engine.connect() as conn:
            zone = (await conn.execute(text("SELECT @@session.time_zone"))).scalar_one()
        assert zone == MYSQL_SESSION_TIME_ZONE  # the fixture's setting took effect
    now = await repo.db_now()
    assert now.tzinfo is not None
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)
    india = timezone(timedelta(hours=5, minutes=30))
    at = datetime(2031, 3, 30, 1, 30, 0, 123456, tzinfo=india)
    assert await repo.upsert(NewTask("t", "a", at), replace=False)
    row = await repo.get("t", "a")
    assert (
        row is not None
        and row.execution_time == at
        and row.execution_time.utcoffset() == (timedelta(0))
    )
    if is_mysql(any_engine):  # stored as the UTC wall clock, not the session's
        async with any_engine.connect() as conn:
            raw = (await conn.execute(text("SELECT execution_time FROM scheduled_tasks"))).one()[0]
        assert raw == datetime(2031, 3, 29, 20, 0, 0, 123456)
    assert await repo.upsert(NewTask("t", "now", None), replace=False)
    row = await repo.get("t", "now")
    assert row is not None and abs(row.execution_time - await repo.db_now()) < timedelta(seconds=5)


async def test_insert_missing_reports_exactly_the_rows_it_inserted(
    any_database: Database, any_engine: AsyncEngine, repo: TaskStore
) -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    first = await repo.insert_missing([NewTask("r", "a", at), NewTask("r", "b", at)])
    assert sorted(first) == [("r", "a"), ("r", "b")]
    again = await repo.insert_missing([NewTask("r", "b", at), NewTask("r", "c", at)] * 2)
    assert again == [("r", "c")]
    # instances racing to create the same rows: each row is reported by exactly one of them
    peers = [open_store(any_engine, any_database.dialect).tasks for _ in "xyz"]
    tasks = [NewTask("race", f"k{i:03d}", at) for i in range(200)]
    answers = await asyncio.gather(*(p.insert_missing(tasks) for p in peers))
    reported = [key for answer in answers for key in answer]
    assert sorted(reported) == sorted((t.task_name, t.task_instance) for t in tasks)


async def test_upsert_keeps_or_replaces_unpicked_rows_only(
    repo: TaskStore, any_engine: AsyncEngine, any_database: Database
) -> None:
    first = datetime(2030, 1, 1, tzinfo=UTC)
    second = datetime(2030, 6, 1, tzinfo=UTC)
    assert await repo.upsert(NewTask("u", "x", first, b"one"), replace=False) is True
    assert await repo.upsert(NewTask("u", "x", second, b"two"), replace=False) is False
    row = await repo.get("u", "x")
    assert row is not None and (row.execution_time, row.task_data, row.version) == (
        first,
        b"one",
        1,
    )
    assert await repo.upsert(NewTask("u", "x", second, b"two", 5), replace=True) is True
    row = await repo.get("u", "x")
    assert row is not None
    assert (row.execution_time, row.task_data, row.priority, row.version) == (second, b"two", 5, 2)
    assert await repo.upsert(NewTask("u", "y", None), replace=True) is True  # absent: inserted
    await repo.reschedule("u", "x", None)  # due now, then claimed
    claimed = await repo.poll(["u"], 10, "me", any_database.strategies[0])
    assert {r.key for r in claimed.claimed} == {("u", "x"), ("u", "y")}
    assert await repo.upsert(NewTask("u", "x", first), replace=True) is False  # picked
    row = await repo.get("u", "x")
    assert row is not None and row.picked and row.version == 4


@pytest.mark.parametrize("strategy", ["fetch", "lock-and-fetch"])
async def test_concurrent_polls_claim_each_row_once(
    repo: TaskStore,
    any_database: Database,
    any_engine: AsyncEngine,
    strategy: str,
) -> None:
    if strategy not in any_database.strategies:
        pytest.skip(f"{any_database.dialect} has no {strategy}")
    keys = await _due_rows(any_engine, "p", 300)
    pollers = [open_store(any_engine, any_database.dialect).tasks for _ in range(4)]
    claimed: dict[tuple[str, str], str] = {}
    for _ in range(10):
        results = await asyncio.gather(
            *(p.poll(["p"], 40, f"node-{n}", strategy) for n, p in enumerate(pollers))
        )
        for n, result in enumerate(results):
            assert result.db_now.tzinfo is not None
            for row in result.claimed:
                assert row.key not in claimed, f"{row.key} claimed twice"
                assert row.picked and row.picked_by == f"node-{n}" and row.version == 2
                claimed[row.key] = f"node-{n}"
        if len(claimed) == len(keys):
            break
    assert sorted(claimed) == keys
    async with any_engine.connect() as conn:
        rows = (await conn.execute(select(T.c.task_instance, T.c.picked_by, T.c.version))).all()
    assert {("p", r[0]): r[1] for r in rows} == claimed
    assert {r[2] for r in rows} == {2}


async def test_poll_reports_the_next_due_time_and_ignores_unknown_names(
    repo: TaskStore, any_database: Database
) -> None:
    now = await repo.db_now()
    soon, later = now + timedelta(minutes=5), now + timedelta(hours=1)
    await repo.insert_missing(
        [
            NewTask("mine", "late", later),
            NewTask("mine", "soon", soon),
            NewTask("other", "due", now - timedelta(seconds=1)),
            NewTask("other", "sooner", now + timedelta(minutes=1)),
        ]
    )
    for strategy in any_database.strategies:
        result = await repo.poll(["mine"], 10, "me", strategy)
        assert result.claimed == [] and result.next_due == soon


async def test_finish_records_only_rows_still_owned(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    keys = await _due_rows(any_engine, "f", 5)
    claimed = (await repo.poll(["f"], 10, "me", any_database.strategies[0])).claimed
    owned = {r.key: Owned(r.task_name, r.task_instance, r.version) for r in claimed}
    assert sorted(owned) == keys
    succeeded, failed, deleted, released, stale = keys
    await _bump_version(any_engine, stale)
    next_time = datetime(2030, 1, 1, 12, tzinfo=UTC)
    recorded = await repo.finish(
        [
            Finish(owned[succeeded], FinishKind.SUCCEEDED, next_time),
            Finish(owned[failed], FinishKind.FAILED, next_time + timedelta(hours=1)),
            Finish(owned[deleted], FinishKind.DELETED),
            Finish(owned[released], FinishKind.RELEASED),
            Finish(owned[stale], FinishKind.SUCCEEDED, next_time),
        ]
    )
    assert recorded == {succeeded, failed, deleted, released}
    rows = {r.key: r for r in await repo.list_tasks("f")}
    assert deleted not in rows
    ok, bad, free, lost = rows[succeeded], rows[failed], rows[released], rows[stale]
    assert (ok.execution_time, ok.picked, ok.picked_by, ok.consecutive_failures) == (
        next_time,
        False,
        None,
        0,
    )
    assert ok.last_success is not None and ok.last_heartbeat is None and ok.version == 3
    assert bad.execution_time == next_time + timedelta(hours=1) and bad.last_failure is not None
    assert bad.consecutive_failures == 1 and bad.last_success is None and not bad.picked
    assert not free.picked and free.execution_time < next_time and free.version == 3
    assert free.last_success is None and free.last_failure is None
    assert (
        lost.picked and lost.picked_by == "me" and lost.version == 3 and lost.last_success is None
    )
    assert await repo.finish([Finish(owned[succeeded], FinishKind.SUCCEEDED, next_time)]) == set()


async def test_heartbeat_answers_which_rows_are_still_owned(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    keys = await _due_rows(any_engine, "h", 3)
    claimed = (await repo.poll(["h"], 10, "me", any_database.strategies[0])).claimed
    owned = [Owned(r.task_name, r.task_instance, r.version) for r in claimed]
    before = {r.key: r.last_heartbeat for r in claimed}
    await _bump_version(any_engine, keys[1])
    await asyncio.sleep(0.01)
    assert await repo.heartbeat(owned) == {keys[0], keys[2]}
    rows = {r.key: r for r in await repo.list_tasks("h")}
    for key in (keys[0], keys[2]):
        beat = rows[key].last_heartbeat
        assert beat is not None and before[key] is not None and beat > before[key]
    assert await repo.heartbeat([o for o in owned if o.key != keys[1]]) == {keys[0], keys[2]}


async def test_a_row_another_transaction_holds_does_not_stop_the_other_heartbeats(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    """A transaction that holds one of our rows locked (on MariaDB, a claim orphaned by a
    partition keeps every row its scan locked, ours included; on either database, this
    instance's own completion of that row): the other rows still get their heartbeats, at
    once, and the held one is still ours. A plain UPDATE waited for the lock: on MariaDB every
    row of the instance missed its heartbeats and the peers revived them (the chaos scenario
    mariadb-orphan); on PostgreSQL it deadlocked with a completion that locks the same rows in
    another order, and the completion waited 1 s (``deadlock_timeout``). MySQL 5 has no SKIP
    LOCKED: there the update waits, bounded by the session's lock wait."""
    if not repo.supports_skip_locked:
        pytest.skip("no SKIP LOCKED before MySQL 8")
    keys = await _due_rows(any_engine, "hb", 2)
    claimed = (await repo.poll(["hb"], 10, "me", any_database.strategies[0])).claimed
    owned = [Owned(r.task_name, r.task_instance, r.version) for r in claimed]
    before = {r.key: r.last_heartbeat for r in claimed}
    held = keys[0]
    async with any_engine.connect() as other:
        await other.begin()
        await other.execute(
            select(T.c.task_name)
            .where(T.c.task_name == held[0], T.c.task_instance == held[1])
            .with_for_update()
        )
        await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            assert await repo.heartbeat(owned) == set(keys)
        await other.rollback()
    rows = {r.key: r for r in await repo.list_tasks("hb")}
    beat = rows[keys[1]].last_heartbeat
    assert beat is not None and before[keys[1]] is not None and beat > before[keys[1]]
    assert rows[held].last_heartbeat == before[held]  # left for the next round


async def test_revive_dead_keeps_the_slot_and_reports_the_row_as_it_was(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    keys = await _due_rows(any_engine, "d", 2)
    claimed = {
        r.key: r for r in (await repo.poll(["d"], 10, "gone", any_database.strategies[0])).claimed
    }
    dead, alive = keys
    old = await db_now(any_engine) - timedelta(hours=1)
    async with any_engine.begin() as conn:
        await conn.execute(update(T).where(T.c.task_instance == dead[1]).values(last_heartbeat=old))
    revived = (await repo.revive_dead(["d"], timedelta(minutes=1))).revived
    assert [r.key for r in revived] == [dead]
    (row,) = revived
    assert row.picked and row.picked_by == "gone" and row.last_heartbeat == old
    assert row.version == claimed[dead].version
    after = {r.key: r for r in await repo.list_tasks("d")}
    assert not after[dead].picked and after[dead].picked_by is None
    assert after[dead].version == claimed[dead].version + 1
    assert after[dead].execution_time == claimed[dead].execution_time, "the slot is kept"
    assert after[alive].picked and after[alive].version == claimed[alive].version
    assert (await repo.revive_dead(["d"], timedelta(minutes=1))).revived == []
    assert (await repo.revive_dead(["other"], timedelta(seconds=0))).revived == []


async def test_revive_dead_says_when_the_next_picked_row_would_die(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    assert await repo.revive_dead(["w"], timedelta(minutes=1)) == Revival([], None)
    await _due_rows(any_engine, "w", 2)
    assert await repo.revive_dead(["w"], timedelta(minutes=1)) == Revival([], None), "none picked"
    claimed = (await repo.poll(["w"], 10, "peer", any_database.strategies[0])).claimed
    older = await db_now(any_engine) - timedelta(seconds=20)
    async with any_engine.begin() as conn:
        await conn.execute(
            update(T)
            .where(T.c.task_instance == claimed[0].task_instance)
            .values(last_heartbeat=older)
        )
    revival = await repo.revive_dead(["w"], timedelta(minutes=1))
    revived, next_death = revival.revived, revival.next_death
    assert revived == [] and next_death is not None
    assert abs((next_death - (older + timedelta(minutes=1))).total_seconds()) < 0.01
    revival = await repo.revive_dead(["w"], timedelta(seconds=10))
    revived, next_death = revival.revived, revival.next_death
    assert [r.task_instance for r in revived] == [claimed[0].task_instance]
    assert next_death is not None, "the other picked row is still alive"
    assert next_death > await db_now(any_engine)


async def test_poll_skips_paused_task_names_when_asked_to(
    repo: TaskStore, any_database: Database, any_engine: AsyncEngine
) -> None:
    paused = repo.db.tables.paused
    now = await repo.db_now()
    for strategy in any_database.strategies:
        await repo.insert_missing(
            [
                NewTask("held", strategy, now - timedelta(seconds=1)),
                NewTask("held", f"{strategy}-later", now + timedelta(minutes=1)),
                NewTask("free", f"{strategy}-later", now + timedelta(minutes=2)),
            ]
        )
    async with any_engine.begin() as conn:
        await conn.execute(insert(paused).values(task_name="held", paused_at=now))
    for strategy in any_database.strategies:
        result = await repo.poll(["held", "free"], 10, "me", strategy, skip_paused=True)
        assert result.claimed == [] and result.next_due == now + timedelta(minutes=2)
    # before the operations tables are known: no filter
    result = await repo.poll(["held", "free"], 10, "me", any_database.strategies[0])
    assert {r.task_name for r in result.claimed} == {"held"}


async def test_claims_stay_exclusive_on_an_engine_configured_for_autocommit(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """An application may hand over an AUTOCOMMIT engine: the claim transactions still hold."""
    from sqlalchemy.ext.asyncio import create_async_engine

    keys = await _due_rows(any_engine, "ac", 120)
    engine = create_async_engine(any_database.url, isolation_level="AUTOCOMMIT")
    try:
        pollers = [open_store(engine, any_database.dialect).tasks for _ in range(3)]
        claimed: list[tuple[str, str]] = []
        for strategy in any_database.strategies:
            results = await asyncio.gather(
                *(p.poll(["ac"], 30, f"n{i}", strategy) for i, p in enumerate(pollers))
            )
            claimed += [r.key for result in results for r in result.claimed]
        assert (await pollers[0].poll([], 10, "n0", any_database.strategies[0])).claimed == []
        rest = await pollers[0].poll(["ac"], 200, "n0", any_database.strategies[0])
        claimed += [r.key for r in rest.claimed]
        assert sorted(claimed) == keys, "each row claimed exactly once"
    finally:
        await engine.dispose()


async def test_insert_missing_takes_thousands_of_rows_and_none_means_the_database_clock(
    repo: TaskStore,
) -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    tasks = [NewTask("bulk", f"k{i:05d}", None if i % 2 else at, b"x", 3) for i in range(5000)]
    before = await repo.db_now()
    inserted = await repo.insert_missing(tasks)
    assert sorted(inserted) == sorted((t.task_name, t.task_instance) for t in tasks)
    rows = {r.task_instance: r for r in await repo.list_tasks("bulk", limit=10_000)}
    assert len(rows) == 5000
    assert rows["k00000"].execution_time == at and rows["k00000"].priority == 3
    assert before <= rows["k00001"].execution_time <= await repo.db_now()
    assert rows["k00001"].task_data == b"x" and rows["k00001"].version == 1


async def test_names_differing_only_in_case_are_one_row_on_mysql_two_on_postgresql(
    repo: TaskStore, any_engine: AsyncEngine
) -> None:
    """docs/databases.md: the MySQL/MariaDB key columns compare without case by default."""
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert await repo.insert_missing([NewTask("Report", "a", at)]) == [("Report", "a")]
    again = await repo.insert_missing([NewTask("report", "a", at), NewTask("report", "b", at)])
    if is_mysql(any_engine):
        assert again == [("report", "b")]
        assert await repo.upsert(NewTask("REPORT", "a", at), replace=False) is False
    else:
        assert again == [("report", "a"), ("report", "b")]


async def test_revive_dead_keeps_the_sessions_own_lock_wait_bound(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Without ``SKIP LOCKED`` the check waits at most a second for a row lock; afterwards the
    session has its own bound again (the pool's, here 7 s), not the server's default (50 s)."""
    if any_database.dialect != "mysql5":
        pytest.skip("the bounded lock wait of MySQL 5.7's revival")
    engine = create_async_engine(any_database.url, pool_size=1, max_overflow=0)

    @event.listens_for(engine.sync_engine, "connect")
    def bound(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 7")
        cursor.close()

    try:
        repo = open_store(engine, any_database.dialect).tasks
        await _due_rows(any_engine, "d", 1)
        await repo.poll(["d"], 10, "gone", any_database.strategies[0])
        async with any_engine.begin() as conn:
            await conn.execute(update(T).values(last_heartbeat=datetime(2000, 1, 1)))
        assert len((await repo.revive_dead(["d"], timedelta(minutes=1))).revived) == 1
        async with engine.connect() as conn:
            wait = (await conn.execute(text("SELECT @@SESSION.innodb_lock_wait_timeout"))).one()
        assert wait[0] == 7
    finally:
        await engine.dispose()
