"""The final review of issue 30 (run control), each defect confirmed on every database of the
suite and fixed:

A. an observer's ``execution_scope`` whose exit is interrupted (a stop request, a shutdown)
   left the row picked until revived: the result is recorded all the same;
B. a plain ``def`` job under ``Overlap.cancel_other`` cannot be interrupted: the slot that
   runs after it is the latest one due when it returns, those passed meanwhile are recorded
   missed (overlap), not run late;
C. a schedule's run counted, then the process gone before its result: the revived row runs
   the slot again without counting it twice (``max_runs`` not reached a slot early);
D. ``ekbatan_consecutive_missed_slots{task}`` is the longest streak of the task's instances
   (schedules), as ``ekbatan_missed_streaks`` keeps them, not the last one counted;
E. a buffered slot (``Overlap.buffer_one``) pending when the policy changes runs once, as
   decided, and is not also named missed;
F. a launch that keeps failing is paced: a recurring row is held (its slot kept) for a
   growing delay before it is given back, a one-time row is due again after it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    OneTimeJob,
    Overlap,
    PersistentScheduleJob,
    Schedule,
    Schedules,
)
from ekbatan_fastapi.domain.persistent import parse_spec
from ekbatan_fastapi.domain.rows import Finish
from ekbatan_fastapi.engine.execution import Execution
from ekbatan_fastapi.engine.observer import ExecutionFinished, SchedulerObserver
from ekbatan_fastapi.testing import TimeMachine

from .conftest import Database
from .helpers import RegistryFactory, slot_history, wait_until

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


async def _rows(engine: AsyncEngine, name: str) -> dict[str, bool]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT task_instance, picked FROM scheduled_tasks WHERE task_name = :n"),
            {"n": name},
        )
        return {r[0]: bool(r[1]) for r in rows}


# -- A: an observer's scope interrupted on exit ------------------------------------------------


class SlowExit(SchedulerObserver):
    """Its scope's exit waits for ``release`` (or ``hold`` seconds); notes an interruption."""

    def __init__(self, hold: float | None = None) -> None:
        self.exiting = asyncio.Event()
        self.release = asyncio.Event()
        self.hold = hold
        self.interrupted = False

    def execution_scope(self, execution: Any) -> Any:
        return self._scope()

    @contextlib.asynccontextmanager
    async def _scope(self) -> AsyncIterator[None]:
        yield
        self.exiting.set()
        try:
            if self.hold is None:
                await self.release.wait()
            else:
                await asyncio.sleep(self.hold)
        except asyncio.CancelledError:
            self.interrupted = True
            raise


class Quick(OneTimeJob):
    def __init__(self) -> None:
        self.ran: list[str] = []

    def name(self) -> str:
        return "quick"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.ran.append(ctx.task_instance)


async def _cancel_requests(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(
            (await conn.execute(text("SELECT COUNT(*) FROM ekbatan_cancel_requests"))).scalar_one()
        )


async def test_a_stop_request_while_an_observer_scope_exits_still_records_the_result(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job, scope = Quick(), SlowExit()
    registry = await any_registries.start(job, customize=lambda b: b.observer(scope))
    await registry.client.schedule("quick", "a")
    await asyncio.wait_for(scope.exiting.wait(), 20)
    await registry.client.cancel_running("quick", "a", "stop it")
    await wait_until(
        lambda: _cancel_requests_is(any_engine, 0), timeout=20, what="the request handled"
    )
    scope.release.set()
    await wait_until(
        lambda: _rows_are(any_engine, "quick", {}), timeout=10, what="the result recorded"
    )
    assert not scope.interrupted
    assert job.ran == ["a"]
    await wait_until(lambda: _outcomes_are(any_engine, ["succeeded"]), what="its history")


async def test_a_shutdown_while_an_observer_scope_exits_still_records_the_result(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """The shutdown's second phase (cancel what still runs) does not cancel an execution
    recording its result: the scope's exit ends, the result is written (review: the task was
    cancelled in the exit, the row left picked until revived)."""
    job, scope = Quick(), SlowExit(hold=0.8)
    registry = any_registries.build(job, shutdown=0.5, customize=lambda b: b.observer(scope))
    await registry.start()
    await registry.client.schedule("quick", "b")
    await asyncio.wait_for(scope.exiting.wait(), 20)
    await registry.stop()
    assert not scope.interrupted
    assert await _rows(any_engine, "quick") == {}
    await wait_until(lambda: _outcomes_are(any_engine, ["succeeded"]), what="its history")


async def _outcomes_are(engine: AsyncEngine, expected: list[str]) -> bool:
    return [o for _, o, _ in await slot_history(engine, "quick", "error_class")] == expected


async def _cancel_requests_is(engine: AsyncEngine, count: int) -> bool:
    return await _cancel_requests(engine) == count


async def _rows_are(engine: AsyncEngine, name: str, expected: dict[str, bool]) -> bool:
    return await _rows(engine, name) == expected


# -- B: a plain def job under Overlap.cancel_other ---------------------------------------------


class Unstoppable(DistributedJob):
    """Every second, ``Overlap.cancel_other``; a plain ``def``: its first run goes on after it
    was asked to stop, until two more slots have come due."""

    def __init__(self) -> None:
        self.slots: list[datetime] = []
        self.asked = False

    def name(self) -> str:
        return "unstoppable"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(seconds=1))

    def overlap(self) -> Overlap:
        return Overlap.cancel_other()

    def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        if len(self.slots) > 1:
            return
        deadline = time.monotonic() + 20
        while not ctx.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.02)
        self.asked = ctx.cancel_requested
        # on past the slot that asked it to stop and the next one
        while datetime.now(UTC) < ctx.execution_time + timedelta(seconds=2.3):
            time.sleep(0.02)


async def test_a_plain_def_job_under_cancel_other_runs_the_latest_slot_when_it_returns(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Unstoppable()
    await any_registries.start(job)
    await wait_until(lambda: len(job.slots) >= 2, timeout=20, what="the run after the first")
    first, after = job.slots[0], job.slots[1]
    assert job.asked, "ctx.cancel_requested turned true when the next slot came due"
    stale = first + timedelta(seconds=1)
    assert after >= first + timedelta(seconds=2), (
        f"ran the stale slot {after.isoformat()} (due while the def job went on)"
    )

    async def recorded() -> bool:
        history = await slot_history(any_engine, "unstoppable", "error_class")
        return any(o == "missed" for _, o, _ in history) and any(
            o == "cancelled" for _, o, _ in history
        )

    await wait_until(recorded, timeout=20, what="the cancelled run and the missed slot")
    history = await slot_history(any_engine, "unstoppable", "error_class")
    assert [t for t, o, _ in history if o == "cancelled"] == [first]
    missed = {t: c for t, o, c in history if o == "missed"}
    # overlap: due while it ran (coalesced only if the first run started a second late)
    assert missed.get(stale) in ("overlap", "coalesced"), history
    runs = [t for t, o, _ in history if o not in ("missed", "cancelled")]
    assert stale not in runs, "each slot accounted once"


# -- C: a schedule's run counted once per slot -------------------------------------------------


class Twice(PersistentScheduleJob):
    def __init__(self) -> None:
        self.slots: list[datetime] = []

    def name(self) -> str:
        return "twice"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)


async def test_a_schedule_counted_then_crashed_before_its_result_still_runs_max_runs_slots(
    any_database: Database,
) -> None:
    """``max_runs=2``; the first run is counted into the row, then its result is lost (the
    process died): the row, revived by the next process, runs that slot again, and the
    schedule still runs its second slot (review: counted twice, it ended after the first)."""
    job = Twice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.client.create_schedule(
            "twice", "acme", Schedules.fixed_rate(timedelta(days=1)), max_runs=2
        )
        scheduler = tm.registry.scheduler
        lost: list[Execution] = []

        def dies(finish: Finish, execution: Execution) -> None:
            lost.append(execution)  # the process died between the count and the result
            scheduler.executions.forget(execution)  # nor heartbeated any more

        scheduler.executor.submit = dies  # type: ignore[method-assign]
        await tm.run_due()
        assert len(lost) == 1 and job.slots == [START]
        row = await tm.client.get("twice", "acme")
        assert row is not None and row.picked
        assert parse_spec(row.task_data, where="").runs == 1
        dead_after = tm.registry.config.dead_after
    async with TimeMachine(
        [job],
        any_database.url,
        start=START + dead_after + timedelta(seconds=2),
        dialect=any_database.override,
    ) as tm:
        await tm.run_due()  # revived: the same slot again, not counted twice
        assert job.slots == [START, START]
        row = await tm.client.get("twice", "acme")
        assert row is not None and not row.picked
        assert parse_spec(row.task_data, where="").runs == 1
        await tm.advance(to=row.execution_time)
        await tm.run_due()
        assert job.slots == [START, START, START + timedelta(days=1)], "max_runs 2: 2 slots"
        assert await tm.client.get("twice", "acme") is None, "then it ended"


# -- D: the gauge of missed slots per task, from its instances' streaks ------------------------


def test_the_missed_slots_gauge_is_the_longest_streak_of_the_tasks_instances() -> None:
    pytest.importorskip("prometheus_client")
    from ekbatan_fastapi.domain.rows import Outcome
    from ekbatan_fastapi.metrics import EkbatanMetrics

    metrics = EkbatanMetrics()

    def gauge() -> float | None:
        return metrics.registry.get_sample_value(
            "ekbatan_consecutive_missed_slots", {"task": "reports"}
        )

    def ran(instance: str) -> None:
        now = datetime.now(UTC)
        metrics.execution_finished(
            ExecutionFinished(
                task_name="reports",
                task_instance=instance,
                execution_time=now,
                outcome=Outcome.SUCCEEDED,
                duration=0.0,
                slot_lag=0.0,
                consecutive_failures=0,
                finished_at=now,
                error=None,
            )
        )

    metrics.missed_streak("reports", "acme", 5)
    metrics.missed_streak("reports", "globex", 1)
    assert gauge() == 5, "globex's shorter streak does not hide acme's"
    stamped = metrics.registry.get_sample_value(
        "ekbatan_missed_slots_timestamp_seconds", {"task": "reports"}
    )
    ran("globex")
    assert gauge() == 5, "a run of globex does not end acme's streak"
    success = metrics.registry.get_sample_value(
        "ekbatan_last_success_timestamp_seconds", {"task": "reports"}
    )
    restamped = metrics.registry.get_sample_value(
        "ekbatan_missed_slots_timestamp_seconds", {"task": "reports"}
    )
    assert stamped is not None and success is not None and restamped is not None
    assert restamped > success, "the alert rule does not take globex's success for acme's run"
    ran("acme")
    assert gauge() == 0


# -- E: a buffered slot pending when the overlap policy changes --------------------------------


class Buffered(DistributedJob):
    """Hourly; its first run moves the machine's time 3 h 30 ahead (its policy is given)."""

    def __init__(self, policy: Overlap) -> None:
        self.policy = policy
        self.slots: list[datetime] = []
        self.tm: TimeMachine | None = None

    def name(self) -> str:
        return "buffered-change"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    def overlap(self) -> Overlap:
        return self.policy

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        if len(self.slots) == 1 and self.tm is not None:
            await self.tm.advance(by=3 * HOUR + HOUR / 2)


async def test_a_buffered_slot_pending_when_the_policy_changes_is_accounted_once(
    any_database: Database,
) -> None:
    first = Buffered(Overlap.buffer_one())
    async with TimeMachine(
        [first], any_database.url, start=START, dialect=any_database.override, max_rounds=1
    ) as tm:
        first.tm = tm
        with contextlib.suppress(RuntimeError):  # one round: the buffered slot still due
            await tm.run_due()
        assert first.slots == [START]
        now = tm.now
    # the next deploy: Overlap.skip; the buffered slot START+1h is still pending
    second = Buffered(Overlap.skip())
    async with TimeMachine(
        [second], any_database.url, start=now, dialect=any_database.override
    ) as tm:
        await tm.run_due()
        history = await tm.client.history("buffered-change")
        named: dict[datetime, list[str]] = {}
        for h in history:
            named.setdefault(h.execution_time, []).append(h.outcome)
        assert second.slots == [START + HOUR], named
        assert named == {
            START: ["succeeded"],
            START + HOUR: ["succeeded"],
            START + 2 * HOUR: ["missed"],
            START + 3 * HOUR: ["missed"],
        }, named
        row = await tm.client.get("buffered-change", "recurring")
        assert row is not None and row.execution_time == START + 4 * HOUR


# -- F: a launch that keeps failing is paced ---------------------------------------------------


class Hourly(DistributedJob):
    def __init__(self) -> None:
        self.slots: list[datetime] = []

    def name(self) -> str:
        return "hourly-launch"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)


async def test_a_recurring_row_whose_launch_keeps_failing_is_paced_and_runs_once_it_works(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """Polling every 0.2 s, the failing launch is tried 3 times in about 3 s (held 1 s, then
    2 s, before it is given back; review: at every wake-up of every instance), its slot kept;
    it runs that slot once launching works again."""
    job = Hourly()
    registry = any_registries.build(job, poll=0.2)
    executor = registry.scheduler.executor
    prepare = executor._prepare
    failures: list[float] = []
    broken = True

    def fails(execution: Execution) -> bool:
        if broken and execution.row.task_name == "hourly-launch":
            failures.append(time.monotonic())
            raise RuntimeError("deciding the slot failed")
        return prepare(execution)

    executor._prepare = fails  # type: ignore[method-assign]
    await registry.start()
    await wait_until(lambda: len(failures) >= 3, timeout=20, what="three failed launches")
    gaps = [b - a for a, b in itertools.pairwise(failures)]
    assert gaps[0] >= 0.95 and gaps[1] >= 1.9, gaps
    assert await _rows(any_engine, "hourly-launch") in (
        {"recurring": True},
        {"recurring": False},
    )
    slot = (await registry.client.get("hourly-launch", "recurring")).execution_time  # type: ignore[union-attr]
    broken = False
    await wait_until(lambda: len(job.slots) == 1, timeout=20, what="the slot run")
    assert job.slots == [slot], "its slot kept"
    assert len(failures) <= 4


async def test_a_one_time_row_whose_launch_fails_is_due_again_after_a_delay(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Quick()
    registry = any_registries.build(job, poll=0.2)
    executor = registry.scheduler.executor
    prepare = executor._prepare
    failures: list[float] = []
    broken = True

    def fails(execution: Execution) -> bool:
        if broken:
            failures.append(time.monotonic())
            raise RuntimeError("deciding the slot failed")
        return prepare(execution)

    executor._prepare = fails  # type: ignore[method-assign]
    await registry.start()
    await registry.client.schedule("quick", "c")
    await wait_until(lambda: len(failures) >= 3, timeout=20, what="three failed launches")
    gaps = [b - a for a, b in itertools.pairwise(failures)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.8, gaps
    broken = False
    await wait_until(lambda: job.ran == ["c"], timeout=20, what="c run")
    await wait_until(lambda: _rows_are(any_engine, "quick", {}), what="c recorded")
