"""Database unreachable at start, a missing table, stale executions and a wrong local clock."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    ExecutionContext,
    OffsetClock,
    Schedules,
    SchemaMissingError,
    create_schema,
)

from .helpers import CountingJob, RecordingJob, RegistryFactory, TcpProxy, wait_until


async def test_start_returns_promptly_while_the_database_is_unreachable_then_works(
    registries: RegistryFactory, database_url: str
) -> None:
    proxy = TcpProxy(database_url)
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = registries.build(job, url=proxy.url.render_as_string(hide_password=False))
    began = time.monotonic()
    await registry.start()
    assert time.monotonic() - began < 0.5
    await wait_until(lambda: registry.status().database_reachable is False, what="an error")
    status = registry.status()
    assert not status.ready and status.last_error and "startup" in status.last_error
    await proxy.start()
    try:
        await wait_until(lambda: len(job.slots) >= 2, timeout=15, what="runs once reachable")
        assert registry.status().database_reachable is True
    finally:
        await registry.stop()
        await proxy.stop()


async def test_missing_table_says_how_to_create_it_and_recovers(
    registries: RegistryFactory, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a database without the table: use a second, empty schema-less table name
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = registries.build(job, customize=lambda b: b.table_name("other_tasks"))
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        await wait_until(lambda: registry.status().last_error is not None, what="an error")
    message = registry.status().last_error or ""
    assert "'other_tasks' does not exist" in message
    assert "create_schema" in message and "migrations/postgresql/V0001" in message
    assert any("create_schema" in r.getMessage() for r in caplog.records)
    with pytest.raises(SchemaMissingError, match="create_schema"):
        await registry.client.list()
    await create_schema(registry.engine, "other_tasks")
    await wait_until(lambda: len(job.slots) >= 1, timeout=15, what="runs once created")


class LoopingJob(RecordingJob):
    """Loops until released, watching its heartbeat state like the seed's invoice loop."""

    def __init__(self) -> None:
        super().__init__("looping", Schedules.fixed_delay(timedelta(hours=1)))
        self.release = asyncio.Event()
        self.seen_fraction = 0.0

    async def execute(self, ctx: ExecutionContext) -> None:
        self.contexts.append(ctx)
        self.slots.append(ctx.execution_time)
        self.started.set()
        while not self.release.is_set():
            self.seen_fraction = max(self.seen_fraction, ctx.heartbeat_state.fraction_dead)
            await asyncio.sleep(0.01)


async def test_stale_execution_cannot_record_its_result(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    stale_job = LoopingJob()
    stale = await registries.start(stale_job)
    await asyncio.wait_for(stale_job.started.wait(), 5)

    async def partitioned(*_args: object) -> None:
        raise OSError("network partition")

    # This instance can no longer reach the database, but its job runs on.
    stale.repository.heartbeat = partitioned  # type: ignore[method-assign,assignment]
    stale.repository.poll = partitioned  # type: ignore[method-assign,assignment]
    peer_job = RecordingJob("looping", Schedules.fixed_delay(timedelta(hours=1)))
    await registries.start(peer_job)
    await asyncio.wait_for(peer_job.started.wait(), 5)  # revived and rerun on the peer
    assert peer_job.slots == stale_job.slots, "the revived run keeps the slot"
    ctx = stale_job.contexts[0]
    assert ctx.heartbeat_state.has_stale_heartbeat
    assert ctx.heartbeat_state.failed_heartbeats >= 3
    assert stale_job.seen_fraction >= 1.0
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        stale_job.release.set()
        await wait_until(lambda: stale.scheduler.running == {}, what="the stale run to end")
    assert any("result not recorded" in r.getMessage() for r in caplog.records)
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM scheduled_tasks"))).one()
    assert row.last_success is not None and row.picked is False  # recorded by the peer only
    assert row.picked_by is None


@pytest.mark.parametrize("skew", [timedelta(hours=1), timedelta(hours=-1)])
async def test_wrong_local_clock_neither_runs_early_nor_declares_peers_dead(
    registries: RegistryFactory, engine: AsyncEngine, skew: timedelta
) -> None:
    long_job = LoopingJob()
    await registries.start(long_job)  # a healthy peer with a correct clock
    await asyncio.wait_for(long_job.started.wait(), 5)
    job = CountingJob()
    skewed = await registries.start(
        job, LoopingJob(), customize=lambda b: b.clock(OffsetClock(skew))
    )
    async with engine.connect() as conn:
        db_now = (await conn.execute(text("SELECT now()"))).scalar_one()
    due = db_now + timedelta(milliseconds=500)
    await skewed.client.schedule("count", "soon", at=due)
    await wait_until(lambda: job.runs["soon"] == 1, what="the scheduled run")
    async with engine.connect() as conn:
        ran_at = (await conn.execute(text("SELECT now()"))).scalar_one()
    assert ran_at >= due, "ran before it was due on the database clock"
    assert ran_at - due < timedelta(seconds=1), "a slow clock must not delay the run"
    await asyncio.sleep(0.6)  # longer than the dead window (0.1 s x 6)
    assert len(long_job.slots) == 1 and long_job.contexts[0].heartbeat_state.failed_heartbeats == 0
    async with engine.connect() as conn:
        version = (
            await conn.execute(
                text("SELECT version FROM scheduled_tasks WHERE task_name='looping'")
            )
        ).scalar_one()
    assert version == 2, "the peer's execution was not revived"
    long_job.release.set()


async def test_engine_passed_in_is_not_disposed(
    database_url: str, registries: RegistryFactory
) -> None:
    engine = create_async_engine(database_url)
    await create_schema(engine)
    registry = registries.build(CountingJob(), url=None)
    assert registry.connection.owns_engine
    from ekbatan_fastapi import job_registry

    own = job_registry().connection_provider(engine).with_job(CountingJob()).build()
    assert not own.connection.owns_engine
    async with own:
        await own.wait_until_ready(5)
    async with engine.connect() as conn:  # still usable
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    await engine.dispose()
    _ = datetime.now(UTC)


class BlockingAsyncJob(RecordingJob):
    """Does synchronous work inside ``async def``: the Python analogue of a stalled JVM."""

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        time.sleep(0.4)  # noqa: ASYNC251 - deliberately blocks the event loop


async def test_blocked_event_loop_is_detected_and_reported(
    registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    job = BlockingAsyncJob("blocker", Schedules.fixed_delay(timedelta(hours=1)))
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        registry = await registries.start(job)
        await wait_until(lambda: registry.status().loop_lag_events >= 1, what="lag detected")
    status = registry.status()
    assert status.max_loop_lag >= 0.3 and status.last_loop_lag_at is not None
    messages = [m for r in caplog.records if "event loop was blocked" in (m := r.getMessage())]
    assert messages and "blocker/recurring" in messages[0] and "plain `def`" in messages[0]
