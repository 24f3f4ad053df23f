"""A database that stalls (issue 31): writes block instead of failing, then all go through
together, as a Galera cluster does while it evicts a killed node (every commit of the cluster
waits ~6 s). A write held up so stores the time its statement began: a heartbeat or a claim
committed at the end of the stall reads as old as the stall. A peer that judged at once
revived the rows of a live owner; its own statements had stalled too, but only a heartbeat
was timed, and an instance that runs nothing sends none.

The stall here is a lock held on the scheduler's tables by the test (``LOCK TABLES ... READ``
on MySQL/MariaDB, ``LOCK TABLE ... IN EXCLUSIVE MODE`` on PostgreSQL): reads go on, writes
wait. The full cluster scenario is ``galera-node-kill`` (``tests/test_clusters.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, JobRegistry, OneTimeJob
from ekbatan_fastapi.store.tables import quote_table

from .conftest import Database
from .helpers import RegistryFactory, wait_until

pytestmark = pytest.mark.slow  # a stall longer than the dead window: seconds

HEARTBEAT = 0.2
MISSED = 4
"""A 0.8 s dead window (the cluster scenarios' settings); a statement that takes over 0.4 s
counts as a stall."""


class Holds(OneTimeJob):
    """Runs until released; counts its starts."""

    def __init__(self) -> None:
        self.starts: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def name(self) -> str:
        return "holds"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.starts.append(ctx.task_instance)
        self.started.set()
        await self.release.wait()


@contextlib.asynccontextmanager
async def _stalled(engine: AsyncEngine, registry: JobRegistry) -> AsyncIterator[None]:
    """Writes to the scheduler's tasks and instances tables wait until the block ends."""
    tables = registry.store.db.tables
    names = [quote_table(t, engine.dialect) for t in (tables.tasks, tables.instances)]
    async with engine.connect() as conn:
        if engine.dialect.name in ("mysql", "mariadb"):
            await conn.execute(text("LOCK TABLES " + ", ".join(f"{n} READ" for n in names)))
            try:
                yield
            finally:
                await conn.execute(text("UNLOCK TABLES"))
        else:
            await conn.execute(text(f"LOCK TABLE {', '.join(names)} IN EXCLUSIVE MODE"))
            try:
                yield
            finally:
                await conn.commit()


async def _row(engine: AsyncEngine, registry: JobRegistry) -> Any:
    t = registry.store.db.tables.tasks
    async with engine.connect() as conn:
        return (await conn.execute(select(t.c.picked_by, t.c.version))).one()


async def test_a_stall_longer_than_the_dead_window_revives_no_live_owner(
    any_database: Database, any_engine: AsyncEngine, any_registries: RegistryFactory
) -> None:
    """An owner runs a long execution; a peer runs nothing (no heartbeat to time). Writes
    stall for three dead windows; the owner's heartbeat, held up, is stored with the time it
    was sent. The peer's own writes (its instance report, its claims) were held up as long:
    it must count that as a stall and judge nobody until the owner has heartbeated again."""
    job = Holds()
    options: dict[str, Any] = {
        "heartbeat": HEARTBEAT,
        "customize": lambda b: b.missed_heartbeats_limit(MISSED),
    }
    owner = await any_registries.start(job, **options)
    await owner.client.schedule("holds", "long")
    await asyncio.wait_for(job.started.wait(), 10)
    claimed = await _row(any_engine, owner)
    peer = await any_registries.start(Holds(), **options)
    dead = owner.config.dead_after.total_seconds()
    await asyncio.sleep(2 * HEARTBEAT)  # a few rounds of both, judging (nothing dead)
    assert peer.scheduler.link.since_stall() == float("inf")
    try:
        async with _stalled(any_engine, owner):
            await asyncio.sleep(3 * dead)
        # the peer saw its own writes stall (before: only a heartbeat was timed, and it
        # runs nothing, so it judged at once what the stall had left looking dead)
        await wait_until(
            lambda: peer.scheduler.link.since_stall() < dead,
            what="the peer counting the stall",
        )
        await wait_until(
            lambda: owner.scheduler.link.since_stall() < dead,
            what="the owner counting the stall",
        )
        await asyncio.sleep(dead + 3 * HEARTBEAT)  # rounds of both after the stall
        assert job.starts == ["long"], "the live owner's execution was revived and ran again"
        row = await _row(any_engine, owner)
        assert row.picked_by == owner.config.scheduler_name
        assert row.version == claimed.version, "revived meanwhile"
    finally:
        job.release.set()
    await wait_until(lambda: not owner.scheduler.running, what="the result recorded")
