"""One lifecycle: the scheduler's loops are one ordered list of services that a started
scheduler and the ``TimeMachine`` both run; a launched execution's slot always comes back."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ExecutionContext,
    OneTimeJob,
    RunNotClaimedError,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.clock import SystemClock
from ekbatan_fastapi.engine.execution import Execution
from ekbatan_fastapi.engine.lifecycle import Manual, Service, Stop
from ekbatan_fastapi.engine.running import Capacity
from ekbatan_fastapi.testing import TimeMachine

from .conftest import Database
from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until

START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


class Probe:
    """A service of the test's own: counts its steps, its loop's runs and its close."""

    def __init__(self) -> None:
        self.steps = 0
        self.loops = 0
        self.closed = asyncio.Event()
        self.running = asyncio.Event()

    async def step(self) -> int:
        self.steps += 1
        return self.steps

    async def loop(self) -> None:
        self.loops += 1
        self.running.set()
        await self.closed.wait()

    def close(self) -> None:
        self.closed.set()


class Invoice(OneTimeJob):
    def __init__(self) -> None:
        self.ran: list[str] = []

    def name(self) -> str:
        return "invoice"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.ran.append(ctx.task_instance)


async def test_the_services_are_listed_in_order_with_how_they_stop(
    registries: RegistryFactory,
) -> None:
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(1)))
    scheduler = registries.build(tick).scheduler
    plan = [(s.name, s.stop, s.manual) for s in scheduler.services]
    assert plan[:3] == [
        ("housekeeper", Stop.LAST, Manual.STEP),
        ("poller", Stop.CLAIMING, Manual.STEP),
        ("completer", Stop.FLUSH, Manual.LOOP),
    ]
    assert {name for name, stop, _ in plan if stop is Stop.FLUSH} == {
        "completer",
        "history writer",
    }
    with pytest.raises(ValueError, match="already has a service 'poller'"):
        scheduler.lifecycle.add(Service("poller", Probe().loop, Stop.FIRST, Manual.OFF))
    with pytest.raises(ValueError, match=r"Manual\.STEP needs a step"):
        Service("x", Probe().loop, Stop.FIRST, Manual.STEP)


async def test_a_service_in_the_schedulers_list_runs_under_the_time_machine(
    any_database: Database,
) -> None:
    """A service registered in the scheduler's list runs under the TimeMachine with no change
    to the machine: a stepped one once per ``run_due`` round, in list order, a looping one
    from ``open`` and flushed at ``close``, as the scheduler's stop does."""
    stepped, looping = Probe(), Probe()
    job = Invoice()
    tm = TimeMachine([job], any_database.url, start=START, dialect=any_database.override)
    scheduler = tm.registry.scheduler
    scheduler.lifecycle.add(
        Service("probe-step", stepped.loop, Stop.LAST, Manual.STEP, step=stepped.step)
    )
    scheduler.lifecycle.add(
        Service("probe-loop", looping.loop, Stop.FLUSH, Manual.LOOP, close=looping.close)
    )
    async with tm:
        await asyncio.wait_for(looping.running.wait(), 10)
        assert await tm.run_due() == []
        assert stepped.steps == 1  # one round: nothing was due
        await tm.schedule("invoice", "a", START + timedelta(minutes=5))
        await tm.advance(by=timedelta(minutes=5))
        ran = await tm.run_due()
        assert [r.task_instance for r in ran] == ["a"]
        assert stepped.steps == 3  # a round that claimed, then one that found nothing
        assert stepped.loops == 0  # stepped, never looping
        assert not looping.closed.is_set()
    assert looping.closed.is_set() and looping.loops == 1
    assert scheduler.lifecycle.tasks["probe-loop"].done()


async def test_the_same_service_runs_in_a_started_scheduler(registries: RegistryFactory) -> None:
    """The list a started scheduler supervises is the one the TimeMachine steps."""
    probe = Probe()
    registry = registries.build(RecordingJob("tick", Schedules.fixed_delay(timedelta(1))))
    registry.scheduler.lifecycle.add(
        Service("probe", probe.loop, Stop.FLUSH, Manual.LOOP, close=probe.close)
    )
    await registry.start()
    await asyncio.wait_for(probe.running.wait(), 10)
    with pytest.raises(RuntimeError, match="add 'late' before"):
        registry.scheduler.lifecycle.add(Service("late", probe.loop, Stop.FIRST, Manual.OFF))
    await registry.scheduler.stop()
    assert probe.closed.is_set()
    assert registry.scheduler.lifecycle.tasks["probe"].done()


# -- capacity: a launch's slot always comes back ---------------------------------------------


class _Held:
    """An execution as the capacity sees it (its row's key; hashed by identity)."""

    def __init__(self, instance: str) -> None:
        self.row = SimpleNamespace(key=("job", instance))
        self.task: asyncio.Task[bool] | None = None


def _execution(instance: str) -> Execution:
    return cast(Execution, _Held(instance))


async def test_a_slot_is_given_back_once() -> None:
    woken: list[int] = []
    capacity = Capacity(2, lambda: woken.append(1))
    a, b, c, d = (_execution(i) for i in "abcd")
    capacity.launch(a)
    capacity.release(a)
    capacity.release(a)  # given back once
    capacity.launch(b)
    assert capacity.claim_limit() == 1 and capacity.executing == 1
    capacity.release(b)
    assert capacity.claim_limit() == 2 and capacity.executing == 0
    capacity.forget(a)  # recorded (the completer's part): no longer held
    capacity.forget(b)
    capacity.launch(c)
    capacity.launch(d)
    assert capacity.claim_limit() == 0  # the poller waits for room
    capacity.release(c)
    capacity.release(d)
    assert woken  # and was woken when it came
    assert capacity.executing == 0 and len(capacity) == 2


async def test_a_slot_handed_to_a_task_comes_back_when_the_task_ends() -> None:
    capacity = Capacity(1, lambda: None)
    never = asyncio.Event()
    a = _execution("a")
    capacity.launch(a)
    task = asyncio.create_task(never.wait())
    task.add_done_callback(partial(capacity.release, a))
    assert capacity.claim_limit() == 0  # the task holds it
    task.cancel()  # cancelled before it ever ran: none of its code gives the slot back
    await asyncio.wait({task})
    await asyncio.sleep(0)  # the done callback
    assert capacity.claim_limit() == 1


async def test_an_execution_task_cancelled_before_it_ran_gives_its_slot_back() -> None:
    """The executor's done callback (``Capacity.release_task``): a task that ended before its
    own code gave the slot back (here cancelled before it ran) gives it back; a task whose
    execution released already changes nothing."""
    capacity = Capacity(2, lambda: None)
    never = asyncio.Event()
    a, b = _execution("a"), _execution("b")
    capacity.launch(a)
    capacity.launch(b)
    a.task = asyncio.create_task(never.wait())
    a.task.add_done_callback(capacity.release_task)
    b.task = asyncio.create_task(never.wait())
    b.task.add_done_callback(capacity.release_task)
    capacity.release(b)  # b's own code gave it back
    assert capacity.executing == 1
    a.task.cancel()
    b.task.cancel()
    await asyncio.wait({a.task, b.task})
    await asyncio.sleep(0)  # the done callbacks
    assert capacity.executing == 0 and capacity.claim_limit() == 2


async def test_a_launch_that_raises_gives_its_slot_back_to_the_poller(
    any_database: Database,
) -> None:
    """A launch that raises after its row was held (here, deciding its slot): the claim
    fails, the poller's claim limit comes back whole."""
    job = Invoice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        scheduler = tm.registry.scheduler
        full = scheduler.executions.claim_limit()
        await tm.schedule("invoice", "a")

        def broken(execution: Any) -> bool:
            raise RuntimeError("deciding the slot failed")

        scheduler.executor._prepare = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="deciding the slot failed"):
            await tm.run_due()
        assert scheduler.executions.claim_limit() == full
        assert scheduler.executions.executing == 0
        assert not scheduler.executions.claiming
        # nor is the row held: it is given back, due again a second later (a launch that
        # keeps failing is paced), and runs once launching works again
        assert not scheduler.executions.by_key
        await wait_until(lambda: not scheduler.completer.pending, what="the row given back")
        del scheduler.executor._prepare
        assert await tm.run_due() == []
        await tm.advance(by=timedelta(seconds=1))
        assert [r.task_instance for r in await tm.run_due()] == ["a"]
        assert job.ran == ["a"]


async def _picked(engine: AsyncEngine, name: str) -> dict[str, bool]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT task_instance, picked FROM scheduled_tasks WHERE task_name = :n"),
            {"n": name},
        )
        return {r.task_instance: bool(r.picked) for r in rows}


async def _picked_is(engine: AsyncEngine, name: str, expected: dict[str, bool]) -> bool:
    return await _picked(engine, name) == expected


async def test_a_launch_that_raises_gives_its_row_back_and_the_batch_runs_on(
    any_registries: RegistryFactory,
    any_engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One row of a claimed batch of three fails to launch (deciding its slot raised): the
    other two run, and that row is not held (nor heartbeated) but unpicked, for the next
    poll to claim (review of main: it stayed held until a restart, and the exception left
    the rest of the batch picked with nothing running it)."""
    job = CountingJob("count")
    due = datetime.now(UTC) - timedelta(minutes=1)
    async with any_engine.begin() as conn:
        await conn.execute(
            insert(scheduled_tasks),
            [
                {"task_name": "count", "task_instance": i, "execution_time": due}
                | {"picked": False, "version": 1}
                for i in ("a", "b", "c")
            ],
        )
    registry = any_registries.build(job, poll=60.0)  # one poll: the startup's
    executor = registry.scheduler.executor
    prepare = executor._prepare
    failures: list[str] = []

    def fails_for_b(execution: Execution) -> bool:
        if execution.row.task_instance == "b":
            failures.append("b")
            raise RuntimeError("deciding the slot of b failed")
        return prepare(execution)

    executor._prepare = fails_for_b  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        assert await registry.wait_until_ready(10)
        await wait_until(lambda: len(job.runs) == 2, what="a and c run")
        await wait_until(
            lambda: _picked_is(any_engine, "count", {"b": False}), what="b unpicked, a, c done"
        )
    # a poll woken meanwhile (by a and c ending) may claim b again before the test puts the
    # launch right: it fails the same way and is given back again; it never spins
    assert dict(job.runs) == {"a": 1, "c": 1}
    assert set(failures) == {"b"} and len(failures) <= 2, failures
    executions = registry.scheduler.executions
    assert not executions.by_key and executions.executing == 0  # nothing held
    assert any("could not launch count/b" in r.getMessage() for r in caplog.records)
    del executor._prepare
    registry.scheduler.alarm.request_poll()  # the next poll claims it
    await wait_until(lambda: job.runs["b"] == 1, what="b run by the next poll")
    await wait_until(lambda: _picked_is(any_engine, "count", {}), what="b recorded")


async def test_a_manual_round_raises_the_dead_execution_checks_error(
    any_database: Database,
) -> None:
    """``Service.step`` propagates errors: the TimeMachine sees a failed dead-execution check
    (it was logged and swallowed, the round went on as if nothing were dead)."""
    job = Invoice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        store = tm.registry.scheduler.store.tasks

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise OSError("the database is away")

        store.revive_dead = down  # type: ignore[method-assign]
        with pytest.raises(OSError, match="the database is away"):
            await tm.run_due()
        del store.revive_dead
        assert await tm.run_due() == []


async def test_run_due_says_what_is_wrong_with_a_poller_step_that_is_not_one(
    any_database: Database,
) -> None:
    """A runtime check with a clear error, not an ``assert`` (gone under ``python -O``)."""
    async with TimeMachine(
        [Invoice()], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        lifecycle = tm.registry.scheduler.lifecycle

        async def step() -> dict[str, object]:
            return {"poller": 42}

        lifecycle.step = step  # type: ignore[method-assign]
        with pytest.raises(TypeError, match="returned 42, not a PollResult"):
            await tm.run_due()
        del lifecycle.step


class _AheadClock(SystemClock):
    """Monotonic seconds far from ``time.monotonic()`` (a clock of the test's own)."""

    monotonic = staticmethod(lambda: time.monotonic() + 1e6)


async def test_the_definitions_freshness_is_on_the_configured_clock(
    registries: RegistryFactory,
) -> None:
    """The executor compares ``Definitions.fresh_until`` with ``config.clock.monotonic()``:
    the definitions set it on that clock (they read ``time.monotonic()``: with another
    clock, the stored definitions were re-read before every recording, or never)."""
    clock = _AheadClock()
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(hours=1)))
    registry = await registries.start(tick, customize=lambda b: b.clock(clock))
    definitions = registry.scheduler.definitions
    await wait_until(lambda: definitions.fresh_until > 0, what="the definitions read")
    assert clock.monotonic() - 60 < definitions.fresh_until <= clock.monotonic() + 1.0


async def test_a_forced_run_of_a_paused_job_runs_under_the_time_machine(
    any_database: Database,
) -> None:
    """The machine's scheduler is started (in its manual mode): a forced run is claimed and
    run on it, as on a started scheduler."""
    job = Invoice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.schedule("invoice", "a", START + timedelta(hours=1))
        await tm.client.pause("invoice")
        assert await tm.client.run_now("invoice", "a", force=True) == "time-machine"
        scheduler = tm.registry.scheduler
        await wait_until(lambda: not scheduler.executions.by_key, what="the run recorded")
        assert job.ran == ["a"]
        # MySQL/MariaDB: the history writer inserts the record after the completion
        await wait_until(lambda: not scheduler.recorder.pending, what="the history written")
        assert [h.task_instance for h in await tm.client.history("invoice")] == ["a"]


async def test_a_forced_run_claimed_as_the_scheduler_stops_is_given_back(
    any_database: Database,
) -> None:
    """A forced run whose claim answers after the stop began (review3): the scheduler runs
    nothing more, so the row is unpicked at once (not left picked by a stopped instance until
    a peer revives it after the dead window) and the caller gets an error saying what to do,
    not ``RuntimeError: not running``."""
    job = Invoice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        scheduler = tm.registry.scheduler
        await tm.schedule("invoice", "a", START + timedelta(hours=1))
        await tm.client.pause("invoice")
        store = tm.client._tasks
        claim_now = store.claim_now

        async def claim_as_the_stop_begins(*args: Any) -> Any:
            row = await claim_now(*args)
            scheduler.state.stopping = True  # the stop's first step, while the claim answered
            return row

        store.claim_now = claim_as_the_stop_begins  # type: ignore[method-assign]
        try:
            with pytest.raises(RunNotClaimedError, match="began stopping") as raised:
                await tm.client.run_now("invoice", "a", force=True)
        finally:
            store.claim_now = claim_now  # type: ignore[method-assign]
            scheduler.state.stopping = False  # the machine's close stops it for real
        assert "force the run again on a running instance" in str(raised.value)
        row = await store.get("invoice", "a")
        assert row is not None and not row.picked and row.picked_by is None
        assert scheduler.executions.by_key == {} and not scheduler.executions.claiming
        assert job.ran == []
