"""Schedules as data (``PersistentScheduleJob``): the client's verbs and the engine's handling
of schedule rows, on every database of the suite."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ExecutionContext,
    PersistentScheduleJob,
    ScheduleError,
    Schedules,
    TaskDataInvalid,
    TaskNotFoundError,
    UnknownJobError,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.persistent import PAUSED_TIME
from ekbatan_fastapi.domain.rows import PARKED_TIME

from .helpers import RecordingJob, RegistryFactory, db_now, wait_until

FAST = "FIXED_RATE|PT0.2S"


class DigestData(BaseModel):
    user_id: int
    lang: str = "en"


class Digest(PersistentScheduleJob[DigestData]):
    def __init__(self) -> None:
        self.runs: list[tuple[str, datetime, DigestData]] = []
        self.block: asyncio.Event | None = None
        self.started = asyncio.Event()

    def name(self) -> str:
        return "digest"

    async def execute(self, ctx: ExecutionContext[DigestData]) -> None:
        self.started.set()
        if self.block is not None:
            await self.block.wait()
        self.runs.append((ctx.task_instance, ctx.execution_time, ctx.data))

    def of(self, instance: str) -> list[tuple[str, datetime, DigestData]]:
        return [r for r in self.runs if r[0] == instance]


class Untyped(PersistentScheduleJob):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def name(self) -> str:
        return "untyped"

    def execute(self, ctx: ExecutionContext) -> None:  # a plain def: runs in a thread
        self.seen.append((ctx.task_instance, ctx.data))


async def _history(registry: Any, instance: str) -> list[Any]:
    records = await registry.client.history("digest", limit=100)
    return [r for r in records if r.task_instance == instance]


async def test_verbs_without_a_running_scheduler(any_registries: RegistryFactory) -> None:
    registry = any_registries.build(
        Digest(), Untyped(), RecordingJob("plain", Schedules.fixed_rate(timedelta(hours=1)))
    )
    c = registry.client
    daily = Schedules.daily(time(7, 30), zone="Europe/Berlin")
    assert await c.create_schedule("digest", "user-42", daily, data={"user_id": 42})
    assert not await c.create_schedule("digest", "user-42", daily, data={"user_id": 1})
    got = await c.get_schedule("digest", "user-42")
    assert got is not None
    assert got.schedule == "DAILY|07:30|Europe/Berlin"
    assert got.data == {"user_id": 42, "lang": "en"}
    assert got.state == "scheduled" and got.next_time is not None
    berlin = got.next_time.astimezone(daily.zone)  # type: ignore[attr-defined]
    assert (berlin.hour, berlin.minute) == (7, 30)

    # the row: db-scheduler's table verbatim, the schedule in task_data's JSON
    async with registry.engine.connect() as conn:
        raw = (await conn.execute(select(scheduled_tasks.c.task_data))).scalar_one()
    stored = json.loads(bytes(raw))
    assert stored["schedule"] == "DAILY|07:30|Europe/Berlin"
    assert stored["data"] == {"user_id": 42, "lang": "en"}

    cron = Schedules.cron("0 8 * * 1-5", zone="Europe/Berlin")
    info = await c.update_schedule("digest", "user-42", schedule=cron)
    assert info.schedule == "CRON|0 8 * * 1-5|Europe/Berlin" and info.data["user_id"] == 42
    info = await c.update_schedule("digest", "user-42", data={"user_id": 42, "lang": "de"})
    assert info.data == {"user_id": 42, "lang": "de"} and info.schedule.startswith("CRON")
    with pytest.raises(TaskNotFoundError, match="create_schedule"):
        await c.update_schedule("digest", "nobody", data={"user_id": 1})

    # bad input: nothing written, the field named
    with pytest.raises(TaskDataInvalid, match="user_id"):
        await c.create_schedule("digest", "bad", daily, data={"user_id": "x"})
    with pytest.raises(ScheduleError, match="CRON"):
        await c.create_schedule("digest", "bad", "CRON|61 * * * *", data={"user_id": 1})
    with pytest.raises(ScheduleError, match="max_runs"):
        await c.create_schedule("digest", "bad", daily, {"user_id": 1}, max_runs=0)
    with pytest.raises(ScheduleError, match="end_at"):
        await c.create_schedule(
            "digest", "bad", daily, {"user_id": 1}, end_at=datetime(2000, 1, 1, tzinfo=UTC)
        )
    with pytest.raises(UnknownJobError, match="digest, untyped"):
        await c.create_schedule("plain", "x", daily)
    with pytest.raises(UnknownJobError, match="create_schedule"):
        await c.schedule("digest", "x")
    assert await c.get_schedule("digest", "bad") is None

    # many in one statement, then paging
    made = await c.create_schedules(
        "untyped", [(f"u-{i:03}", FAST if i % 2 else daily, {"i": i}) for i in range(250)]
    )
    assert made == 250
    assert await c.create_schedules("untyped", [("u-000", daily, None)]) == 0
    first = await c.list_schedules("untyped", limit=100)
    second = await c.list_schedules("untyped", limit=100, offset=100)
    third = await c.list_schedules("untyped", limit=100, offset=200)
    ids = {s.instance_id for s in first + second + third}
    assert len(first) == 100 and len(third) == 50 and len(ids) == 250

    assert await c.delete_schedule("digest", "user-42")
    assert not await c.delete_schedule("digest", "user-42")


async def test_each_slot_runs_once_with_its_own_data(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    digest, untyped = Digest(), Untyped()
    registry = await any_registries.start(digest, untyped)
    c = registry.client
    async with any_engine.connect() as conn:  # startup created no rows for them
        assert (await conn.execute(select(scheduled_tasks.c.task_name))).all() == []
    await c.create_schedule("digest", "user-1", FAST, {"user_id": 1})
    await c.create_schedule("digest", "user-2", FAST, {"user_id": 2, "lang": "de"})
    await c.create_schedule("untyped", "any", FAST, {"free": ["json", 1]})
    await wait_until(lambda: len(digest.of("user-1")) >= 4 and len(digest.of("user-2")) >= 4)
    await wait_until(lambda: len(untyped.seen) >= 2)
    assert untyped.seen[0] == ("any", {"free": ["json", 1]})
    for instance, user in (("user-1", 1), ("user-2", 2)):
        runs = digest.of(instance)
        slots = [r[1] for r in runs]
        assert len(set(slots)) == len(slots), "a slot ran twice"
        assert all(isinstance(r[2], DigestData) and r[2].user_id == user for r in runs)
        step = timedelta(milliseconds=200)
        assert all((b - slots[0]) % step == timedelta(0) for b in slots), slots  # the slots
    assert digest.of("user-2")[0][2].lang == "de"
    info = await c.get_schedule("digest", "user-1")
    # each run is counted when it ends: the latest may still be running
    assert info is not None and info.runs >= 3


async def test_max_runs_and_end_at_remove_the_schedule_with_the_reason(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    digest = Digest()
    registry = await any_registries.start(digest)
    c = registry.client
    await c.create_schedule("digest", "three", FAST, {"user_id": 3}, max_runs=3)
    end = await db_now(any_engine) + timedelta(seconds=0.7)
    await c.create_schedule("digest", "ends", FAST, {"user_id": 4}, end_at=end)

    async def gone(instance: str) -> bool:
        return await c.get_schedule("digest", instance) is None

    await wait_until(lambda: gone("three"), what="max_runs ended it")
    await wait_until(lambda: gone("ends"), what="end_at ended it")
    assert len(digest.of("three")) == 3
    assert all(slot <= end for _, slot, _ in digest.of("ends"))

    async def said(instance: str, words: str) -> bool:
        return any(words in (r.error_message or "") for r in await _history(registry, instance))

    await wait_until(lambda: said("three", "max_runs 3 reached"), what="history of max_runs")
    await wait_until(lambda: said("ends", "is after end_at"), what="history of end_at")


async def test_start_at_delays_the_first_slot(any_registries: RegistryFactory) -> None:
    registry = any_registries.build(Digest())
    start = datetime(2030, 5, 1, 6, 0, tzinfo=UTC)
    await registry.client.create_schedule(
        "digest", "later", Schedules.daily(time(7, 30)), {"user_id": 1}, start_at=start
    )
    info = await registry.client.get_schedule("digest", "later")
    assert info is not None and info.next_time == datetime(2030, 5, 1, 7, 30, tzinfo=UTC)
    assert info.start_at == start


async def test_update_takes_effect_from_the_next_slot(any_registries: RegistryFactory) -> None:
    digest = Digest()
    registry = await any_registries.start(digest, poll=5.0)  # only a wake-up can start it soon
    c = registry.client
    await c.create_schedule("digest", "u", "DAILY|03:00", {"user_id": 1})
    # moving the next slot earlier: honoured at once (the poller is woken)
    await c.update_schedule("digest", "u", schedule="FIXED_RATE|PT1S")
    await wait_until(lambda: len(digest.of("u")) >= 1, timeout=2, what="the earlier slot")
    # a data change while a slot runs: that slot keeps what it was claimed with
    digest.block = asyncio.Event()
    digest.started.clear()
    await wait_until(digest.started.is_set, timeout=5)
    await c.update_schedule("digest", "u", data={"user_id": 2})
    digest.block.set()
    await wait_until(lambda: len(digest.of("u")) >= 3, timeout=10)
    users = [r[2].user_id for r in digest.of("u")]
    assert users[:2] == [1, 1] and users[2] == 2


async def test_delete_lets_a_running_slot_finish_and_writes_nothing_after(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    digest = Digest()
    digest.block = asyncio.Event()
    registry = await any_registries.start(digest)
    c = registry.client
    await c.create_schedule("digest", "d", FAST, {"user_id": 1})
    await wait_until(digest.started.is_set)
    assert await c.delete_schedule("digest", "d")
    digest.block.set()
    await wait_until(lambda: len(digest.of("d")) == 1)
    await asyncio.sleep(0.5)
    async with any_engine.connect() as conn:
        assert (await conn.execute(select(scheduled_tasks.c.task_name))).all() == []
    assert len(digest.of("d")) == 1


async def test_pause_and_resume_one_schedule(any_registries: RegistryFactory) -> None:
    digest = Digest()
    registry = await any_registries.start(digest)
    c = registry.client
    await c.create_schedule("digest", "a", FAST, {"user_id": 1})
    await c.create_schedule("digest", "b", FAST, {"user_id": 2})
    await c.pause("digest", "holiday", instance_id="a")
    info = await c.get_schedule("digest", "a")
    assert info is not None and info.paused is not None
    assert info.state in ("paused", "running")  # a slot running when it was paused finishes
    assert info.paused["reason"] == "holiday"
    await wait_until(lambda: len(digest.of("b")) >= 3)
    ran = len(digest.of("a"))
    await asyncio.sleep(0.5)
    assert len(digest.of("a")) <= ran + 1  # at most the one running when it was paused
    assert await c.resume("digest", instance_id="a")
    assert not await c.resume("digest", instance_id="a")
    await wait_until(lambda: len(digest.of("a")) >= ran + 2)


async def test_an_unreadable_row_is_parked_with_the_reason(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    digest = Digest()
    registry = await any_registries.start(digest)
    c = registry.client
    await c.create_schedule("digest", "good", FAST, {"user_id": 1})
    now = await db_now(any_engine)
    bad = {"schedule": "WEEKLY|mon", "data": {"user_id": 2}}
    async with any_engine.begin() as conn:
        await conn.execute(
            insert(scheduled_tasks).values(
                task_name="digest",
                task_instance="bad",
                task_data=json.dumps(bad).encode(),
                execution_time=now,
                picked=False,
                version=1,
            )
        )
    await c.wake_cluster()

    async def parked() -> bool:
        async with any_engine.connect() as conn:
            at = (
                await conn.execute(
                    select(scheduled_tasks.c.execution_time).where(
                        scheduled_tasks.c.task_instance == "bad"
                    )
                )
            ).scalar_one()
        return bool(at.replace(tzinfo=UTC) >= PARKED_TIME)

    await wait_until(parked, what="the bad row parked")
    info = await c.get_schedule("digest", "bad")
    assert info is not None and info.state == "parked"
    assert info.error is not None and "WEEKLY" in info.error
    runs_of_good = len(digest.of("good"))
    await wait_until(lambda: len(digest.of("good")) >= runs_of_good + 2)
    assert digest.of("bad") == []

    async def in_history() -> bool:
        return any("WEEKLY" in (r.error_message or "") for r in await _history(registry, "bad"))

    await wait_until(in_history, what="the reason in the history")
    # repaired with an update: it runs again
    await c.update_schedule("digest", "bad", schedule=FAST, data={"user_id": 2})
    await wait_until(lambda: len(digest.of("bad")) >= 1)


async def test_schedule_in_the_callers_transaction(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    registry = any_registries.build(Digest())
    c = registry.client
    async with registry.engine.connect() as conn:
        trans = await conn.begin()
        await c.create_schedule("digest", "t", FAST, {"user_id": 1}, connection=conn)
        await trans.rollback()
    assert await c.get_schedule("digest", "t") is None
    async with registry.engine.begin() as conn:
        await c.create_schedule("digest", "t", FAST, {"user_id": 1}, connection=conn)
    assert await c.get_schedule("digest", "t") is not None
    assert PAUSED_TIME < PARKED_TIME


async def test_dst_in_the_schedules_zone(any_registries: RegistryFactory) -> None:
    """A wall time in the spring gap runs once at the first instant after it; one that occurs
    twice in the autumn runs once, at its first occurrence (docs/schedules.md's DST rules)."""
    c = any_registries.build(Digest()).client
    daily = "DAILY|02:30|Europe/Berlin"
    spring = datetime(2027, 3, 28, 0, 0, tzinfo=UTC)  # 02:00 -> 03:00 that night
    autumn = datetime(2027, 10, 31, 0, 0, tzinfo=UTC)  # 03:00 -> 02:00 that night
    await c.create_schedule("digest", "spring", daily, {"user_id": 1}, start_at=spring)
    await c.create_schedule("digest", "autumn", daily, {"user_id": 2}, start_at=autumn)
    got_spring = await c.get_schedule("digest", "spring")
    got_autumn = await c.get_schedule("digest", "autumn")
    assert got_spring is not None and got_autumn is not None
    assert got_spring.next_time == datetime(2027, 3, 28, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert got_autumn.next_time == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)  # 02:30 CEST


class TxDigest(PersistentScheduleJob):
    """Commits each run's effects with ``ctx.transaction()``."""

    def __init__(self) -> None:
        self.slots: list[datetime] = []

    def name(self) -> str:
        return "txdigest"

    async def execute(self, ctx: ExecutionContext) -> None:
        async with ctx.transaction():
            self.slots.append(ctx.execution_time)


async def test_max_runs_counts_runs_committed_by_ctx_transaction(
    any_registries: RegistryFactory,
) -> None:
    """A run that commits with ``ctx.transaction()`` is counted as any other: ``max_runs``
    ends the schedule (it used to run on for ever, ``runs`` staying 0)."""
    job = TxDigest()
    registry = await any_registries.start(job)
    c = registry.client
    await c.create_schedule("txdigest", "two", FAST, {"x": 1}, max_runs=2)

    async def gone() -> bool:
        return await c.get_schedule("txdigest", "two") is None

    await wait_until(gone, what="max_runs ended the schedule")
    assert len(job.slots) == 2
