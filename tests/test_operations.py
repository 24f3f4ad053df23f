"""Execution history, cluster-wide pause/resume, live instances (our own tables)."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    HeartbeatState,
    SchedulerClient,
    Schedules,
    SchemaMissingError,
    TaskPausedError,
    create_schema,
)
from ekbatan_fastapi.domain.rows import Finish, FinishKind, Owned, TaskRow
from ekbatan_fastapi.engine.execution import Execution
from ekbatan_fastapi.engine.history import HistoryRecorder

from .helpers import CountingJob, Polls, RecordingJob, RegistryFactory, is_mysql, wait_until

# Runs on every available database (see conftest's any_* fixtures).


def _ago(engine: AsyncEngine, hours: int = 0, minutes: int = 0) -> str:
    """SQL for the database's UTC now minus a duration, in this engine's dialect."""
    if is_mysql(engine):
        return f"UTC_TIMESTAMP(6) - INTERVAL {hours * 60 + minutes} MINUTE"
    return f"now() - interval '{hours * 60 + minutes} minutes'"


async def test_history_records_outcomes_newest_first(any_registries: RegistryFactory) -> None:
    ok = RecordingJob("ok", Schedules.fixed_delay(timedelta(hours=1)))
    bad = RecordingJob("bad", Schedules.fixed_delay(timedelta(hours=1)), fail=True)
    registry = await any_registries.start(ok, bad)

    async def records(name: str) -> int:
        return len(await registry.client.history(name))

    await wait_until(lambda: _at_least(records("ok"), 1), what="a success record")
    await wait_until(lambda: _at_least(records("bad"), 1), what="a failure record")
    (success,) = await registry.client.history("ok")
    assert success.outcome == "succeeded" and success.error_class is None
    assert success.execution_time == ok.slots[0] and success.picked_by == registry.scheduler.name
    assert 0 <= success.duration_seconds < 5
    (failure,) = await registry.client.history("bad")
    assert failure.outcome == "failed" and failure.error_class == "RuntimeError"
    assert failure.error_message == "bad failed on purpose"
    everything = await registry.client.history()
    assert [r.id for r in everything] == sorted((r.id for r in everything), reverse=True)
    page = await registry.client.history(limit=1, before_id=everything[0].id)
    assert [r.id for r in page] == [everything[1].id]


async def _at_least(count: object, n: int) -> bool:
    return await count >= n  # type: ignore[misc,no-any-return]


async def test_history_can_be_turned_off(any_registries: RegistryFactory) -> None:
    job = CountingJob()
    registry = await any_registries.start(job, customize=lambda b: b.history(False))
    await registry.client.schedule("count", "a")
    await wait_until(lambda: job.runs["a"] == 1, what="the run")
    await wait_until(lambda: registry.scheduler.running == {}, what="recorded")
    assert await registry.client.history() == []


async def test_superseded_and_cancelled_executions_are_recorded(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    release = asyncio.Event()
    job = RecordingJob("held", Schedules.fixed_delay(timedelta(hours=1)), block=release)
    registry = await any_registries.start(job, shutdown=0.1)
    await asyncio.wait_for(job.started.wait(), 5)
    async with any_engine.begin() as conn:  # another instance revived it meanwhile
        await conn.execute(text("UPDATE scheduled_tasks SET version = version + 1"))
    release.set()
    await wait_until(lambda: registry.scheduler.running == {}, what="the stale run to end")
    await wait_until(lambda: _at_least(_history(registry, "held"), 1), what="a record")
    (superseded,) = await registry.client.history("held")
    assert superseded.outcome == "superseded"

    never = asyncio.Event()
    blocked = RecordingJob("blocked", Schedules.fixed_delay(timedelta(hours=1)), block=never)
    other = await any_registries.start(blocked, shutdown=0.1)
    await asyncio.wait_for(blocked.started.wait(), 5)
    await other.stop()
    (cancelled,) = await registry.client.history("blocked")
    assert cancelled.outcome == "cancelled"


async def _history(registry: object, name: str) -> int:
    return len(await registry.client.history(name))  # type: ignore[attr-defined]


async def test_paused_task_is_claimed_by_no_instance_until_resumed(
    any_registries: RegistryFactory,
) -> None:
    jobs = [RecordingJob("paced", Schedules.fixed_delay(timedelta(milliseconds=50))) for _ in "ab"]
    polls = [Polls(), Polls()]
    first = await any_registries.start(jobs[0], customize=lambda b: b.observer(polls[0]))
    await wait_until(lambda: len(jobs[0].slots) >= 1, what="a first run")
    await first.client.pause("paced", "maintenance window", paused_by="alice")
    # a new instance sees the pause too
    second = await any_registries.start(jobs[1], customize=lambda b: b.observer(polls[1]))
    await polls[0].next(2)  # the first may have begun before the pause: its runs start
    before = len(jobs[0].slots) + len(jobs[1].slots)
    for seen in polls:
        assert await seen.next(2) == 0, "a paused task was claimed"
    assert len(jobs[0].slots) + len(jobs[1].slots) == before, "a paused task ran"
    pause = (await second.client.paused())["paced"]
    assert (pause.paused_by, pause.reason) == ("alice", "maintenance window")
    with pytest.raises(TaskPausedError, match=r"paced is paused.*alice.*force=True"):
        await second.client.run_now("paced")
    assert await second.client.resume("paced")
    await wait_until(
        lambda: len(jobs[0].slots) + len(jobs[1].slots) > before + 1, what="runs after resume"
    )
    assert not await second.client.resume("paced"), "resuming twice says it was not paused"


async def test_forced_run_of_a_paused_task_runs_once_and_it_stays_paused(
    any_registries: RegistryFactory,
) -> None:
    job = RecordingJob("report", Schedules.daily(datetime.now(UTC).time().replace(microsecond=0)))
    registry = await any_registries.start(job)
    await registry.client.pause("report")
    await registry.client.run_now("report", force=True)
    await wait_until(lambda: len(job.slots) == 1, what="the forced run")
    assert "report" in await registry.client.paused()


async def test_a_forced_run_from_outside_sees_a_claim_that_finished_before_it_looked(
    any_registries: RegistryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run-now --force`` from a process without the job (the CLI): the instance may claim
    and finish the run before the forcing client first looks at the row again. That is a
    claim seen, not a wait for one that never comes (the run used to be reported as not
    claimed after the whole wait, the pause put back only then)."""
    job = RecordingJob("report", Schedules.fixed_delay(timedelta(hours=1)))
    registry = await any_registries.start(job)

    def recorded(runs: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            row = await registry.client.get("report", "recurring")
            return len(job.slots) == runs and row is not None and not row.picked

        return check

    await wait_until(recorded(1), what="the first run recorded")  # a picked row: not forced
    await registry.client.pause("report", paused_by="alice")
    outside = SchedulerClient(registry.store, {})  # no scheduler, no jobs: as the CLI's
    reschedule = outside.reschedule

    async def reschedule_then_let_it_finish(*args: Any, **kwargs: Any) -> None:
        await reschedule(*args, **kwargs)
        await wait_until(recorded(2), what="the forced run claimed and recorded")

    monkeypatch.setattr(outside, "reschedule", reschedule_then_let_it_finish)
    claimed_by = await outside.run_now("report", force=True, wait=2.0)
    assert claimed_by in (registry.scheduler.name, "an instance (the run already finished)")
    assert (await registry.client.paused())["report"].paused_by == "alice"


async def test_resume_runs_an_overdue_slot_once_or_skips_it(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    catch_up = RecordingJob("catch-up", Schedules.fixed_rate(timedelta(hours=1)))
    skip = RecordingJob("skip", Schedules.fixed_rate(timedelta(hours=1)))
    polls = Polls()
    registry = any_registries.build(catch_up, skip, customize=lambda b: b.observer(polls))
    for name in ("catch-up", "skip"):
        await registry.client.pause(name)
    await registry.start()
    assert await registry.wait_until_ready(5)
    async with any_engine.begin() as conn:  # both slots went by while paused
        await conn.execute(
            text(f"UPDATE scheduled_tasks SET execution_time = {_ago(any_engine, hours=3)}")
        )
    await registry.client.resume("catch-up")
    await registry.client.resume("skip", skip_missed=True)
    await wait_until(lambda: len(catch_up.slots) == 1, what="the overdue slot")
    assert await polls.next(2) == 0
    assert skip.slots == []
    moved = await registry.client.get("skip", "recurring")
    assert moved is not None
    assert moved.execution_time > datetime.now(UTC)


async def test_instances_list_the_cluster(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    a = await any_registries.start(CountingJob(), customize=lambda b: b.scheduler_name("node-a"))
    b = await any_registries.start(CountingJob(), customize=lambda b: b.scheduler_name("node-b"))
    async with any_engine.begin() as conn:  # one that crashed a while ago
        await conn.execute(
            text(
                "INSERT INTO ekbatan_scheduler_instances VALUES ('node-c', 'h', 1, "
                f"{_ago(any_engine, hours=1)}, {_ago(any_engine, minutes=1)}, '0')"
            )
        )
    listed = {i.name: i for i in await a.client.instances()}
    assert set(listed) == {"node-a", "node-b", "node-c"}
    assert listed["node-a"].alive and listed["node-b"].alive and not listed["node-c"].alive
    assert listed["node-a"].library_version
    await b.stop()
    assert {i.name for i in await a.client.instances()} == {"node-a", "node-c"}


async def test_without_the_operations_tables_scheduling_still_works(
    any_registries: RegistryFactory, any_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_async_engine(any_database_url)
    await create_schema(engine, "bare_tasks", operations=False)
    async with engine.begin() as conn:
        for table in ("execution_history", "paused_tasks", "scheduler_instances"):
            await conn.execute(text(f"DROP TABLE ekbatan_{table}"))
    await engine.dispose()
    job = CountingJob()
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        registry = await any_registries.start(job, customize=lambda b: b.table_name("bare_tasks"))
    assert any("V0002__ekbatan_operations.sql" in r.getMessage() for r in caplog.records)
    await registry.client.schedule("count", "a")
    await wait_until(lambda: job.runs["a"] == 1, what="a run without the tables")
    assert await registry.client.paused() == {}
    with pytest.raises(SchemaMissingError, match="create_schema"):
        await registry.client.history()


class _Ops:
    """Stands in for OperationsStore (its tables present): remembers each insert's size and
    time."""

    present = True
    presence = types.SimpleNamespace(present=True)

    def __init__(self) -> None:
        self.inserts: list[tuple[int, float]] = []

    async def insert_history(self, records: Any) -> None:
        self.inserts.append((len(records), asyncio.get_running_loop().time()))


def _finished(n: int) -> tuple[Any, Any]:
    now = datetime.now(UTC)
    row = TaskRow(
        task_name="t",
        task_instance=f"i{n}",
        task_data=None,
        execution_time=now,
        picked=True,
        picked_by="me",
        last_success=None,
        last_failure=None,
        consecutive_failures=0,
        last_heartbeat=now,
        version=2,
        priority=0,
    )
    heartbeat = HeartbeatState(timedelta(seconds=1), timedelta(seconds=4))
    execution = Execution(row, CountingJob(), heartbeat, now)
    return execution, Finish(Owned("t", f"i{n}", 2), FinishKind.DELETED)


async def test_history_writer_lingers_for_a_batch_and_flushes_at_shutdown() -> None:
    ops = _Ops()
    recorder = HistoryRecorder(
        ops,  # type: ignore[arg-type]
        "me",
        history=True,
        retention=timedelta(days=1),
        on_db_error=lambda error, where: None,
    )
    writer = asyncio.create_task(recorder.run())
    loop = asyncio.get_running_loop()
    began = loop.time()
    for n in range(3):
        recorder.record(*_finished(n), True)
        await asyncio.sleep(0.01)
    await wait_until(lambda: ops.inserts != [], what="the first insert")
    assert ops.inserts[0][0] == 3, "three records trickling in make one statement"
    assert ops.inserts[0][1] - began >= 0.09, "the writer waited for more"
    for n in range(2500):  # a full batch is written at once, without waiting
        recorder.record(*_finished(n), True)
    await wait_until(lambda: sum(size for size, _ in ops.inserts) == 2503, what="the burst")
    assert [size for size, _ in ops.inserts] == [3, 1000, 1000, 500]
    recorder.record(*_finished(0), True)
    recorder.close()
    started_close = loop.time()
    await asyncio.wait_for(writer, 1)
    assert ops.inserts[-1][0] == 1 and ops.inserts[-1][1] - started_close < 0.05
