"""Two-phase shutdown: wait, cancel and wait again, abandon; no signal handlers installed."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules

from .helpers import RecordingJob, RegistryFactory, wait_until


class SlowJob(DistributedJob):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = asyncio.Event()
        self.finished = False
        self.saw_shutdown = False

    def name(self) -> str:
        return "slow"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.started.set()
        await asyncio.sleep(self.seconds)
        self.saw_shutdown = ctx.is_shutting_down
        self.finished = True


class BlockedThreadJob(DistributedJob):
    """A plain-def job stuck in its thread: it cannot be cancelled."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def name(self) -> str:
        return "stuck"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    def execute(self, ctx: ExecutionContext) -> None:
        self.started.set()
        self.release.wait(10)


async def _row(engine: AsyncEngine, name: str) -> object:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT * FROM scheduled_tasks WHERE task_name = :n"), {"n": name}
            )
        ).one()


async def test_phase_one_waits_for_running_executions(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    job = SlowJob(0.3)
    registry = await registries.start(job, shutdown=5.0)
    await asyncio.wait_for(job.started.wait(), 5)
    await registry.stop()
    assert job.finished and job.saw_shutdown
    row = await _row(engine, "slow")
    assert not row.picked and row.last_success is not None  # type: ignore[attr-defined]


async def test_phase_two_cancels_and_releases_the_slot(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    job = SlowJob(60)
    registry = await registries.start(job, shutdown=0.2)
    await asyncio.wait_for(job.started.wait(), 5)
    slot = (await _row(engine, "slow")).execution_time  # type: ignore[attr-defined]
    began = time.monotonic()
    await registry.stop()
    # not a timing test: the two phases take 0.4 s, the job 60 s; 10 s tells them apart on a
    # machine of any load
    assert time.monotonic() - began < 10
    assert not job.finished
    row = await _row(engine, "slow")
    assert not row.picked and row.execution_time == slot  # type: ignore[attr-defined]
    assert row.last_success is None and row.last_failure is None  # type: ignore[attr-defined]


async def test_execution_outliving_both_phases_is_abandoned_then_revived(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    stuck = BlockedThreadJob()
    registry = await registries.start(stuck, shutdown=0.2)
    await wait_until(stuck.started.is_set, what="the stuck job to start")
    try:
        began = time.monotonic()
        await registry.stop()
        assert time.monotonic() - began < 10  # the phases take 0.4 s; the job never ends
        row = await _row(engine, "stuck")
        assert row.picked, "abandoned: the row stays picked"  # type: ignore[attr-defined]
        successor = RecordingJob("stuck", Schedules.fixed_delay(timedelta(hours=1)))
        await registries.start(successor)
        await asyncio.wait_for(successor.started.wait(), 5)  # revived as a dead execution
        assert successor.slots == [row.execution_time]  # type: ignore[attr-defined]
    finally:
        stuck.release.set()


async def test_library_installs_no_signal_handlers(registries: RegistryFactory) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    registry = await registries.start(RecordingJob("x", Schedules.fixed_delay(timedelta(1))))
    assert {s: signal.getsignal(s) for s in before} == before
    loop = asyncio.get_running_loop()
    assert not getattr(loop, "_signal_handlers", {})
    await registry.stop()
    assert {s: signal.getsignal(s) for s in before} == before


async def test_stop_during_a_claim_runs_what_was_claimed(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    from .helpers import CountingJob

    job = CountingJob()
    registry = registries.build(job, poll=30.0)
    await registry.client.schedule("count", "claimed-while-stopping")
    real_poll = registry.store.tasks.poll
    in_poll = asyncio.Event()

    async def slow_poll(*args: Any, **kwargs: Any) -> Any:
        result = await real_poll(*args, **kwargs)  # the claim has committed...
        if result.claimed:
            in_poll.set()
            await asyncio.sleep(0.3)  # ...and stop() arrives before the rows are started
        return result

    registry.store.tasks.poll = slow_poll  # type: ignore[method-assign]
    await registry.start()
    await asyncio.wait_for(in_poll.wait(), 5)
    await registry.stop()
    assert job.runs["claimed-while-stopping"] == 1
    async with engine.connect() as conn:
        left = (await conn.execute(text("SELECT count(*) FROM scheduled_tasks"))).scalar_one()
    assert left == 0, "a claimed row was left picked, run by nobody"


async def test_a_loop_that_ignores_its_cancellation_does_not_hold_up_the_stop(
    registries: RegistryFactory, monkeypatch: Any, caplog: Any
) -> None:
    """A loop stuck past its cancellation (a statement on a connection that went silent, whose
    close waits too) is left behind after a bound, named in a warning: the stop ends."""
    from ekbatan_fastapi.engine import lifecycle as module

    monkeypatch.setattr(module, "_CANCEL_WAIT", 0.2)
    registry = await registries.start(RecordingJob("tick", Schedules.fixed_delay(timedelta(1))))
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    sched = registry.scheduler
    sched.lifecycle.tasks["housekeeper"].cancel()
    sched.lifecycle.tasks["housekeeper"] = asyncio.create_task(stubborn())
    began = time.monotonic()
    await asyncio.wait_for(sched.stop(), timeout=10)
    assert time.monotonic() - began < 5
    assert "the housekeeper did not end within" in caplog.text
    release.set()


async def test_a_second_stop_returns_once_the_first_has_finished(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """Two stops at once (a lifespan's and a signal handler's): the second does not return
    while the first still waits for a running job (it returned at once: its caller believed
    the scheduler stopped); one made after the stop returns at once."""
    block = asyncio.Event()
    job = RecordingJob("held", Schedules.fixed_delay(timedelta(hours=1)), block=block)
    registry = await registries.start(job, shutdown=30.0)
    await asyncio.wait_for(job.started.wait(), 5)
    scheduler = registry.scheduler
    ended: list[str] = []
    first = asyncio.create_task(scheduler.stop())
    first.add_done_callback(lambda _: ended.append("first"))
    await wait_until(lambda: scheduler.state.stopping, what="the first stop to begin")
    second = asyncio.create_task(scheduler.stop())
    second.add_done_callback(lambda _: ended.append("second"))
    for _ in range(50):  # turns of the loop: the first stop waits for the job
        await asyncio.sleep(0)
    assert not second.done(), "the second stop returned while the first still runs"
    block.set()
    await asyncio.gather(first, second)
    assert ended == ["first", "second"]
    row = await _row(engine, "held")
    assert not row.picked and row.last_success is not None  # type: ignore[attr-defined]
    await scheduler.stop()  # after the stop: at once
