"""Schedules as data across separate OS processes, on every available database: each slot of
each schedule once, updates and deletes while they run, and a SIGKILL mid-run."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, PersistentScheduleJob, scheduled_tasks

from .conftest import Database
from .helpers import RegistryFactory, Worker, db_now, wait_until
from .proc_worker import LEDGERS, schedule_ledger

pytestmark = pytest.mark.slow


class PerSlots(PersistentScheduleJob):
    """The workers' job, registered here only to create and change its schedules."""

    def name(self) -> str:
        return "perslots"

    async def execute(self, ctx: ExecutionContext) -> None:
        raise AssertionError("the test process runs no scheduler")


_SOAK = ("--poll", "0.2", "--heartbeat", "1.0")


def _args(database: Database, *extra: str) -> list[str]:
    return [*extra, *(["--dialect", database.override] if database.override else [])]


async def _ledger(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        query = select(schedule_ledger).order_by(schedule_ledger.c.slot)
        return list(await conn.execute(query))


async def test_three_processes_run_each_slot_of_each_schedule_once(
    any_database: Database, any_engine: AsyncEngine, any_registries: RegistryFactory
) -> None:
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[schedule_ledger])
    client = any_registries.build(PerSlots()).client
    workers = await asyncio.gather(
        *(
            # a 4 s dead window (heartbeat 1 s): this test revives nothing, and on a loaded
            # machine a process held off the CPU for 0.8 s has its executions revived (then
            # run twice: correct for those settings, not this test)
            Worker.start("schedules", any_database.url, *_args(any_database, *_SOAK))
            for _ in range(3)
        )
    )
    try:
        await client.create_schedules(
            "perslots", [(f"s{i}", "FIXED_RATE|PT0.5S", {"n": i}) for i in range(12)]
        )
        await asyncio.sleep(3)
        await client.update_schedule("perslots", "s1", data={"n": 101})
        assert await client.delete_schedule("perslots", "s2")
        deleted_at = await db_now(any_engine)
        await asyncio.sleep(3)
        stopping = await db_now(any_engine)
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    rows = [r for r in await _ledger(any_engine) if r.slot < stopping]
    by_schedule: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_schedule[row.instance].append(row)
    step = timedelta(milliseconds=500)
    for instance, runs in by_schedule.items():
        slots = [r.slot for r in runs]
        gaps = [b - a for a, b in itertools.pairwise(slots)]
        # the job's CatchUp.all: a slot found late (a loaded machine) still runs, so every
        # slot from the first to the last ran, each once
        assert all(g == step for g in gaps), (instance, gaps)
    assert len(by_schedule) == 12
    assert all(len(runs) >= 5 for i, runs in by_schedule.items() if i != "s2"), {
        i: len(r) for i, r in by_schedule.items()
    }
    # the data change: later slots carry it, earlier ones the old data
    s1 = [json.loads(r.data)["n"] for r in by_schedule["s1"]]
    assert s1[0] == 1 and s1[-1] == 101 and s1 == sorted(s1)
    # the delete: nothing started after it (one running then may finish), nothing written
    assert all(r.slot < deleted_at + step for r in by_schedule["s2"])
    async with any_engine.connect() as conn:
        left = [r[0] for r in await conn.execute(select(scheduled_tasks.c.task_instance))]
        failed = (
            await conn.execute(
                select(scheduled_tasks.c.task_instance).where(
                    scheduled_tasks.c.last_failure.is_not(None)
                )
            )
        ).all()
    assert "s2" not in left and len(left) == 11
    assert failed == [], "an execution failed (a duplicate slot would)"


async def test_a_schedule_killed_mid_run_is_revived_with_the_data_it_was_claimed_with(
    any_database: Database, any_engine: AsyncEngine, any_registries: RegistryFactory
) -> None:
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[schedule_ledger])
    client = any_registries.build(PerSlots()).client
    args = _args(any_database, "--poll", "0.2", "--heartbeat", "0.2")
    first = await Worker.start("schedules", any_database.url, *args)
    second: Worker | None = None
    try:
        await client.create_schedule("perslots", "h", "FIXED_RATE|PT1H", {"hang": True, "n": 7})

        async def started(count: int) -> bool:
            return len(await _ledger(any_engine)) >= count

        await wait_until(lambda: started(1), what="the first run")
        (run,) = await _ledger(any_engine)
        assert run.pid == first.pid
        second = await Worker.start("schedules", any_database.url, *args)
        await first.kill()
        await wait_until(lambda: started(2), timeout=15, what="the revived run")
        (revived,) = [r for r in await _ledger(any_engine) if r.pid != run.pid]
    finally:
        await first.kill()
        if second is not None:
            await second.kill()
    assert revived.pid == second.pid
    assert revived.slot == run.slot and isinstance(run.slot, datetime)
    assert json.loads(revived.data) == {"hang": True, "n": 7}
