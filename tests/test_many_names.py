"""An application with tens of thousands of recurring jobs: startup, polls and the cleanup of
unresolved rows never put one bound parameter per job name into a statement (PostgreSQL
refuses more than 32,767; the old cleanup failed past that)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules, scheduled_tasks
from ekbatan_fastapi.domain.rows import NewTask, PollingStrategy
from ekbatan_fastapi.store.dialects import open_store

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, db_now, wait_until

T = scheduled_tasks
NAMES = [f"job-{i:05d}" for i in range(40_000)]


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
