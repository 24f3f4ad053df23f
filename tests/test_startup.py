"""Startup: recurring rows created race-safely, schedule changes applied, disabled removed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, time, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules

from .helpers import Polls, RecordingJob, RegistryFactory


async def _rows(engine: AsyncEngine) -> list[tuple[str, str, datetime, bool, int]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT task_name, task_instance, execution_time, picked, version "
                "FROM scheduled_tasks ORDER BY task_name"
            )
        )
        return [tuple(r) for r in result]  # type: ignore[misc]


async def test_instances_starting_together_create_each_recurring_row_once(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    def jobs() -> list[RecordingJob]:
        return [RecordingJob(f"daily-{i}", Schedules.daily(time(3, i))) for i in range(5)]

    built = [registries.build(*jobs()) for _ in range(6)]
    await asyncio.gather(*(r.start() for r in built))
    assert all(await asyncio.gather(*(r.wait_until_ready(10) for r in built)))
    rows = await _rows(engine)
    assert [r[0] for r in rows] == [f"daily-{i}" for i in range(5)]
    assert {r[1] for r in rows} == {"recurring"}
    assert {r[4] for r in rows} == {1}, "no instance rewrote another's row"
    for name, _, when, _, _ in rows:
        minute = int(name.split("-")[1])
        assert when.astimezone(UTC).time() == time(3, minute)
        assert when > datetime.now(UTC)


async def test_changed_daily_schedule_moves_the_future_row(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    first = await registries.start(RecordingJob("report", Schedules.daily(time(2, 0))))
    await first.stop()
    ((_, _, before, _, _),) = await _rows(engine)
    assert before.time() == time(2, 0)
    await registries.start(RecordingJob("report", Schedules.daily(time(4, 30))))
    ((_, _, after, _, version),) = await _rows(engine)
    assert after.time() == time(4, 30)
    assert after > datetime.now(UTC) and after - datetime.now(UTC) <= timedelta(days=1)
    assert version == 2


async def test_a_row_due_soon_or_picked_is_not_moved(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=5)
    later = datetime.now(UTC) + timedelta(hours=5)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "picked_by, last_heartbeat, version) VALUES "
                "('soon', 'recurring', :soon, false, NULL, NULL, 7), "
                "('busy', 'recurring', :later, true, 'elsewhere', now(), 9)"
            ),
            {"soon": soon, "later": later},
        )
    await registries.start(
        RecordingJob("soon", Schedules.daily(time(1, 0))),
        RecordingJob("busy", Schedules.daily(time(1, 0))),
    )
    rows = {r[0]: r for r in await _rows(engine)}
    assert rows["soon"][2] == soon and rows["soon"][4] == 7
    assert rows["busy"][2] == later and rows["busy"][4] == 9


async def test_disabled_schedule_removes_the_row(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    first = await registries.start(RecordingJob("cleanup", Schedules.daily(time(1, 0))))
    await first.stop()
    assert len(await _rows(engine)) == 1
    job = RecordingJob("cleanup", Schedules.disabled())
    polls = Polls()
    await registries.start(job, customize=lambda b: b.observer(polls))
    assert await _rows(engine) == []
    assert await polls.next(2) == 0
    assert job.slots == [] and await _rows(engine) == []
