"""The scheduler client: one-time instances, data, replace, reschedule, cancel, errors."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    Schedules,
    TaskDataError,
    TaskNotFoundError,
    TaskPickedError,
    UnknownJobError,
)

from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until


async def test_schedule_keeps_an_existing_instance_unless_replaced(
    registries: RegistryFactory,
) -> None:
    registry = registries.build(CountingJob())  # not started: rows stay put
    client = registry.client
    later = datetime.now(UTC) + timedelta(hours=1)
    assert await client.schedule("count", "a", later, {"v": 1})
    assert not await client.schedule("count", "a", later + timedelta(hours=1), {"v": 2})
    task = await client.get("count", "a")
    assert task is not None and task.data == {"v": 1} and task.execution_time == later
    assert await client.schedule("count", "a", later + timedelta(hours=2), {"v": 3}, replace=True)
    task = await client.get("count", "a")
    assert task is not None and task.data == {"v": 3} and task.version == 2
    await client.reschedule("count", "a", later, data={"v": 4})
    task = await client.get("count", "a")
    assert task is not None and task.execution_time == later and task.data == {"v": 4}
    assert [t.task_instance for t in await client.list("count")] == ["a"]
    await client.cancel("count", "a")
    assert await client.get("count", "a") is None
    with pytest.raises(TaskNotFoundError, match="count/a"):
        await client.cancel("count", "a")
    with pytest.raises(TaskNotFoundError, match="count/a"):
        await client.reschedule("count", "a", later)


async def test_scheduled_now_runs_without_waiting_for_the_polling_interval(
    registries: RegistryFactory,
) -> None:
    job = CountingJob()
    registry = await registries.start(job, poll=30.0)
    await asyncio.sleep(0.05)
    await registry.client.schedule("count", "now", data=[1, "two"])
    await wait_until(lambda: job.runs["now"] == 1, timeout=2, what="a prompt run")
    assert job.data["now"] == [1, "two"]
    soon = datetime.now(UTC) + timedelta(milliseconds=200)
    await registry.client.schedule("count", "soon", soon)
    await wait_until(lambda: job.runs["soon"] == 1, timeout=2, what="a run at its due time")


async def test_running_instance_cannot_be_cancelled_or_replaced(
    registries: RegistryFactory,
) -> None:
    release = asyncio.Event()
    job = RecordingJob("blocker", Schedules.fixed_delay(timedelta(hours=1)), block=release)
    other = CountingJob()
    registry = await registries.start(job, other)
    await asyncio.wait_for(job.started.wait(), 5)
    with pytest.raises(TaskPickedError, match="blocker/recurring is running"):
        await registry.client.cancel("blocker", "recurring")
    with pytest.raises(TaskPickedError, match="running"):
        await registry.client.run_now("blocker")
    release.set()


async def test_client_rejects_bad_names_times_and_data(registries: RegistryFactory) -> None:
    registry = registries.build(
        CountingJob(), RecordingJob("rec", Schedules.fixed_delay(timedelta(hours=1)))
    )
    client = registry.client
    with pytest.raises(UnknownJobError, match=r"no one-time job named 'nope'.*count"):
        await client.schedule("nope", "a")
    with pytest.raises(UnknownJobError, match=r"'rec' is a recurring job.*run_now"):
        await client.schedule("rec", "a")
    with pytest.raises(ConfigurationError, match="instance id '' is invalid"):
        await client.schedule("count", "")
    with pytest.raises(ConfigurationError, match="1 to 100 characters"):
        await client.schedule("count", "x" * 101)
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        await client.schedule("count", "a", datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError, match="not JSON-serializable"):
        await client.schedule("count", "a", data={"when": object()})


async def test_names_with_quotes_and_sql_are_just_data(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    job = CountingJob()
    registry = await registries.start(job)
    nasty = ["'; DROP TABLE scheduled_tasks; --", 'q"uote', "ünïcødé ✓", "x" * 100]
    for instance in nasty:
        await registry.client.schedule("count", instance)
    await wait_until(lambda: len(job.runs) == len(nasty), what="all nasty instances")
    await wait_until(lambda: registry.scheduler.running == {}, what="results recorded")
    assert set(job.runs) == set(nasty)
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM scheduled_tasks"))).scalar() == 0


async def test_undecodable_task_data_fails_the_execution_with_a_clear_message(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    registry = registries.build(CountingJob())
    await registry.client.schedule("count", "java", datetime.now(UTC) + timedelta(hours=1))
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE scheduled_tasks SET task_data = '\\xaced0005'::bytea"))
    task = await registry.client.get("count", "java")
    assert task is not None
    with pytest.raises(TaskDataError, match=r"count/java.*not UTF-8 JSON"):
        _ = task.data


async def test_work_scheduled_elsewhere_wakes_a_listening_instance(
    registries: RegistryFactory,
) -> None:
    job = CountingJob()
    await registries.start(job, poll=30.0)
    elsewhere = registries.build(CountingJob())  # another instance's client, not polling
    await asyncio.sleep(0.1)  # let the listener subscribe (it also polls once when it does)
    await elsewhere.client.schedule("count", "now")
    await wait_until(lambda: job.runs["now"] == 1, timeout=2, what="a run woken by NOTIFY")
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    await elsewhere.client.schedule("count", "soon", soon)
    await wait_until(lambda: job.runs["soon"] == 1, timeout=2, what="a run at its due time")
    await elsewhere.client.schedule("count", "moved", soon + timedelta(hours=1))
    await elsewhere.client.reschedule("count", "moved", None)
    await wait_until(lambda: job.runs["moved"] == 1, timeout=2, what="a rescheduled run")


async def test_schedule_many_creates_missing_instances_in_one_statement(
    registries: RegistryFactory,
) -> None:
    job = CountingJob()
    registry = await registries.start(job, poll=30.0)
    await registry.client.schedule("count", "i0", datetime.now(UTC) + timedelta(hours=1))
    created = await registry.client.schedule_many(
        "count", [(f"i{n}", None, {"n": n}) for n in range(500)]
    )
    assert created == 499, "the existing instance is left alone"
    await wait_until(lambda: len(job.runs) == 499, what="every new instance run")
    assert job.data["i42"] == {"n": 42} and "i0" not in job.runs
    with pytest.raises(ConfigurationError, match="instance id"):
        await registry.client.schedule_many("count", [("", None, None)])
