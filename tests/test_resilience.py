"""Database unreachable at start, a missing table, stale executions and a wrong local clock.

Every test runs on every available database (``any_*`` fixtures).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    ExecutionContext,
    OffsetClock,
    Schedules,
    SchemaMissingError,
    create_schema,
    scheduled_tasks,
)

from .conftest import Database
from .helpers import CountingJob, RecordingJob, RegistryFactory, TcpProxy, db_now, wait_until


async def test_start_returns_promptly_while_the_database_is_unreachable_then_works(
    any_registries: RegistryFactory,
    any_database: Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The unreachable-database story: the dialect comes from the URL, not from a first connection,
    so the SQL is right once the database appears (no generic SQL pinned while it was away)."""
    proxy = TcpProxy(any_database.url)
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = any_registries.build(job, url=proxy.url.render_as_string(hide_password=False))
    assert registry.store.dialect.name == any_database.dialect
    began = time.monotonic()
    await registry.start()
    assert time.monotonic() - began < 5  # a wait for the database would last until it is up
    await wait_until(lambda: registry.status().database_reachable is False, what="an error")
    status = registry.status()
    assert not status.ready and status.last_error and "startup" in status.last_error
    caplog.clear()
    await proxy.start()
    try:
        with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
            await wait_until(lambda: len(job.slots) >= 2, timeout=15, what="runs once reachable")
        status = registry.status()
        assert status.database_reachable is True and status.last_successful_poll is not None
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [e for e in errors if "poll" in e or "recording" in e], errors
    finally:
        await registry.stop()
        await proxy.stop()


async def test_missing_table_says_how_to_create_it_and_recovers(
    any_registries: RegistryFactory, any_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    # a database without the table: use a second, empty schema-less table name
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = any_registries.build(job, customize=lambda b: b.table_name("other_tasks"))
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        await wait_until(lambda: registry.status().last_error is not None, what="an error")
    message = registry.status().last_error or ""
    assert "'other_tasks' does not exist" in message
    migration = f"{any_database.migrations}/V0001__create_scheduled_tasks.sql"
    assert "create_schema" in message and migration in message
    assert "ekbatan-jobs migrate" in message
    assert any("create_schema" in r.getMessage() for r in caplog.records)
    with pytest.raises(SchemaMissingError, match="create_schema"):
        await registry.client.list()
    await create_schema(registry.engine, "other_tasks")
    await wait_until(lambda: len(job.slots) >= 1, timeout=15, what="runs once created")


class LoopingJob(RecordingJob):
    """Loops until released, watching its heartbeat state like a long invoice loop would."""

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


async def test_a_heartbeat_answered_late_counts_from_when_it_was_sent(
    registries: RegistryFactory,
) -> None:
    """A heartbeat whose answer comes back late (the process was stopped, SIGSTOP, while it
    was in flight) was stored by the database when it was sent: ``fraction_dead`` counts
    from then, as the peers that may revive the row see it. Counted from the late answer, a
    polite job that watches it ran on after the stall, as if its heartbeat were fresh, while
    a peer had taken its row over (a chaos run showed it)."""
    job = LoopingJob()
    registry = await registries.start(job)
    await asyncio.wait_for(job.started.wait(), 5)
    state = job.contexts[0].heartbeat_state
    tasks = registry.store.tasks
    heartbeat = tasks.heartbeat

    async def answered_late(*args: object, **kwargs: object) -> set[tuple[str, str]]:
        alive = await heartbeat(*args, **kwargs)  # type: ignore[arg-type]
        await asyncio.sleep(0.6)  # the answer waits while the process is stopped
        return alive

    tasks.heartbeat = answered_late  # type: ignore[method-assign,assignment]
    try:
        await registry.scheduler.housekeeper.heartbeat()
        # every heartbeat that has succeeded since was sent at least 0.6 s ago
        assert state.since_last_success >= timedelta(seconds=0.55), state
        assert state.failed_heartbeats == 0
    finally:
        del tasks.heartbeat
        job.release.set()


async def test_stale_execution_cannot_record_its_result(
    any_registries: RegistryFactory, any_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    stale_job = LoopingJob()
    stale = await any_registries.start(stale_job)
    await asyncio.wait_for(stale_job.started.wait(), 5)

    async def partitioned(*_args: object, **_kwargs: object) -> None:
        raise OSError("network partition")

    # This instance can no longer reach the database, but its job runs on.
    stale.store.tasks.heartbeat = partitioned  # type: ignore[method-assign,assignment]
    stale.store.tasks.poll = partitioned  # type: ignore[method-assign,assignment]
    peer_job = RecordingJob("looping", Schedules.fixed_delay(timedelta(hours=1)))
    await any_registries.start(peer_job)
    await asyncio.wait_for(peer_job.started.wait(), 5)  # revived and rerun on the peer
    assert peer_job.slots == stale_job.slots, "the revived run keeps the slot"
    ctx = stale_job.contexts[0]
    assert ctx.heartbeat_state.has_stale_heartbeat
    assert ctx.heartbeat_state.failed_heartbeats >= 3
    # the revival is judged on the database clock, the local fraction on this process's: give
    # the local one the few milliseconds by which it may trail
    await wait_until(lambda: stale_job.seen_fraction >= 1.0, timeout=2, what="fraction 1.0")
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        stale_job.release.set()
        await wait_until(lambda: stale.scheduler.running == {}, what="the stale run to end")
    assert any("result not recorded" in r.getMessage() for r in caplog.records)
    async with any_engine.connect() as conn:
        row = (await conn.execute(select(scheduled_tasks))).one()
    assert row.last_success is not None and row.picked is False  # recorded by the peer only
    assert row.picked_by is None


@pytest.mark.parametrize("skew", [timedelta(hours=1), timedelta(hours=-1)])
async def test_wrong_local_clock_neither_runs_early_nor_declares_peers_dead(
    any_registries: RegistryFactory, any_engine: AsyncEngine, skew: timedelta
) -> None:
    long_job = LoopingJob()
    await any_registries.start(long_job)  # a healthy peer with a correct clock
    await asyncio.wait_for(long_job.started.wait(), 5)
    job = CountingJob()
    skewed = await any_registries.start(
        job, LoopingJob(), customize=lambda b: b.clock(OffsetClock(skew))
    )
    due = await db_now(any_engine) + timedelta(milliseconds=500)
    await skewed.client.schedule("count", "soon", at=due)
    await wait_until(lambda: job.runs["soon"] == 1, what="the scheduled run")
    ran_at = await db_now(any_engine)
    assert ran_at >= due, "ran before it was due on the database clock"
    # the skew is an hour: a run delayed by the slow clock would come an hour late
    assert ran_at - due < timedelta(seconds=30), "a slow clock must not delay the run"
    await asyncio.sleep(1.2)  # longer than the dead window (0.1 s x 10)
    assert len(long_job.slots) == 1 and long_job.contexts[0].heartbeat_state.failed_heartbeats == 0
    async with any_engine.connect() as conn:
        version = (
            await conn.execute(
                select(scheduled_tasks.c.version).where(scheduled_tasks.c.task_name == "looping")
            )
        ).scalar_one()
    assert version == 2, "the peer's execution was not revived"
    long_job.release.set()


async def test_engine_passed_in_is_not_disposed(
    any_database_url: str, any_registries: RegistryFactory
) -> None:
    engine = create_async_engine(any_database_url)
    await create_schema(engine)
    registry = any_registries.build(CountingJob(), url=None)
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
        # on a loaded machine a lag before the job started may come first ("none" running):
        # wait for the one that names the blocking job
        await wait_until(lambda: bool(_lag_naming(caplog, "blocker/recurring")), what="the job")
    status = registry.status()
    assert status.max_loop_lag >= 0.3 and status.last_loop_lag_at is not None
    assert "plain `def`" in _lag_naming(caplog, "blocker/recurring")


def _lag_naming(caplog: pytest.LogCaptureFixture, suspect: str) -> str:
    """The first loop-lag report that names ``suspect`` among the running executions."""
    for record in caplog.records:
        message = record.getMessage()
        if "event loop was blocked" in message and f"executions: {suspect}" in message:
            return message
    return ""
