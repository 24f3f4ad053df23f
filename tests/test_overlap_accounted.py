"""The overlap policies' passed slots are accounted for (issue 30, items 4 and 5 together):
``Overlap.buffer_one`` runs the first slot that came due during a run and records the others
as ``missed`` with the reason ``overlap``; ``Overlap.cancel_other`` records its stopped run as
``cancelled`` and nothing twice; a ``PersistentScheduleJob``'s schedule records its passed
slots too. One computation (``domain.catchup.after_run``) feeds the history, the
``slot_missed`` events, the slot counts and the streak. On every database of the suite."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    Job,
    Overlap,
    PersistentScheduleJob,
    Schedule,
    Schedules,
)
from ekbatan_fastapi.client.read_model import ReadModel
from ekbatan_fastapi.testing import TimeMachine

from .conftest import Database
from .helpers import MissedSlots, RegistryFactory, Stubborn, db_now, put_row, wait_until

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _machine(job: Job, database: Database, seen: MissedSlots) -> TimeMachine:
    """A ``TimeMachine`` of ``job`` at ``START`` on ``database``, telling ``seen``."""
    return TimeMachine(
        [job],
        database.url,
        start=START,
        dialect=database.override,
        customize=lambda b: b.observer(seen),
    )


class Overruns(DistributedJob):
    """Hourly, ``Overlap.buffer_one``; its first run moves the machine's time 3 h 30 ahead:
    three slots come due while it runs."""

    def __init__(self) -> None:
        self.slots: list[datetime] = []
        self.tm: TimeMachine | None = None

    def name(self) -> str:
        return "buffered"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    def overlap(self) -> Overlap:
        return Overlap.buffer_one()

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        if len(self.slots) == 1:
            assert self.tm is not None
            await self.tm.advance(by=3 * HOUR + HOUR / 2)


async def test_buffer_one_runs_the_first_overlapped_slot_and_records_the_others_missed(
    any_database: Database,
) -> None:
    job, seen = Overruns(), MissedSlots()
    async with _machine(job, any_database, seen) as tm:
        job.tm = tm
        ran = await tm.run_due()
        assert [r.execution_time for r in ran] == [START, START + HOUR]
        history = await tm.client.history("buffered")
        runs = sorted((h.execution_time, h.outcome) for h in history if h.outcome != "missed")
        assert runs == [(START, "succeeded"), (START + HOUR, "succeeded")]
        missed = sorted(
            (h.execution_time, h.error_class, h.error_message or "")
            for h in history
            if h.outcome == "missed"
        )
        assert [(t, c) for t, c, _ in missed] == [
            (START + 2 * HOUR, "overlap"),
            (START + 3 * HOUR, "overlap"),
        ]
        assert all("Overlap.buffer_one" in m for _, _, m in missed)
        assert [(s, r) for _, _, s, r in seen.slots] == [(t, c) for t, c, _ in missed]
        assert seen.streaks == [("buffered", "recurring", 2)]
        stored = (await tm.client.job_definitions())["buffered"]
        assert stored.missed == 2, "counted once: the buffered run adds nothing"
        await tm.advance(to=START + 4 * HOUR)
        assert [r.execution_time for r in await tm.run_due()] == [START + 4 * HOUR]
        history = await tm.client.history("buffered")
        assert sum(h.outcome == "missed" for h in history) == 2, "nothing recorded twice"
        page = await ReadModel.of(tm.client, tm.registry.scheduler).tasks("buffered")
        assert page.tasks[0].consecutive_missed_slots == 0, "a run ended the streak"


class Reports(PersistentScheduleJob):
    """Each schedule's first run moves the machine's time 3 h 30 ahead."""

    def __init__(self, policy: Overlap) -> None:
        self.policy = policy
        self.slots: list[tuple[str, datetime]] = []
        self.tm: TimeMachine | None = None

    def name(self) -> str:
        return "reports"

    def overlap(self) -> Overlap:
        return self.policy

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append((ctx.task_instance, ctx.execution_time))
        if len(self.slots) == 1:
            assert self.tm is not None
            await self.tm.advance(by=3 * HOUR + HOUR / 2)


@pytest.mark.parametrize(
    ("policy", "ran", "missed"),
    [
        (Overlap.skip(), [START], [1, 2, 3]),
        (Overlap.buffer_one(), [START, START + HOUR], [2, 3]),
    ],
    ids=["skip", "buffer_one"],
)
async def test_a_schedule_records_the_slots_its_overlap_policy_passed_over(
    any_database: Database, policy: Overlap, ran: list[datetime], missed: list[int]
) -> None:
    job, seen = Reports(policy), MissedSlots()
    async with _machine(job, any_database, seen) as tm:
        job.tm = tm
        await tm.client.create_schedule("reports", "acme", "FIXED_RATE|PT1H", start_at=START)
        await tm.run_due()
        assert job.slots == [("acme", t) for t in ran]
        history = await tm.client.history("reports")
        named = sorted(
            (h.task_instance, h.execution_time, h.error_class)
            for h in history
            if h.outcome == "missed"
        )
        assert named == [("acme", START + k * HOUR, "overlap") for k in missed]
        assert [(i, s, r) for _, i, s, r in seen.slots] == named
        assert seen.streaks == [("reports", "acme", len(missed))]
        info = await tm.client.get_schedule("reports", "acme")
        assert info is not None and info.next_time == START + 4 * HOUR
        assert info.runs == len(ran)


async def test_cancel_other_records_the_cancelled_run_and_counts_nothing_twice(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """The row is found two slots late: those slots are merged into the late run
    (``coalesced``), the run is stopped when the next slot comes due (``cancelled``), and that
    slot runs. Each slot has one record, and the stored count of missed slots is the number
    of ``missed`` records."""
    step = timedelta(seconds=2)
    row = await db_now(any_engine) - 2 * step - step / 20
    await put_row(any_engine, "stubborn-late", row)
    job, seen = Stubborn("stubborn-late", step=step), MissedSlots()
    registry = await any_registries.start(job, customize=lambda b: b.observer(seen))
    await asyncio.wait_for(job.second.wait(), 30)
    first, due = job.slots[0], job.slots[1]
    assert first.replace(microsecond=0) == row.replace(microsecond=0)
    late = round((due - first) / step) - 1  # the slots merged into the late run: 2 or more
    assert late >= 2 and due == first + (late + 1) * step

    async def written() -> list[tuple[datetime, str, str | None]]:
        history = await registry.client.history("stubborn-late", limit=100)
        return [(h.execution_time, h.outcome, h.error_class) for h in history]

    async def all_written() -> bool:
        outcomes = {o for _, o, _ in await written()}
        stored = (await registry.client.job_definitions()).get("stubborn-late")
        return {"cancelled", "missed"} <= outcomes and stored is not None and stored.missed > 0

    await wait_until(all_written, timeout=30, what="the cancelled run and the missed slots")
    await registry.scheduler.stop()  # nothing more runs: the records can be compared
    history = await written()
    cancelled = [t for t, o, _ in history if o == "cancelled"]
    assert [t.replace(microsecond=0) for t in cancelled] == [first.replace(microsecond=0)]
    missed = sorted((t, c) for t, o, c in history if o == "missed")
    merged = [first + k * step for k in range(1, late + 1)]
    assert [t for t, _ in missed[:late]] == merged, "the late slots, once each"
    # due before the run started (one due in the instant between its start and its timer's
    # arming would be an overlap: both are the run's, none is run)
    assert {c for _, c in missed[:late]} <= {"coalesced", "overlap"}
    assert missed[0][1] == "coalesced"
    by_slot: dict[datetime, list[str]] = {}
    for t, o, _ in history:
        by_slot.setdefault(t.replace(microsecond=0), []).append(o)
    assert by_slot[due.replace(microsecond=0)] == ["succeeded"], "the due slot ran once"
    assert all(len(o) == 1 for o in by_slot.values()), f"a slot recorded twice: {by_slot}"
    stored = (await registry.client.job_definitions())["stubborn-late"]
    assert stored.missed == len(missed), "counted as often as named"
    assert len(seen.slots) == len(missed)
