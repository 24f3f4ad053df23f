"""Rows written by hand into ``scheduled_tasks``: each is handled by a documented rule, and
every other task keeps running (docs/robustness.md lists the rules)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, OneTimeJob, RetryLater, Schedules
from ekbatan_fastapi.domain.failure import FailureHandler

from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until

INSERT = text(
    "INSERT INTO scheduled_tasks (task_name, task_instance, task_data, execution_time, picked, "
    "picked_by, last_heartbeat, version, consecutive_failures, priority) "
    "VALUES (:name, :instance, :data, :time, :picked, :by, :hb, :version, NULL, NULL)"
)


async def insert(
    engine: AsyncEngine,
    name: str,
    instance: str = "recurring",
    *,
    at: datetime | None = None,
    data: bytes | None = None,
    picked: bool = False,
    by: str | None = None,
    version: int = 1,
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            INSERT,
            {
                "name": name,
                "instance": instance,
                "data": data,
                "time": at or datetime.now(UTC),
                "picked": picked,
                "by": by,
                "hb": None,
                "version": version,
            },
        )


async def row(engine: AsyncEngine, name: str, instance: str = "recurring") -> object:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT * FROM scheduled_tasks WHERE task_name = :n AND task_instance = :i"),
                {"n": name, "i": instance},
            )
        ).one_or_none()


class ReadsData(OneTimeJob):
    def __init__(self) -> None:
        self.seen: list[object] = []

    def name(self) -> str:
        return "reads-data"

    def failure_handler(self) -> FailureHandler:
        return RetryLater(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.seen.append(ctx.data)


async def test_picked_row_without_heartbeat_is_revived_as_dead(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    slot = datetime.now(UTC) - timedelta(minutes=5)
    await insert(engine, "orphan", at=slot, picked=True, by="ghost", version=4)
    job = RecordingJob("orphan", Schedules.fixed_delay(timedelta(hours=1)))
    await registries.start(job)
    await wait_until(lambda: bool(job.slots), what="the orphan revived and run")
    assert job.slots == [slot]


async def test_undecodable_task_data_fails_that_instance_only_and_keeps_the_row(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await insert(engine, "reads-data", "java", data=b"\xac\xed\x00\x05sr\x00")
    reader, counter = ReadsData(), CountingJob()
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        registry = await registries.start(reader, counter)
        await registry.client.schedule("count", "healthy")
        await wait_until(lambda: counter.runs["healthy"] == 1, what="the healthy task")
        await wait_until(lambda: _failed_once(engine), what="the corrupt one failing")
    assert reader.seen == []
    assert any("not UTF-8 JSON" in (r.exc_text or "") for r in caplog.records)
    kept = await row(engine, "reads-data", "java")
    assert kept.task_data == b"\xac\xed\x00\x05sr\x00"  # type: ignore[attr-defined]


async def _failed_once(engine: AsyncEngine) -> bool:
    r = await row(engine, "reads-data", "java")
    return r is not None and r.consecutive_failures == 1  # type: ignore[attr-defined]


async def test_recurring_row_from_1970_runs_once_then_moves_to_the_future(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    ancient = datetime(1970, 1, 1, tzinfo=UTC)
    await insert(engine, "old", at=ancient)
    job = RecordingJob("old", Schedules.cron("*/5 * * * *"))
    # not a revival test: a 5 s dead window, so that an event loop starved for over 1 s on a
    # loaded machine does not get its own execution revived (and run twice)
    await registries.start(job, customize=lambda b: b.missed_heartbeats_limit(50))
    await wait_until(lambda: bool(job.slots), what="the ancient slot")
    await wait_until(lambda: _in_future(engine, "old"), what="the next slot")
    assert job.slots == [ancient]


async def _in_future(engine: AsyncEngine, name: str) -> bool:
    r = await row(engine, name)
    return r is not None and not r.picked and r.execution_time > datetime.now(UTC)  # type: ignore[attr-defined]


async def test_row_at_year_9999_never_runs_and_a_daily_one_is_repaired(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    far = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    await insert(engine, "far-daily", at=far)
    await insert(engine, "count", "far-future", at=far)
    daily = RecordingJob("far-daily", Schedules.daily(time(3, 0)))
    counter = CountingJob()
    registry = await registries.start(daily, counter)
    await registry.client.schedule("count", "now")
    await wait_until(lambda: counter.runs["now"] == 1, what="other work running")
    repaired = await row(engine, "far-daily")
    assert repaired.execution_time.time() == time(3, 0)  # type: ignore[attr-defined]
    assert repaired.execution_time < datetime.now(UTC) + timedelta(days=1)  # type: ignore[attr-defined]
    assert counter.runs["far-future"] == 0
    assert registry.status().loop_restarts == 0
