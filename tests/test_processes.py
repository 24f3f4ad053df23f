"""Cluster behaviour across separate OS processes on one real database."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .helpers import Worker, wait_until

pytestmark = pytest.mark.slow


async def test_three_processes_run_each_200ms_slot_exactly_once(
    database_url: str, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE ledger (slot timestamptz PRIMARY KEY, pid int NOT NULL)")
        )
    workers = await asyncio.gather(*(Worker.start("slots", database_url) for _ in range(3)))
    try:
        await asyncio.sleep(10)  # the 10 s window: a soak, not a timing assertion
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    async with engine.connect() as conn:
        slots = [r[0] for r in await conn.execute(text("SELECT slot FROM ledger ORDER BY slot"))]
        pids = {r[0] for r in await conn.execute(text("SELECT DISTINCT pid FROM ledger"))}
        row = (
            await conn.execute(
                text("SELECT consecutive_failures, last_failure, picked FROM scheduled_tasks")
            )
        ).one()
    # A unique violation would have failed an execution: none did.
    assert row.last_failure is None and not row.picked
    assert pids <= {w.pid for w in workers}
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    period = timedelta(milliseconds=200)
    assert all(g % period == timedelta(0) for g in gaps), "slots left the fixed-rate grid"
    missed = sum(g // period - 1 for g in gaps)
    assert len(slots) >= 45, f"only {len(slots)} slots ran in 10 s"
    assert missed <= 2, f"{missed} slots were skipped: {gaps}"


async def test_killed_execution_is_revived_elsewhere_with_the_same_slot(
    database_url: str, engine: AsyncEngine
) -> None:
    heartbeat, limit = 0.2, 4
    async with engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE starts (slot timestamptz, pid int, started timestamptz)")
        )

    async def starts() -> list[tuple[object, int, object]]:
        async with engine.connect() as conn:
            result = await conn.execute(
                text("SELECT slot, pid, started FROM starts ORDER BY started")
            )
            return [tuple(r) for r in result]

    first = await Worker.start("long", database_url, "--heartbeat", str(heartbeat))
    second: Worker | None = None
    try:
        await wait_until(lambda: _nonempty(starts()), timeout=10, what="first run")
        second = await Worker.start("long", database_url, "--heartbeat", str(heartbeat))
        killed_at = time.monotonic()
        await first.kill()
        await wait_until(
            lambda: _count(starts(), 2), timeout=10, what="the revived run on the second process"
        )
        observed = time.monotonic() - killed_at
        runs = await starts()
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
