"""Cluster behaviour across separate OS processes, on every available database."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import scheduled_tasks

from .conftest import Database
from .helpers import Worker, db_now, wait_until
from .proc_worker import LEDGERS, ledger, starts

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _worker_args(database: Database) -> list[str]:
    return ["--dialect", database.override] if database.override else []


async def test_three_processes_run_each_200ms_slot_exactly_once(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[ledger])
    # A dead window of 4 s (heartbeat 1 s, 4 missed), not the worker's default 0.8 s: this test
    # revives nothing, and on a loaded CI machine a process held off the CPU for 0.8 s had its
    # execution revived by a peer (that slot ran twice: correct for the settings, not the test).
    args = ["--heartbeat", "1.0", *_worker_args(any_database)]
    workers = await asyncio.gather(
        *(Worker.start("slots", any_database.url, *args) for _ in range(3))
    )
    try:
        started = await db_now(any_engine)  # every worker is READY: the soak starts here
        await asyncio.sleep(10)  # the 10 s window: a soak, not a timing assertion
        stopping = await db_now(any_engine)
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    t = scheduled_tasks
    async with any_engine.connect() as conn:
        slots = [r[0] for r in await conn.execute(select(ledger.c.slot).order_by(ledger.c.slot))]
        pids = {r[0] for r in await conn.execute(select(ledger.c.pid).distinct())}
        row = (
            await conn.execute(select(t.c.consecutive_failures, t.c.last_failure, t.c.picked))
        ).one()
    # A unique violation would have failed an execution: none did.
    assert row.last_failure is None and not row.picked
    assert pids <= {w.pid for w in workers}
    period = timedelta(milliseconds=200)
    # the workers start and stop one after another: slots due while they do are not the soak's
    slots = [slot for slot in slots if started <= slot < stopping]
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert all(g % period == timedelta(0) for g in gaps), "slots left the fixed-rate grid"
    missed = sum(g // period - 1 for g in gaps)
    assert len(slots) >= 45, f"only {len(slots)} slots ran in 10 s"
    assert missed <= 2, f"{missed} slots were skipped: {gaps}"


async def test_three_processes_claiming_ahead_start_each_slot_once_and_never_early(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """``claim_ahead`` (every dialect): the 200 ms slots are claimed up to 150 ms before their
    time by whichever process polls first; each runs once, none before its slot."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[ledger])
    args = ["--heartbeat", "1.0", "--claim-ahead", "0.15", *_worker_args(any_database)]
    workers = await asyncio.gather(
        *(Worker.start("slots", any_database.url, *args) for _ in range(3))
    )
    try:
        started = await db_now(any_engine)  # every worker is READY: the soak starts here
        await asyncio.sleep(6)  # a soak, not a timing assertion
        stopping = await db_now(any_engine)
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    async with any_engine.connect() as conn:
        rows = (await conn.execute(select(ledger).order_by(ledger.c.slot))).all()
        picked = (await conn.execute(select(scheduled_tasks.c.picked))).scalar_one()
    assert not picked
    rows = [r for r in rows if started <= r.slot < stopping]
    period = timedelta(milliseconds=200)
    gaps = [b.slot - a.slot for a, b in itertools.pairwise(rows)]
    assert all(g % period == timedelta(0) for g in gaps), "slots left the fixed-rate grid"
    assert len(rows) >= 25, f"only {len(rows)} slots ran in 6 s"
    assert sum(g // period - 1 for g in gaps) <= 2, f"slots were skipped: {gaps}"
    early = [(r.slot, r.started) for r in rows if r.started < r.slot]
    assert not early, f"started before their slots: {early}"


async def test_killed_execution_is_revived_elsewhere_with_the_same_slot(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    heartbeat, limit = 0.2, 4
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[starts])

    async def started() -> list[tuple[object, int, object]]:
        async with any_engine.connect() as conn:
            result = await conn.execute(
                select(starts.c.slot, starts.c.pid, starts.c.started).order_by(starts.c.started)
            )
            return [tuple(r) for r in result]

    args = ["--heartbeat", str(heartbeat), *_worker_args(any_database)]
    first = await Worker.start("long", any_database.url, *args)
    second: Worker | None = None
    try:
        await wait_until(lambda: _nonempty(started()), timeout=10, what="first run")
        second = await Worker.start("long", any_database.url, *args)
        killed_at = time.monotonic()
        await first.kill()
        await wait_until(
            lambda: _count(started(), 2), timeout=10, what="the revived run on the second process"
        )
        observed = time.monotonic() - killed_at
        runs = await started()
    finally:
        await first.kill()
        if second is not None:
            await second.stop()
    (slot1, pid1, _), (slot2, pid2, _) = runs
    assert pid1 == first.pid and pid2 == second.pid
    assert slot1 == slot2, "the revived run must see the same ctx.execution_time"
    bound = heartbeat * limit + heartbeat
    # measured on the database clock: last heartbeat of the dead run -> start of the rerun
    print(f"revived {observed:.3f}s after the kill")
    assert observed < bound + 0.5, f"revived after {observed:.2f}s, dead window + 1 hb = {bound}"


async def _nonempty(rows: object) -> bool:
    return bool(await rows)  # type: ignore[misc]


async def _count(rows: object, n: int) -> bool:
    return len(await rows) >= n  # type: ignore[misc]
