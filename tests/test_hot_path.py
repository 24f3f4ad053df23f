"""PostgreSQL's hot path: the connections the busy loops hold, what happens when one of them
dies, and the execution history written by the completion statement itself."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules, create_schema
from ekbatan_fastapi.repository.base import Lease

from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until


def _checked_out(engine: object) -> int:
    return engine.pool.checkedout()  # type: ignore[attr-defined,no-any-return]


async def test_an_idle_scheduler_gives_its_busy_connections_back(
    registries: RegistryFactory,
) -> None:
    job = CountingJob()
    registry = await registries.start(job, customize=lambda b: b.listen(False))
    await registry.client.schedule_many("count", [(f"i{n}", None, None) for n in range(200)])
    await wait_until(lambda: sum(job.runs.values()) == 200, what="the burst")
    # Busy, the poller and the completer each held one; idle, they give them back (after 1 s).
    await wait_until(lambda: _checked_out(registry.engine) == 0, timeout=5, what="returned")


async def test_a_held_connection_that_dies_is_replaced(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restart kills the connections the loops hold: the next statement on each
    fails once, the connection is discarded and the loop goes on with a new one."""
    job = CountingJob()
    registry = await registries.start(
        job, poll=0.05, customize=lambda b: b.listen(False).batch_size(5)
    )
    await registry.client.schedule_many("count", [(f"a{n}", None, None) for n in range(20)])
    await wait_until(lambda: sum(job.runs.values()) == 20, what="the first burst")
    async with engine.connect() as conn:
        killed = (
            await conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        ).scalar_one()
    assert killed >= 1
    async with engine.begin() as conn:  # (the client's pooled connections were killed too)
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "version) SELECT 'count', 'b' || n, now(), false, 1 FROM generate_series(0, 19) n"
            )
        )
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await wait_until(lambda: sum(job.runs.values()) == 40, what="the second burst")
    assert all(job.runs[f"b{n}"] == 1 for n in range(20))
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    assert registry.status().database_reachable is True


async def test_a_lease_discards_its_connection_after_an_error(engine: AsyncEngine) -> None:
    lease = Lease(engine)
    first = await lease.driver()
    await lease.discard()
    assert first.is_closed()
    second = await lease.driver()
    assert second is not first and not second.is_closed()
    lease.idle()
    await asyncio.sleep(1.2)  # idle for longer than a lease keeps a connection
    assert _checked_out(engine) == 0
    await lease.release()


async def test_history_of_a_stale_and_a_fresh_result_in_one_completion(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """One completion statement writes both records: the stale result's as superseded (its
    version matches nothing), the fresh one's as succeeded."""
    job = RecordingJob("twice", Schedules.fixed_delay(timedelta(hours=1)))
    registry = await registries.start(job)
    repository = registry.repository

    async def down(*_args: object, **_kwargs: object) -> set[tuple[str, str]]:
        raise OSError("the database is away")

    repository.finish = down  # type: ignore[method-assign,assignment]
    repository.heartbeat = down  # type: ignore[method-assign,assignment]
    await wait_until(lambda: len(job.slots) >= 2, timeout=10, what="the rerun after revival")
    await wait_until(lambda: len(registry.scheduler._pending) == 2, what="both results pending")
    del repository.finish, repository.heartbeat
    await wait_until(lambda: not registry.scheduler._pending, what="the results written")
    outcomes = sorted(r.outcome for r in await registry.client.history("twice"))
    assert outcomes == ["succeeded", "superseded"]


async def test_history_table_dropped_while_running(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """The history goes off with a warning; results are still recorded."""
    job = CountingJob()
    registry = await registries.start(job)
    await registry.client.schedule("count", "before")
    await wait_until(lambda: job.runs["before"] == 1, what="the first run")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE ekbatan_execution_history"))
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        await registry.client.schedule("count", "after")
        await wait_until(lambda: job.runs["after"] == 1, what="the run without history")
        await wait_until(lambda: not registry.scheduler.running, what="recorded anyway")
    assert await registry.client.get("count", "after") is None, "the one-time row was deleted"
    assert any("history table is gone" in r.getMessage() for r in caplog.records)
    await create_schema(engine)  # back, for the fixtures' clean-up
