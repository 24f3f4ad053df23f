"""Missed slots named once across three scheduler processes, on every available database: the
recurring row is put 30 minutely slots behind before they start (the cluster was down); one
process claims it, runs the overdue slot and names the 30 it merged, each exactly once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi.store.tables import Tables

from .conftest import Database
from .helpers import Worker, db_now, put_row, wait_until
from .proc_worker import LEDGERS, ledger

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

MINUTE = timedelta(minutes=1)


async def test_three_processes_name_each_missed_slot_once(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[ledger])
    row = await db_now(any_engine) - 30 * MINUTE - timedelta(seconds=1)
    await put_row(any_engine, "missing", row)
    args = ["--heartbeat", "1.0", "--poll", "0.3"]
    if any_database.override:
        args += ["--dialect", any_database.override]
    workers = await asyncio.gather(
        *(Worker.start("missing", any_database.url, *args) for _ in range(3))
    )
    h = Tables().history

    async def missed() -> list[tuple[object, ...]]:
        async with any_engine.connect() as conn:
            rows = await conn.execute(
                select(h.c.execution_time, h.c.error_class, h.c.picked_by)
                .where(h.c.task_name == "missing", h.c.outcome == "missed")
                .order_by(h.c.execution_time)
            )
            return [tuple(r) for r in rows]

    async def all_named() -> bool:
        return len(await missed()) >= 30

    try:
        await wait_until(all_named, timeout=30, what="the 30 merged slots named")
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    named = await missed()
    async with any_engine.connect() as conn:
        ran = [r[0] for r in await conn.execute(select(ledger.c.slot).order_by(ledger.c.slot))]
    assert len(ran) == 1, "one run, of the overdue slot (CatchUp.latest)"
    assert len(named) == 30, "each merged slot named exactly once across the processes"
    slots = [r[0].replace(tzinfo=None) for r in named]
    start = row.replace(tzinfo=None)
    assert slots == [start + k * MINUTE for k in range(1, 31)]
    assert {r[1] for r in named} == {"coalesced"}
    assert len({r[2] for r in named}) == 1, "named by the process that ran the slot"
