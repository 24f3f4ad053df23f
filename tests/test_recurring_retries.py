"""Retries of a recurring slot (``DistributedJob.failure_handler()``) on every database, with
several schedulers running the job: a retry runs the same slot (``ctx.execution_time``
unchanged, ``ctx.attempt`` counting), the history records every attempt, and the schedule
keeps its grid whatever the handler decides."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    FailureHandler,
    MaxRetries,
    RetryLater,
    Schedule,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.retries import RetryMark, retry_time
from ekbatan_fastapi.engine.observer import SchedulerObserver
from ekbatan_fastapi.store.tables import Tables

from .conftest import Database
from .helpers import Polls, RegistryFactory, Worker, db_now, put_row, wait_until
from .proc_worker import LEDGERS, attempts

HOUR = timedelta(hours=1)
QUICK = RetryLater(timedelta(milliseconds=100))


class Attempt:
    """What one attempt saw."""

    def __init__(self, ctx: ExecutionContext) -> None:
        self.slot = ctx.execution_time
        self.attempt = ctx.attempt
        self.failures = ctx.consecutive_failures
        self.token = ctx.fencing_token
        self.by = ctx.picked_by


class FlakyJob(DistributedJob):
    """Fails its first ``failures`` attempts (counted across every instance), then succeeds;
    ``commit``: the succeeding attempt completes its slot through ``ctx.transaction()``."""

    def __init__(
        self,
        log: list[Attempt],
        handler: FailureHandler | None,
        failures: int,
        *,
        schedule: Schedule | None = None,
        commit: bool = False,
        pause_after: Any = None,
    ) -> None:
        self.log = log
        self.handler = handler
        self.failures = failures
        self._schedule = schedule or Schedules.fixed_rate(HOUR)
        self.commit = commit
        self.pause_after = pause_after

    def pause_after_failures(self) -> int | None:
        return self.pause_after  # type: ignore[no-any-return]

    def name(self) -> str:
        return "nightly"

    def schedule(self) -> Schedule:
        return self._schedule

    def failure_handler(self) -> FailureHandler | None:
        return self.handler

    async def execute(self, ctx: ExecutionContext) -> None:
        self.log.append(Attempt(ctx))
        if len(self.log) <= self.failures:
            raise RuntimeError(f"attempt {ctx.attempt} failed on purpose")
        if self.commit:
            async with ctx.transaction() as conn:
                await conn.execute(text("SELECT 1"))


async def _row_time(engine: AsyncEngine) -> datetime:
    t = scheduled_tasks
    async with engine.connect() as conn:
        value = (
            await conn.execute(select(t.c.execution_time).where(t.c.task_name == "nightly"))
        ).scalar_one()
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def _history(engine: AsyncEngine, count: int) -> list[tuple[str, datetime, str | None]]:
    h = Tables().history

    async def read() -> list[tuple[str, datetime, str | None]]:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(h.c.outcome, h.c.execution_time, h.c.error_message)
                .where(h.c.task_name == "nightly")
                .order_by(h.c.started_at, h.c.id)
            )
            return [(r[0], _utc(r[1]), r[2]) for r in rows]

    async def written() -> bool:
        return len(await read()) >= count

    await wait_until(written, what=f"{count} history records")
    return await read()


async def _slot_behind(engine: AsyncEngine) -> datetime:
    """A slot a minute old (the next one is 59 minutes away): its row is due now."""
    slot = (await db_now(engine) - timedelta(minutes=1)).replace(microsecond=0)
    await put_row(engine, "nightly", slot)
    return slot


async def _start(factory: RegistryFactory, jobs: list[FlakyJob]) -> None:
    for job in jobs:
        await factory.start(job)


async def test_a_failed_slot_is_retried_as_the_same_slot_across_instances(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    await _start(any_registries, [FlakyJob(log, QUICK, 2) for _ in range(3)])
    await wait_until(lambda: len(log) == 3, what="three attempts")

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the next slot scheduled, on the grid")
    assert [a.slot for a in log] == [slot] * 3, "ctx.execution_time unchanged"
    assert [a.attempt for a in log] == [1, 2, 3]
    assert [a.failures for a in log] == [0, 1, 2]
    tokens = [a.token for a in log]
    assert tokens == sorted(set(tokens)), "a fresh fencing token per attempt"
    history = await _history(any_engine, 3)
    assert [(o, t) for o, t, _ in history] == [
        ("failed", slot),
        ("failed", slot),
        ("succeeded", slot),
    ]


async def test_a_handler_that_gives_up_leaves_the_next_slot_on_the_grid(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    handler = MaxRetries(1, QUICK)
    await _start(any_registries, [FlakyJob(log, handler, 99) for _ in range(2)])

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the next slot scheduled")
    assert [(a.slot, a.attempt) for a in log] == [(slot, 1), (slot, 2)]
    history = await _history(any_engine, 2)
    assert [o for o, _, _ in history] == ["failed", "failed"]
    assert history[1][2] is not None and "gave up after attempt 2" in history[1][2]


async def test_a_retry_the_next_slot_overtakes_is_dropped(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    await any_registries.start(FlakyJob(log, RetryLater(2 * HOUR), 99))

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the next slot scheduled instead of the retry")
    (history,) = await _history(any_engine, 1)
    assert history[0] == "failed" and history[2] is not None
    assert "dropped: the next slot" in history[2]


async def test_a_retry_still_pending_when_the_next_slot_came_is_dropped_and_recorded(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    now = (await db_now(any_engine)).replace(microsecond=0)
    slot = now - HOUR - timedelta(minutes=2)  # its successor fell due two minutes ago
    at = retry_time(slot + timedelta(minutes=1))
    await put_row(any_engine, "nightly", at, data=RetryMark(slot, 2, at).encode())
    log: list[Attempt] = []
    await _start(any_registries, [FlakyJob(log, QUICK, 0) for _ in range(2)])
    await wait_until(lambda: len(log) == 1, what="the next slot run")
    assert (log[0].slot, log[0].attempt) == (slot + HOUR, 1)

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + 2 * HOUR

    await wait_until(next_slot, what="the slot after scheduled")
    history = sorted(await _history(any_engine, 2), key=lambda h: h[1])
    assert [(o, t) for o, t, _ in history] == [("skipped", slot), ("succeeded", slot + HOUR)]
    assert history[0][2] is not None and "(attempt 2)" in history[0][2]
    assert "dropped: the next slot came first" in history[0][2]


async def test_ctx_transaction_completes_a_retried_slot(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    await _start(any_registries, [FlakyJob(log, QUICK, 1, commit=True) for _ in range(2)])

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the retry committed with its completion")
    assert [(a.slot, a.attempt) for a in log] == [(slot, 1), (slot, 2)]
    history = await _history(any_engine, 2)
    assert [o for o, _, _ in history] == ["failed", "succeeded"]


async def test_without_a_handler_a_failed_slot_waits_for_the_next(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    await any_registries.start(FlakyJob(log, None, 99))

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the next slot (db-scheduler's behaviour)")
    assert [(a.slot, a.attempt) for a in log] == [(slot, 1)]


class Events(SchedulerObserver):
    """The failure and pause events an instance reported."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, str, datetime, str]] = []
        self.paused: list[tuple[str, str, datetime, str]] = []

    def execution_failed(
        self, task_name: str, task_instance: str, slot: datetime, error: BaseException
    ) -> None:
        self.failed.append((task_name, task_instance, slot, str(error)))

    def job_paused(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        self.paused.append((task_name, task_instance, slot, reason))


async def test_a_job_failing_too_often_is_paused_cluster_wide_until_resumed(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    events = [Events(), Events()]
    polls = Polls()
    registries = []
    for i, seen in enumerate(events):

        def observe(b: Any, seen: Events = seen, first: bool = i == 0) -> None:
            b.observer(seen)
            if first:
                b.observer(polls)

        job = FlakyJob(log, QUICK, 3, pause_after=3)
        registries.append(await any_registries.start(job, customize=observe))
    client = registries[0].client

    async def paused() -> bool:
        return "nightly" in await client.paused()

    await wait_until(paused, what="the job paused after three failures")
    pause = (await client.paused())["nightly"]
    assert pause.paused_by == "ekbatan"
    assert pause.reason is not None and "paused after 3 consecutive failures" in pause.reason
    assert "RuntimeError: attempt 3 failed on purpose" in pause.reason
    await polls.next(3)
    assert [(a.slot, a.attempt) for a in log] == [(slot, 1), (slot, 2), (slot, 3)]
    failed = events[0].failed + events[1].failed
    assert sorted((f[2], f[3]) for f in failed) == [
        (slot, f"attempt {n} failed on purpose") for n in (1, 2, 3)
    ]
    (paused_event,) = events[0].paused + events[1].paused
    assert paused_event[:3] == ("nightly", "recurring", slot)
    history = await _history(any_engine, 3)
    assert [o for o, _, _ in history] == ["failed"] * 3
    assert history[2][2] is not None and "job paused" in history[2][2]

    assert await client.resume("nightly")

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the retry run after the resume, then the next slot")
    assert (log[3].slot, log[3].attempt, log[3].failures) == (slot, 4, 3)


async def test_pause_after_failures_takes_a_whole_number(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    with pytest.raises(ConfigurationError, match=r"pause_after_failures\(\) must return"):
        await any_registries.start(FlakyJob([], None, 0, pause_after=0))


async def test_a_retry_that_cannot_be_recorded_leaves_the_next_slot(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    slot = await _slot_behind(any_engine)
    log: list[Attempt] = []
    registry = any_registries.build(FlakyJob(log, QUICK, 99))

    async def refused(*_args: object) -> bool:
        raise OSError("the database is away")

    registry.store.tasks.mark_retry = refused  # type: ignore[method-assign]
    await registry.start()

    async def next_slot() -> bool:
        return await _row_time(any_engine) == slot + HOUR

    await wait_until(next_slot, what="the next slot, on the grid, instead of the retry")
    assert [(a.slot, a.attempt) for a in log] == [(slot, 1)]
    (history,) = await _history(any_engine, 1)
    assert history[2] is not None and "its retry could not be recorded" in history[2]


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_three_processes_retry_a_slot_as_the_same_slot_each_attempt_once(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Separate OS processes share a slot's retries: attempts 1-3 fail, the fourth succeeds,
    each attempt runs once (the ledger's key is (slot, attempt)) with the slot unchanged."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[attempts])
    slot = (await db_now(any_engine) - timedelta(minutes=1)).replace(microsecond=0)
    await put_row(any_engine, "flaky", slot)
    args = [
        "--poll",
        "0.2",
        *(["--dialect", any_database.override] if any_database.override else []),
    ]
    workers = await asyncio.gather(
        *(Worker.start("retries", any_database.url, *args) for _ in range(3))
    )

    async def ran() -> list[tuple[datetime, int, int]]:
        async with any_engine.connect() as conn:
            rows = await conn.execute(select(attempts).order_by(attempts.c.attempt))
            return [(_utc(r.slot), r.attempt, r.pid) for r in rows]

    async def scheduled_next() -> bool:
        t = scheduled_tasks
        async with any_engine.connect() as conn:
            row = (
                await conn.execute(
                    select(t.c.execution_time, t.c.picked).where(t.c.task_name == "flaky")
                )
            ).one()
        return _utc(row.execution_time) == slot + HOUR and not row.picked

    try:
        await wait_until(scheduled_next, timeout=20, what="four attempts, then the next slot")
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    done = await ran()
    assert [(s, a) for s, a, _ in done] == [(slot, n) for n in (1, 2, 3, 4)]
    assert {p for _, _, p in done} <= {w.pid for w in workers}
