"""An application with tens of thousands of recurring jobs: startup, polls and the cleanup of
unresolved rows never put one bound parameter per job name into a statement (PostgreSQL
refuses more than 32,767; the old cleanup failed past that); a cron text is parsed once for
all its jobs, and startup's many rows go out as executemanys (issue #17, startup with 100,000
jobs)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from croniter import croniter
from sqlalchemy import event, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import Schedules, scheduled_tasks
from ekbatan_fastapi.domain import wallclock
from ekbatan_fastapi.domain.errors import ScheduleError
from ekbatan_fastapi.domain.rows import Finish, FinishKind, NewTask, Owned, PollingStrategy
from ekbatan_fastapi.domain.wallclock import Cron
from ekbatan_fastapi.engine import definitions as definitions_module
from ekbatan_fastapi.engine.poller import PACE, paced
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.postgresql import statements as q

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, db_now, is_mysql, wait_until

T = scheduled_tasks
NAMES = [f"job-{i:05d}" for i in range(40_000)]


@pytest.mark.slow
async def test_cleanup_recurring_rows_and_polls_with_40000_names(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    repo = open_store(any_engine, any_database.dialect).tasks
    now = await db_now(any_engine)
    inserted = await repo.insert_missing(
        [NewTask(name, "recurring", now + timedelta(hours=1)) for name in NAMES]
    )
    assert len(inserted) == len(NAMES)
    old = now - timedelta(days=20)
    rows = [
        ("gone-a", "x", old),
        ("gone-b", "y", old),
        ("gone-c", "fresh", now),
        (NAMES[7], "old", old),
    ]
    async with any_engine.begin() as conn:
        await conn.execute(
            insert(T),
            [
                {"task_name": n, "task_instance": i, "execution_time": at, "picked": False}
                | {"version": 1, "priority": 0}
                for n, i, at in rows
            ],
        )
    found = await repo.recurring_rows(NAMES, "recurring")
    assert len(found) == len(NAMES)

    deleted = await repo.delete_unresolved(NAMES, timedelta(days=14))

    assert deleted == 2  # gone-a and gone-b; not the fresh one, not a known name's old row
    async with any_engine.connect() as conn:
        left = await conn.scalar(select(func.count()).select_from(T))
    assert left == len(NAMES) + 2
    for strategy in PollingStrategy:
        if strategy == PollingStrategy.LOCK_AND_FETCH and not repo.supports_skip_locked:
            continue
        result = await repo.poll(NAMES, 50, "me", strategy)
        assert [r.task_instance for r in result.claimed] == ["old"]
        assert result.next_due is not None and result.next_due > now
        await repo.release_orphans("me", set(), timedelta(0))


@pytest.mark.slow
async def test_a_registry_with_40000_recurring_jobs_starts_and_runs_what_is_due(
    any_database: Database, any_registries: RegistryFactory
) -> None:
    yearly = Schedules.cron("0 0 1 1 *")  # deterministic: startup reads every row back
    jobs = [RecordingJob(name, yearly) for name in NAMES[10:]]
    due = [RecordingJob(name, Schedules.fixed_delay(timedelta(hours=1))) for name in NAMES[:10]]
    registry = any_registries.build(*due, *jobs, poll=0.5)
    await registry.start()
    # 40,000 schedules computed and written at startup: seconds on a loaded 2-core machine
    assert await registry.wait_until_ready(60), registry.status()
    await wait_until(lambda: all(j.slots for j in due), what="the due jobs' first runs")
    assert not any(j.slots for j in jobs)
    async with registry.engine.connect() as conn:
        count = await conn.scalar(select(func.count()).select_from(T))
    assert count == len(NAMES)
    repo = registry.scheduler.store.tasks
    assert await repo.delete_unresolved(NAMES, timedelta(days=14)) == 0


HOUR = timedelta(hours=1)
ODD = [
    'say "hi"',
    "back\\slash",
    "a,b",
    "{braces}",
    " spaced ",
    "NULL",
    "ünï-cødé ✓",
    "'",
    "100% done",
    "not (:names)",
]
MANY = [*ODD, *(f"filler-{i}" for i in range(q.MANY_NAMES))]


async def test_polls_with_many_names_claim_the_rows_of_names_of_any_characters(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """From ``MANY_NAMES`` names on, PostgreSQL's polls take the names as one array literal:
    quotes, backslashes, commas, braces, spaces and the word NULL are names like any other."""
    repo = open_store(any_engine, any_database.dialect).tasks
    now = await db_now(any_engine)
    due = now - timedelta(seconds=1)
    await repo.insert_missing(
        [NewTask(name, "i", due) for name in ODD] + [NewTask("not-polled", "i", due)]
    )
    for strategy in PollingStrategy:
        if strategy == PollingStrategy.LOCK_AND_FETCH and not repo.supports_skip_locked:
            continue
        result = await repo.poll(MANY, 50, "me", strategy)
        assert sorted(r.task_name for r in result.claimed) == sorted(ODD)
        await repo.release_orphans("me", set(), timedelta(0))


async def test_the_dead_execution_check_with_many_names_of_any_characters(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """The dead-execution check sends the names as the polls do (PostgreSQL: one array
    literal): the dead rows of names with quotes, backslashes, commas, braces or the word NULL
    are revived, a live one of them is not, and a row of a name not asked for stays dead."""
    repo = open_store(any_engine, any_database.dialect).tasks
    now = await db_now(any_engine)
    due = now - timedelta(seconds=1)
    await repo.insert_missing(
        [NewTask(name, "i", due) for name in ODD] + [NewTask("not-polled", "i", due)]
    )
    strategy = (
        PollingStrategy.LOCK_AND_FETCH if repo.supports_skip_locked else PollingStrategy.FETCH
    )
    claimed = (await repo.poll([*MANY, "not-polled"], 50, "me", strategy)).claimed
    assert len(claimed) == len(ODD) + 1
    live = ODD[0]
    tasks = scheduled_tasks
    async with any_engine.begin() as conn:  # every heartbeat an hour old but one
        await conn.execute(
            update(tasks).where(tasks.c.task_name != live).values(last_heartbeat=now - HOUR)
        )
    revival = await repo.revive_dead(MANY, timedelta(minutes=1))
    assert sorted(r.task_name for r in revival.revived) == sorted(n for n in ODD if n != live)
    assert revival.next_death is not None  # the live one's
    async with any_engine.connect() as conn:
        picked = (
            (await conn.execute(select(tasks.c.task_name).where(tasks.c.picked.is_(True))))
            .scalars()
            .all()
        )
    assert sorted(picked) == sorted([live, "not-polled"])


async def test_mysql_names_written_into_the_text_in_either_escaping_mode(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """MySQL/MariaDB's poll and dead-execution check write the names into the statement's
    text once (the driver's escaping, kept per escaping mode): with ``NO_BACKSLASH_ESCAPES``
    a backslash or a quote in a name is written as that mode reads it."""
    if any_database.dialect != "mysql":
        pytest.skip("MySQL/MariaDB's statements")
    mode = "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')"
    engine = create_async_engine(any_database.url, connect_args={"init_command": mode})
    try:
        async with engine.connect() as conn:
            assert "NO_BACKSLASH_ESCAPES" in (await conn.scalar(text("SELECT @@sql_mode")))
        repo = open_store(engine, any_database.dialect).tasks
        now = await db_now(engine)
        await repo.insert_missing([NewTask(name, "i", now - timedelta(seconds=1)) for name in ODD])
        claimed = (await repo.poll(MANY, 50, "me", PollingStrategy.LOCK_AND_FETCH)).claimed
        assert sorted(r.task_name for r in claimed) == sorted(ODD)
        owned = [Owned(r.task_name, r.task_instance, r.version) for r in claimed]
        assert await repo.heartbeat(owned) == {o.key for o in owned}
        async with engine.begin() as conn:
            await conn.execute(update(scheduled_tasks).values(last_heartbeat=now - HOUR))
        revival = await repo.revive_dead(MANY, timedelta(minutes=1))
        assert sorted(r.task_name for r in revival.revived) == sorted(ODD)
        claimed = (await repo.poll(MANY, 50, "me", PollingStrategy.LOCK_AND_FETCH)).claimed
        done = [
            Finish(Owned(r.task_name, r.task_instance, r.version), FinishKind.DELETED)
            for r in claimed
        ]
        assert await repo.finish(done, picked_by="me") == {d.owned.key for d in done}
        async with engine.connect() as conn:
            assert await conn.scalar(select(func.count()).select_from(scheduled_tasks)) == 0
    finally:
        await engine.dispose()


async def test_postgres_many_names_literal_and_plan(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """The literal reads back as the names, and the poll checks a row's name with one hash
    probe (a hashed subplan), in a custom and a generic plan: no name-by-name estimate when
    planning, no linear search of the names per row."""
    if is_mysql(any_engine):
        pytest.skip("PostgreSQL's statements (MySQL/MariaDB expand the names client-side)")
    stmt = q.Statement("poll", q.lock_and_fetch("scheduled_tasks", None, window=None))
    async with any_engine.connect() as conn:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        literal = q.names_literal(MANY)
        assert await driver.fetchval("SELECT CAST(CAST($1 AS text) AS text[])", literal) == MANY
        for mode in ("force_custom_plan", "force_generic_plan"):
            async with driver.transaction():
                await driver.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = await driver.fetchval(
                    f"EXPLAIN (FORMAT JSON) {stmt.sql}",
                    *stmt.args({"names": literal, "limit": 50, "picked_by": "me"}),
                )
            text_of_plan = plan if isinstance(plan, str) else json.dumps(plan)
            assert "hashed SubPlan" in text_of_plan, text_of_plan
            assert "task_name = ANY" not in text_of_plan, text_of_plan  # no array search


def test_a_cron_text_is_parsed_once_for_many_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation, the parsed form and the first slot after startup's now are kept per text:
    100,000 jobs of one expression pay croniter's parse once, not three times each."""
    for cache in (wallclock._cron_problem, wallclock._cron_template, wallclock._cron_slot_after):
        cache.cache_clear()
    expand = croniter._expand
    parses: list[str] = []

    def counted(expression: str, *args: Any, **kwargs: Any) -> Any:
        parses.append(expression)
        return expand(expression, *args, **kwargs)

    monkeypatch.setattr(croniter, "_expand", staticmethod(counted))
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    first = Cron("0 0 1 1 *", "Europe/Rome")
    assert first.initial_execution_time(now) == datetime(2026, 12, 31, 23, tzinfo=UTC)
    # once each: every field alone (the field-by-field check behind the messages), then the
    # expression itself
    assert parses == ["0 * * * *", "* 0 * * *", "* * 1 * *", "* * * 1 *", "* * * * *", "0 0 1 1 *"]
    once = len(parses)
    for _ in range(1_000):
        schedule = Schedules.cron("0  0 1 1 *", zone="Europe/Rome")  # the same text, normalised
        assert schedule.initial_execution_time(now) == datetime(2026, 12, 31, 23, tzinfo=UTC)
    for day in range(1, 30):  # other instants: new slots, still no new parse
        first.next_execution_time(now, now + timedelta(days=day))
        first.slot_at_or_before(now + timedelta(days=day))
    assert len(parses) == once
    for _ in range(3):  # a bad text: judged once, the same message every time
        with pytest.raises(ScheduleError, match=r"the minute field '61' .*out of range"):
            Cron("61 * * * *")
    assert len(parses) == once


async def test_paced_gives_the_event_loop_turns() -> None:
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    before = turns
    assert [i async for i in paced(range(5 * PACE))] == list(range(5 * PACE))
    task.cancel()
    assert turns - before >= 4


async def test_startup_sends_many_rows_in_few_statements(
    any_database: Database, any_registries: RegistryFactory
) -> None:
    """5,000 recurring jobs: the definitions go out as executemanys of 1,000 rows, each the
    same one-row statement (compiled once); the recurring rows as one statement of arrays
    (PostgreSQL) or multi-row INSERTs written out whole, with no parameter for the driver to
    escape (MySQL/MariaDB, ``store/mysql/tasks.py`` ``insert_texts``: about 1 MB each). No
    other statement's text grows with the rows."""
    yearly = Schedules.cron("0 0 1 1 *")
    registry = any_registries.build(*(RecordingJob(n, yearly) for n in NAMES[:5000]), poll=0.5)
    sent: list[tuple[str, bool, int]] = []

    def record(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
        if "INSERT INTO" in statement.upper():
            sent.append((statement, many, len(params) if many else 1))

    event.listen(registry.engine.sync_engine, "before_cursor_execute", record)
    await registry.start()
    assert await registry.wait_until_ready(60), registry.status()
    definitions = [s for s in sent if "ekbatan_jobs" in s[0]]
    assert [(many, n) for _, many, n in definitions] == [(True, 1000)] * 5
    assert len({text for text, _, _ in definitions}) == 1
    rows = [s for s in sent if "scheduled_tasks" in s[0]]
    if not any_database.is_mysql:
        assert [(many, n) for _, many, n in rows] == [(False, 1)]  # unnest of five arrays
        assert all(len(text) < 2000 for text, _, _ in sent)
    else:
        assert [(many, n) for _, many, n in rows] == [(False, 1)] * len(rows)
        assert len(rows) <= 2 and all(len(text) < 1_100_000 for text, _, _ in rows)
        assert sum(text.count("),(") + 1 for text, _, _ in rows) == 5000
        assert all(len(text) < 2000 for text, _, _ in definitions)
    async with registry.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(T)) == 5000
        assert await conn.scalar(text("SELECT count(*) FROM ekbatan_jobs")) == 5000


async def test_a_re_read_of_the_definitions_starts_where_the_last_one_began(
    any_registries: RegistryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-reads started at the newest definition seen (less 5 s): 100,000 definitions written
    within 5 s were all read again at every heartbeat round. Now each is read once."""
    monkeypatch.setattr(definitions_module, "_OVERLAP", timedelta(0))
    yearly = Schedules.cron("0 0 1 1 *")
    registry = any_registries.build(*(RecordingJob(n, yearly) for n in NAMES[:1500]), poll=0.5)
    read: list[int] = []
    store = registry.scheduler.definitions.store
    original = store.definitions

    async def counted(*args: Any, **kwargs: Any) -> Any:
        found = await original(*args, **kwargs)
        if kwargs.get("since") is not None or not args:
            read.append(len(found))
        return found

    monkeypatch.setattr(store, "definitions", counted)
    await registry.start()
    assert await registry.wait_until_ready(60), registry.status()
    for _ in range(3):
        await registry.scheduler.definitions.refresh()  # shared with the heartbeat rounds
    assert read[-1] == 0 and read[-2] == 0
    assert sum(read) <= 1500  # its own 1,500, at most once (paged by 1,000)
