"""Failures, missed slots and unresolved rows, on every available database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ExecutionContext,
    MaxRetries,
    OneTimeJob,
    RetryLater,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.failure import FailureHandler

from .helpers import Polls, RecordingJob, RegistryFactory, db_now, wait_until

T = scheduled_tasks


async def _row(engine: AsyncEngine, name: str, instance: str = "recurring") -> object:
    async with engine.connect() as conn:
        result = await conn.execute(
            select(T).where(T.c.task_name == name, T.c.task_instance == instance)
        )
        return result.one_or_none()


async def _insert(engine: AsyncEngine, *rows: tuple[str, str, datetime]) -> None:
    values = [
        {"task_name": n, "task_instance": i, "execution_time": at, "picked": False, "version": 1}
        for n, i, at in rows
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(T), values)


async def test_failure_counts_reschedules_and_success_resets(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    flaky = RecordingJob("flaky", Schedules.fixed_delay(timedelta(milliseconds=50)), fail=True)
    steady = RecordingJob("steady", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = await any_registries.start(flaky, steady)
    await wait_until(lambda: len(flaky.slots) >= 3, what="three failures")
    await wait_until(
        lambda: _failures_at_least(any_engine, 3), what="consecutive_failures reaching 3"
    )
    row = await _row(any_engine, "flaky")
    assert row.last_failure is not None and row.last_success is None  # type: ignore[attr-defined]
    assert row.execution_time > row.last_failure - timedelta(seconds=1)  # type: ignore[attr-defined]
    assert len(steady.slots) >= 3, "a failing job never stops the others"
    assert registry.status().loop_restarts == 0
    flaky.fail = False
    await wait_until(lambda: _succeeded(any_engine), what="a success resetting the counter")
    row = await _row(any_engine, "flaky")
    assert row.consecutive_failures == 0 and row.last_failure is not None  # type: ignore[attr-defined]


async def _failures_at_least(engine: AsyncEngine, n: int) -> bool:
    row = await _row(engine, "flaky")
    return (row.consecutive_failures or 0) >= n  # type: ignore[attr-defined]


async def _succeeded(engine: AsyncEngine) -> bool:
    row = await _row(engine, "flaky")
    return row.last_success is not None and not row.picked  # type: ignore[attr-defined]


class Failing(OneTimeJob):
    def __init__(self, handler: FailureHandler) -> None:
        self.handler = handler
        self.attempts: list[int] = []

    def name(self) -> str:
        return "failing"

    def failure_handler(self) -> FailureHandler:
        return self.handler

    def execute(self, ctx: ExecutionContext) -> None:  # a plain def: runs in a thread
        self.attempts.append(ctx.consecutive_failures)
        raise ValueError("always")


async def test_one_time_failure_retries_then_gives_up(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Failing(MaxRetries(2, RetryLater(timedelta(milliseconds=20))))
    registry = await any_registries.start(job)
    await registry.client.schedule("failing", "x")
    await wait_until(lambda: _gone(any_engine), what="the instance given up and deleted")
    assert job.attempts == [0, 1, 2]


async def _gone(engine: AsyncEngine) -> bool:
    return await _row(engine, "failing", "x") is None


async def test_missed_daily_slot_runs_once_then_continues_from_the_next_future_slot(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    last_slot = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    slot_time = last_slot.time()
    missed = last_slot - timedelta(days=3)
    await _insert(any_engine, ("daily", "recurring", missed))  # every node was down 3 days
    job = RecordingJob("daily", Schedules.daily(slot_time))
    polls = Polls()
    await any_registries.start(job, customize=lambda b: b.observer(polls))
    await wait_until(lambda: _succeeded_row(any_engine, "daily"), what="the missed slot run")
    assert await polls.next(2) == 0, "the missed slots are coalesced into one run"
    assert job.slots == [missed]
    row = await _row(any_engine, "daily")
    expected_next = last_slot + timedelta(days=1)
    assert row.execution_time == expected_next  # type: ignore[attr-defined]


async def test_missed_cron_slot_runs_once(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    missed = datetime(2020, 1, 1, 0, 0, tzinfo=UTC)
    await _insert(any_engine, ("nightly", "recurring", missed))
    job = RecordingJob("nightly", Schedules.cron("0 0 * * *"))
    await any_registries.start(job)
    await wait_until(lambda: _succeeded_row(any_engine, "nightly"), what="the missed slot run")
    assert job.slots == [missed]
    row = await _row(any_engine, "nightly")
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    assert row.execution_time == datetime.combine(tomorrow, datetime.min.time(), UTC)  # type: ignore[attr-defined]


async def _succeeded_row(engine: AsyncEngine, name: str) -> bool:
    row = await _row(engine, name)
    return row is not None and row.last_success is not None  # type: ignore[attr-defined]


async def test_unresolved_rows_are_never_picked_and_old_ones_are_deleted(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    now = await db_now(any_engine)
    await _insert(
        any_engine,
        ("gone-job", "fresh", now),
        ("gone-job", "ancient", now - timedelta(days=15)),
    )
    job = RecordingJob("known", Schedules.fixed_delay(timedelta(milliseconds=50)))
    await any_registries.start(job)
    await wait_until(lambda: len(job.slots) >= 3, what="the known job running")
    await wait_until(lambda: _row_absent(any_engine, "gone-job", "ancient"), what="deletion")
    fresh = await _row(any_engine, "gone-job", "fresh")
    assert fresh is not None and not fresh.picked and fresh.version == 1  # type: ignore[attr-defined]


async def _row_absent(engine: AsyncEngine, name: str, instance: str) -> bool:
    return await _row(engine, name, instance) is None
