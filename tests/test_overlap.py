"""Overlap policies (``overlap()`` on a recurring job and on a ``PersistentScheduleJob``): what
a slot that comes due while an execution still runs does. ``skip`` (the default) and
``buffer_one`` under a ``TimeMachine`` (the job moves the time past its next slots while it
runs); ``cancel_other`` on real schedulers (a timer of the owner, and a peer's request through
``ekbatan_cancel_requests``). Also the retries and ``pause_after_failures`` of a schedule row.
On every database of the suite."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    CatchUp,
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    FailureHandler,
    MaxRetries,
    Overlap,
    PersistentScheduleJob,
    RetryLater,
    Schedule,
    Schedules,
    job_registry,
)
from ekbatan_fastapi.client.read_model import ReadModel
from ekbatan_fastapi.domain.catchup import PassedSlots, SlotReason, after_run
from ekbatan_fastapi.testing import TimeMachine

from .conftest import Database
from .helpers import RegistryFactory, Stubborn, Worker, slot_history, wait_until
from .proc_worker import LEDGERS, overlap_runs

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


# -- the policy's arithmetic (pure) -----------------------------------------------------------


def test_skip_reports_the_slots_a_run_overlapped_apart_from_those_missed_before_it() -> None:
    schedule = Schedules.fixed_rate(HOUR)
    started = START + 90 * timedelta(minutes=1)  # claimed 1.5 h late: START+1h was missed
    after = after_run(
        schedule, CatchUp.latest(), START, START, START + 4 * HOUR + timedelta(minutes=5),
        started=started, overlap=Overlap.skip(),
    )  # fmt: skip
    assert after.next_time == START + 5 * HOUR
    assert after.passed == (
        PassedSlots(START + HOUR, START + HOUR, 1, SlotReason.COALESCED),
        PassedSlots(START + 2 * HOUR, START + 4 * HOUR, 3, SlotReason.OVERLAP),
    )
    assert after.missed == 4 and after.buffered is None
    assert "merged into the run of" in after.passed[0].why
    assert "was going (Overlap.skip)" in after.passed[1].why


def test_buffer_one_runs_the_first_overlapped_slot_next_and_skips_the_others() -> None:
    schedule = Schedules.fixed_rate(HOUR)
    finished = START + 3 * HOUR + timedelta(minutes=30)
    after = after_run(
        schedule, CatchUp.latest(), START, START, finished, started=START,
        overlap=Overlap.buffer_one(),
    )  # fmt: skip
    assert (after.next_time, after.buffered, after.through) == (
        START + HOUR,
        START + HOUR,
        START + 3 * HOUR,
    )
    assert after.passed == (PassedSlots(START + 2 * HOUR, START + 3 * HOUR, 2, SlotReason.OVERLAP),)
    assert "Overlap.buffer_one" in after.passed[0].why
    # a run that ends before its next slot buffers nothing
    calm = after_run(
        schedule, CatchUp.latest(), START, START, START + HOUR / 2, overlap=Overlap.buffer_one()
    )
    assert (calm.next_time, calm.buffered, calm.passed) == (START + HOUR, None, ())


class _Bad(DistributedJob):
    def __init__(self, value: Any) -> None:
        self.value = value

    def name(self) -> str:
        return "bad"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    def overlap(self) -> Overlap:
        return self.value  # type: ignore[no-any-return]

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


class _BadSchedules(PersistentScheduleJob):
    def name(self) -> str:
        return "bad-schedules"

    def overlap(self) -> Overlap:
        return "cancel_other"  # type: ignore[return-value]

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


@pytest.mark.parametrize("value", ["skip", None, Overlap("buffer_all")])
def test_a_bad_overlap_policy_is_refused_at_build_naming_the_value(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"_Bad\.overlap\(\) must return Overlap\.skip"):
        job_registry().connection_provider("postgresql+asyncpg://x@h/db").with_job(
            _Bad(value)
        ).build()


def test_a_bad_overlap_policy_of_a_schedules_job_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"got 'cancel_other'"):
        job_registry().connection_provider("postgresql+asyncpg://x@h/db").with_job(
            _BadSchedules()
        ).build()


# -- skip and buffer_one, under a TimeMachine --------------------------------------------------


class Overrunning(DistributedJob):
    """Hourly; its first run moves the machine's time ``overrun`` ahead while it runs."""

    def __init__(self, policy: Overlap, overrun: timedelta, name: str) -> None:
        self.policy = policy
        self.overrun = overrun
        self._name = name
        self.slots: list[datetime] = []
        self.tm: TimeMachine | None = None

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    def overlap(self) -> Overlap:
        return self.policy

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        if len(self.slots) == 1:
            assert self.tm is not None
            await self.tm.advance(by=self.overrun)


async def test_skip_leaves_the_overlapped_slots_and_goes_on_after_the_run(
    any_database: Database,
) -> None:
    job = Overrunning(Overlap.skip(), 3 * HOUR + timedelta(minutes=30), "skipping")
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        job.tm = tm
        assert [r.execution_time for r in await tm.run_due()] == [START]
        row = await tm.client.get("skipping", "recurring")
        assert row is not None and row.execution_time == START + 4 * HOUR
        await tm.advance(to=START + 4 * HOUR)
        await tm.run_due()
        assert job.slots == [START, START + 4 * HOUR]
        views = await ReadModel.of(tm.client, tm.registry.scheduler).job_views()
        assert {v.name: v.overlap for v in views} == {"skipping": "skip"}


class OverrunsOnce(Overrunning):
    def __init__(self, policy: Overlap) -> None:
        super().__init__(policy, 3 * HOUR + timedelta(minutes=30), "buffer-alone")


async def test_buffer_one_skips_the_other_overlapped_slots_and_keeps_the_grid(
    any_database: Database,
) -> None:
    job = OverrunsOnce(Overlap.buffer_one())
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        job.tm = tm
        ran = await tm.run_due()
        assert [r.execution_time for r in ran] == [START, START + HOUR]
        assert job.slots == [START, START + HOUR]
        row = await tm.client.get("buffer-alone", "recurring")
        assert row is not None and row.execution_time == START + 4 * HOUR
        assert await tm.run_due() == []  # START+2h and +3h were skipped, not run later
        await tm.advance(to=START + 4 * HOUR)
        assert [r.execution_time for r in await tm.run_due()] == [START + 4 * HOUR]


# -- cancel_other, on real schedulers ---------------------------------------------------------


async def test_cancel_other_stops_the_running_execution_when_its_next_slot_is_due(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Stubborn()
    await any_registries.start(job)
    await asyncio.wait_for(job.second.wait(), 20)
    first, second = job.slots[0], job.slots[1]
    assert job.saw_cancel
    # the first slot due after the run started (1 s later, unless the claim came late)
    assert second > first and (second - first) % timedelta(seconds=1) == timedelta(0)

    async def recorded() -> bool:
        return any(o == "cancelled" for _, o, _ in await slot_history(any_engine, "stubborn"))

    await wait_until(recorded, timeout=20, what="the cancelled record")
    history = await slot_history(any_engine, "stubborn")
    cancelled = [h for h in history if h[1] == "cancelled"]
    assert len(cancelled) == 1
    assert cancelled[0][0].replace(microsecond=0) == first.replace(microsecond=0)
    message = cancelled[0][2] or ""
    assert f"overlap: slot {second.isoformat()} was due" in message, message


async def test_cancel_other_of_a_peer_is_asked_through_the_cancel_requests(
    any_registries: RegistryFactory, any_engine: AsyncEngine, any_database: Database
) -> None:
    """The owner's own timer is put off; a peer that sees the row held past its next slot
    asks it to stop (as ``client.cancel_running``), and the owner stops it at its next
    heartbeat round."""
    if any_database.dialect == "mysql5":
        pytest.skip("MySQL 5.7's fetch poll reports no held rows: the owner's timer only")
    job = Stubborn("asked")
    owner = any_registries.build(job)
    owner.scheduler.executor._arm_overlap = lambda execution: None  # type: ignore[method-assign]
    await owner.start()
    peer_job = Stubborn("asked")
    peer_job.slots.append(START)  # the peer's runs return at once
    await asyncio.wait_for(job.first.wait(), 20)
    peer = await any_registries.start(peer_job)
    assert peer is not owner

    async def stopped() -> bool:
        return any(o == "cancelled" for _, o, _ in await slot_history(any_engine, "asked"))

    await wait_until(stopped, timeout=30, what="the owner's execution stopped on request")
    cancelled = next(h for h in await slot_history(any_engine, "asked") if h[1] == "cancelled")
    message = cancelled[2] or ""
    assert message.startswith(f"cancelled by {peer.scheduler.name}: overlap: slot "), message
    assert message.endswith(" was due"), message
    assert job.saw_cancel


# -- a PersistentScheduleJob: overlap, retries and pause per schedule ---------------------------


class Reports(PersistentScheduleJob):
    """Fails its first ``failures`` attempts per schedule."""

    def __init__(
        self,
        failures: int,
        handler: FailureHandler | None = None,
        pause_after: int | None = None,
        policy: Overlap | None = None,
    ) -> None:
        self.failures = failures
        self.handler = handler
        self.pause_after = pause_after
        self.policy = policy or Overlap.skip()
        self.attempts: list[tuple[str, datetime, int]] = []
        self.tm: TimeMachine | None = None
        self.overrun: timedelta | None = None

    def name(self) -> str:
        return "reports"

    def failure_handler(self) -> FailureHandler | None:
        return self.handler

    def pause_after_failures(self) -> int | None:
        return self.pause_after

    def overlap(self) -> Overlap:
        return self.policy

    async def execute(self, ctx: ExecutionContext) -> None:
        self.attempts.append((ctx.task_instance, ctx.execution_time, ctx.attempt))
        mine = [a for a in self.attempts if a[0] == ctx.task_instance]
        if self.overrun is not None and len(mine) == 1:
            assert self.tm is not None
            await self.tm.advance(by=self.overrun)
        if len(mine) <= self.failures and ctx.task_instance != "globex":
            raise RuntimeError(f"attempt {len(mine)} fails")


async def test_a_schedule_retries_its_failed_slot_as_the_same_slot(any_database: Database) -> None:
    job = Reports(failures=2, handler=RetryLater(timedelta(minutes=10)))
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        assert await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H", max_runs=3)
        await tm.run_due()
        await tm.advance(by=timedelta(minutes=10))
        await tm.run_due()
        await tm.advance(by=timedelta(minutes=10))
        await tm.run_due()
        assert job.attempts == [("acme", START, 1), ("acme", START, 2), ("acme", START, 3)]
        info = await tm.client.get_schedule("reports", "acme")
        assert info is not None and info.runs == 1  # a retry is no slot of its own
        assert info.next_time == START + HOUR  # back on the grid
        outcomes = [(t, o) for t, o, _ in await slot_history(tm.engine, "reports")]
        assert outcomes == [(START, "failed"), (START, "failed"), (START, "succeeded")]


async def test_a_schedule_retry_overtaken_by_the_next_slot_is_dropped(
    any_database: Database,
) -> None:
    job = Reports(failures=1, handler=RetryLater(timedelta(minutes=30)))
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H")
        await tm.run_due()
        await tm.advance(by=HOUR)  # the retry (START+30min) is still pending at START+1h
        await tm.run_due()
        assert job.attempts == [("acme", START, 1), ("acme", START + HOUR, 1)]
        history = await slot_history(tm.engine, "reports")
        dropped = [h for h in history if h[1] == "skipped"]
        assert len(dropped) == 1 and "dropped: the next slot came first" in (dropped[0][2] or "")


async def test_a_failing_schedule_is_paused_alone_by_ekbatan(any_database: Database) -> None:
    job = Reports(failures=100, pause_after=2)
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H")
        await tm.client.create_schedule("reports", "globex", "FIXED_RATE|PT1H", start_at=START)
        await tm.run_due()
        await tm.advance(by=HOUR)
        await tm.run_due()
        acme = await tm.client.get_schedule("reports", "acme")
        assert acme is not None and acme.paused is not None and acme.state == "paused"
        assert acme.paused["by"] == "ekbatan"
        assert "paused after 2 consecutive failures" in acme.paused["reason"]
        await tm.advance(by=HOUR)
        await tm.run_due()
        ran = [(i, t) for i, t, _ in job.attempts]
        assert ("acme", START + 2 * HOUR) not in ran  # paused: no more slots
        assert ("globex", START + 2 * HOUR) in ran  # the schedule that does not fail goes on
        assert await tm.client.resume_schedule("reports", "acme")


async def test_a_schedule_buffers_one_overlapped_slot(any_database: Database) -> None:
    job = Reports(failures=0, policy=Overlap.buffer_one())
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        job.tm, job.overrun = tm, 2 * HOUR + timedelta(minutes=30)
        await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H")
        await tm.run_due()
        assert [(t, a) for _, t, a in job.attempts] == [(START, 1), (START + HOUR, 1)]
        info = await tm.client.get_schedule("reports", "acme")
        assert info is not None and info.next_time == START + 3 * HOUR and info.runs == 2


# -- cancel_other across real processes ----------------------------------------------------------


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@pytest.mark.multiprocess
async def test_two_processes_cancel_the_overlapped_run_and_run_the_due_slot_once(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Two scheduler processes (the first one up puts the job's row, due at once); the
    first run (whichever process claims it) would run for an hour. When its next slot is due
    it is stopped, recorded ``cancelled`` with the slot that was due, and that slot runs once
    (``overlap_runs``' key is the slot)."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[overlap_runs])
    period = timedelta(seconds=3)
    args = [
        "--poll",
        "0.2",
        "--period",
        str(period.total_seconds()),
        *(["--dialect", any_database.override] if any_database.override else []),
    ]
    workers = await asyncio.gather(
        *(Worker.start("overlap", any_database.url, *args) for _ in range(2))
    )

    async def runs() -> list[tuple[datetime, int]]:
        async with any_engine.connect() as conn:
            rows = await conn.execute(select(overlap_runs).order_by(overlap_runs.c.slot))
            return [(_aware(r.slot), r.pid) for r in rows]

    async def next_slot_ran() -> bool:
        done = await runs()
        cancelled = [
            h for h in await slot_history(any_engine, "overlapping") if h[1] == "cancelled"
        ]
        return len(done) >= 2 and bool(cancelled)

    try:
        await wait_until(next_slot_ran, timeout=30, what="the overlapped run cancelled")
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0]
    done = await runs()
    slot, due = done[0][0], done[1][0]  # the long run (the first), and the slot that was due
    assert (due - slot) % period == timedelta(0) and due > slot
    assert {p for _, p in done} <= {w.pid for w in workers}
    history = await slot_history(any_engine, "overlapping")
    cancelled = [h for h in history if h[1] == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0][0] == slot
    message = cancelled[0][2] or ""
    assert f"overlap: slot {due.isoformat()} was due" in message, message
    assert [h[1] for h in history if h[0] == due] == ["succeeded"]  # the due slot ran once


async def test_a_schedule_whose_handler_gives_up_goes_on_with_its_next_slot(
    any_database: Database,
) -> None:
    job = Reports(failures=100, handler=MaxRetries(1, RetryLater(timedelta(minutes=10))))
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H")
        await tm.run_due()
        await tm.advance(by=timedelta(minutes=10))
        await tm.run_due()  # attempt 2 fails too: the handler gives up
        info = await tm.client.get_schedule("reports", "acme")
        assert info is not None and info.next_time == START + HOUR  # the grid's next slot
        await tm.advance(to=START + HOUR)
        await tm.run_due()
        assert job.attempts == [("acme", START, 1), ("acme", START, 2), ("acme", START + HOUR, 1)]


class StubbornSchedules(PersistentScheduleJob):
    """``Overlap.cancel_other`` per schedule: each schedule's first run would never end."""

    def __init__(self) -> None:
        self.slots: dict[str, list[datetime]] = {}
        self.second = asyncio.Event()

    def name(self) -> str:
        return "stubborn-schedules"

    def overlap(self) -> Overlap:
        return Overlap.cancel_other()

    async def execute(self, ctx: ExecutionContext) -> None:
        mine = self.slots.setdefault(ctx.task_instance, [])
        mine.append(ctx.execution_time)
        if len(mine) > 1:
            self.second.set()
            return
        await asyncio.sleep(3600)


async def test_cancel_other_applies_per_schedule(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = StubbornSchedules()
    registry = await any_registries.start(job)
    await registry.client.create_schedule("stubborn-schedules", "acme", "FIXED_RATE|PT1S")
    await asyncio.wait_for(job.second.wait(), 20)
    first, second = job.slots["acme"][:2]
    assert second > first and (second - first) % timedelta(seconds=1) == timedelta(0)

    async def recorded() -> bool:
        history = await slot_history(any_engine, "stubborn-schedules")
        return any(o == "cancelled" for _, o, _ in history)

    await wait_until(recorded, timeout=20, what="the schedule's cancelled run")
    cancelled = [
        h for h in await slot_history(any_engine, "stubborn-schedules") if h[1] == "cancelled"
    ]
    assert len(cancelled) == 1
    assert f"overlap: slot {second.isoformat()} was due" in (cancelled[0][2] or "")


async def test_a_peer_row_no_longer_held_is_not_asked_to_stop_at_every_poll() -> None:
    """The poller judged a peer's row past its next slot (``Overlap.cancel_other``); once a
    poll no longer sees that row held (it finished), nobody is asked again: the row was looked
    up (a read of the row) at every poll after, for ever."""
    from ekbatan_fastapi.domain.rows import PollResult
    from ekbatan_fastapi.engine.poller import Poller

    asked: list[tuple[str, datetime, datetime]] = []

    async def stop(name: str, due: datetime, slot: datetime) -> None:
        asked.append((name, due, slot))

    poller = Poller.__new__(Poller)
    poller.stop_overlapped = stop
    poller._asked = set()
    held = ("job", START)
    poller._overlapped = [(*held, START + HOUR)]
    await poller._stop_overlapped(PollResult([], START + HOUR, None, held=(held,)))
    assert asked == [("job", START, START + HOUR)]
    await poller._stop_overlapped(PollResult([], START + HOUR, None, held=(held,)))
    assert len(asked) == 1  # once per row and slot
    for _ in range(3):  # it ended: the polls see no held row (their _held_due is not run)
        await poller._stop_overlapped(PollResult([], START + 2 * HOUR, None))
    assert len(asked) == 1
    assert not poller._overlapped and not poller._asked


async def test_a_schedule_edited_while_its_failed_run_ends_keeps_the_edit(
    any_database: Database,
) -> None:
    """``update_schedule`` (or a pause) of a running schedule between the count of its run
    and the write of its pending retry: the retry's write (guarded by the claim's version
    only) put the old spec back, the edit lost. Now the retry is not written over an edit
    (its next slot follows, by the schedule it ran with) and the edit stays."""
    job = Reports(failures=1, handler=RetryLater(timedelta(minutes=10)))
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        assert await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H", {"v": 1})
        executor = tm.registry.scheduler.executor
        write_mark = executor._retry_marks
        assert write_mark is not None

        async def edited_first(execution: Any) -> bool:
            await tm.client.update_schedule("reports", "acme", data={"v": 2})
            return await write_mark(execution)

        executor._retry_marks = edited_first
        await tm.run_due()
        assert [a[2] for a in job.attempts] == [1]
        info = await tm.client.get_schedule("reports", "acme")
        assert info is not None and info.data == {"v": 2}


async def test_a_schedule_whose_retry_cannot_be_written_still_ends_at_max_runs(
    any_database: Database,
) -> None:
    """The last run of a ``max_runs`` schedule fails and its retry cannot be written (the row
    edited meanwhile, the database failing): the next slot follows instead, but the schedule's
    end still applies (it ran one slot more than ``max_runs``)."""
    job = Reports(failures=5, handler=RetryLater(timedelta(minutes=10)))
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        assert await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H", max_runs=1)

        async def refused(execution: Any) -> bool:
            return False

        tm.registry.scheduler.executor._retry_marks = refused
        await tm.run_due()
        assert await tm.client.get_schedule("reports", "acme") is None
        await tm.advance(by=2 * HOUR)
        await tm.run_due()
        assert [a[1:] for a in job.attempts] == [(START, 1)]
