"""Every slot accounted for (issue 30, item 5): each slot of a recurring job that passes without
a run is named in the history with its reason (``missed``; ``record_missed_slots``), told to
``slot_missed``, and counted in the task's streak of consecutive missed slots (``/jobs``, the
Prometheus gauge), on every database. Downtime is simulated as in test_schedule_policies_db:
the recurring row is put N slots into the past of the database clock before a scheduler
starts."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    CatchUp,
    ConfigurationError,
    ExecutionContext,
    JobRegistry,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.catchup import MISSED_SLOTS_NAMED
from ekbatan_fastapi.store.tables import Tables

from .helpers import (
    CatchUpJob,
    MissedSlots,
    RecordingJob,
    RegistryFactory,
    db_now,
    downtime,
    wait_until,
)

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


async def _history(engine: AsyncEngine, name: str) -> list[tuple[str, datetime, str | None, str]]:
    h = Tables().history
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(h.c.outcome, h.c.execution_time, h.c.error_class, h.c.error_message)
            .where(h.c.task_name == name)
            .order_by(h.c.execution_time, h.c.id)
        )
        return [(r[0], _utc(r[1]), r[2], r[3] or "") for r in rows]


async def _missed(engine: AsyncEngine, name: str, count: int) -> list[tuple[datetime, str, str]]:
    async def written() -> bool:
        return len([r for r in await _history(engine, name) if r[0] == "missed"]) >= count

    await wait_until(written, what=f"{count} missed records of {name}")
    return [(t, c or "", m) for o, t, c, m in await _history(engine, name) if o == "missed"]


async def _streak(registry: JobRegistry, name: str) -> int:
    from ekbatan_fastapi.client.read_model import ReadModel

    assert registry.scheduler is not None
    page = await ReadModel.of(registry.client, registry.scheduler).tasks(name)
    return page.tasks[0].consecutive_missed_slots if page.tasks else -1


async def test_slots_merged_by_catch_up_latest_are_named_with_their_reason(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    from ekbatan_fastapi.metrics import EkbatanMetrics

    row = await downtime(any_engine, "nightly", 5)
    seen, metrics = MissedSlots(), EkbatanMetrics()
    job = CatchUpJob("nightly", Schedules.fixed_rate(HOUR))
    registry = await any_registries.start(
        job, customize=lambda b: b.observer(seen).observer(metrics)
    )
    missed = await _missed(any_engine, "nightly", 5)
    assert job.slots == [row], "db-scheduler's behaviour: one run, of the overdue slot"
    assert [t for t, _, _ in missed] == [row + k * HOUR for k in range(1, 6)]
    assert {c for _, c, _ in missed} == {"coalesced"}
    assert all("merged into the run of" in m and "CatchUp.latest" in m for _, _, m in missed)
    await wait_until(lambda: len(seen.slots) == 5, what="five slot_missed events")
    assert [(n, i, r) for n, i, _, r in seen.slots] == [("nightly", "recurring", "coalesced")] * 5
    assert seen.streaks == [("nightly", "recurring", 5)]

    async def streak_shown() -> bool:
        return await _streak(registry, "nightly") == 5

    await wait_until(streak_shown, what="/jobs shows the streak of 5")
    body = metrics.render()[0].decode()
    assert 'ekbatan_consecutive_missed_slots{task="nightly"} 5.0' in body
    assert 'ekbatan_missed_slots_total{reason="coalesced",task="nightly"} 5.0' in body
    history = await registry.client.history("nightly")
    assert sum(r.outcome == "missed" for r in history) == 5


async def test_a_slot_that_runs_ends_the_streak(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    from ekbatan_fastapi.metrics import EkbatanMetrics

    await downtime(any_engine, "often", 3, step=timedelta(seconds=1))
    metrics = EkbatanMetrics()
    job = CatchUpJob("often", Schedules.fixed_rate(timedelta(seconds=1)))
    registry = await any_registries.start(job, customize=lambda b: b.observer(metrics))
    await _missed(any_engine, "often", 3)
    await wait_until(lambda: len(job.slots) >= 3, what="two more runs on time")

    async def over() -> bool:
        return await _streak(registry, "often") == 0

    await wait_until(over, what="/jobs shows the streak over")
    body = metrics.render()[0].decode()
    assert 'ekbatan_consecutive_missed_slots{task="often"} 0.0' in body


async def test_slots_passed_while_a_run_was_going_are_named_overlap(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    step = timedelta(milliseconds=100)
    release = asyncio.Event()
    job = CatchUpJob("long", Schedules.fixed_rate(step), block=release)
    await any_registries.start(job)
    await job.started.wait()
    begun = await db_now(any_engine)

    async def passed() -> bool:
        return await db_now(any_engine) > begun + 4 * step

    await wait_until(passed, what="four slots to pass during the run")
    release.set()
    missed = await _missed(any_engine, "long", 3)
    overlap = [(t, m) for t, c, m in missed if c == "overlap"]
    assert len(overlap) >= 3, "due while the run was going (earlier ones: before it started)"
    assert all("was going (Overlap.skip)" in m for _, m in overlap)
    assert [c for _, c, _ in missed] == sorted(c for _, c, _ in missed), "coalesced first"


async def test_at_most_the_newest_hundred_are_named_and_one_record_counts_the_rest(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "minutely", 150, step=MINUTE)
    seen = MissedSlots()
    job = CatchUpJob("minutely", Schedules.fixed_rate(MINUTE))
    await any_registries.start(job, customize=lambda b: b.observer(seen))
    missed = await _missed(any_engine, "minutely", MISSED_SLOTS_NAMED + 1)
    assert len(missed) == MISSED_SLOTS_NAMED + 1
    summary = missed[0]
    assert summary[0] == row + MINUTE and summary[2].startswith("50 slots ")
    named = [t for t, _, m in missed[1:]]
    assert named == [row + k * MINUTE for k in range(51, 151)], "the newest 100, by name"
    await wait_until(lambda: len(seen.slots) == MISSED_SLOTS_NAMED, what="100 events")


async def test_catch_up_skip_names_each_skipped_slot_and_the_streak_adds_up(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "billing", 5)
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.skip(timedelta(seconds=10)))
    registry = await any_registries.start(job)
    missed = await _missed(any_engine, "billing", 6)
    assert job.slots == []
    assert [t for t, _, _ in missed] == [row + k * HOUR for k in range(6)]
    assert {c for _, c, _ in missed} == {"catch_up"}
    assert "CatchUp.skip(grace=PT10S)" in missed[0][2]

    async def shown() -> bool:
        return await _streak(registry, "billing") == 6

    await wait_until(shown, what="/jobs shows six missed in a row")


@pytest.mark.parametrize("how", ["job", "setting"])
async def test_recording_can_be_turned_off_per_job_or_by_the_setting(
    any_registries: RegistryFactory, any_engine: AsyncEngine, how: str
) -> None:
    await downtime(any_engine, "quiet", 3)
    seen = MissedSlots()
    job = CatchUpJob("quiet", Schedules.fixed_rate(HOUR), record=False if how == "job" else None)

    def customize(b: Any) -> None:
        b.observer(seen)
        if how == "setting":
            b.record_missed_slots(False)

    registry = await any_registries.start(job, customize=customize)
    stored = await registry.client.job_definitions()

    async def counted() -> bool:
        stored = (await registry.client.job_definitions()).get("quiet")
        return stored is not None and stored.missed == 3

    await wait_until(counted, what="the three merged slots counted")
    del stored

    async def written() -> bool:  # the history is written off the hot path (not PostgreSQL)
        assert registry.scheduler is not None
        return bool(await _history(any_engine, "quiet")) and not registry.scheduler.recorder.pending

    await wait_until(written, what="the history written")
    assert [o for o, *_ in await _history(any_engine, "quiet")] == ["succeeded"]
    assert seen.slots == []
    assert seen.streaks == [("quiet", "recurring", 3)], "the streak is kept all the same"


async def test_a_job_that_turns_it_on_overrides_the_setting(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    await downtime(any_engine, "loud", 2)
    job = CatchUpJob("loud", Schedules.fixed_rate(HOUR), record=True)
    await any_registries.start(job, customize=lambda b: b.record_missed_slots(False))
    assert len(await _missed(any_engine, "loud", 2)) == 2


async def test_bad_record_missed_slots_names_the_value_and_the_fix(
    registries: RegistryFactory,
) -> None:
    job = CatchUpJob("bad", Schedules.fixed_rate(HOUR), record="yes")
    with pytest.raises(ConfigurationError, match=r"record_missed_slots\(\) must return True"):
        await registries.start(job)


async def test_persistent_schedules_record_their_missed_slots(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    from ekbatan_fastapi import PersistentScheduleJob

    ran: list[datetime] = []

    class Reports(PersistentScheduleJob):
        def name(self) -> str:
            return "reports"

        async def execute(self, ctx: ExecutionContext) -> None:
            ran.append(ctx.execution_time)

    job = Reports()
    registry = await any_registries.start(job)
    now = await db_now(any_engine)
    start = now.replace(minute=0, second=0, microsecond=0) - 4 * HOUR
    await registry.client.create_schedule("reports", "acme", Schedules.cron("0 * * * *"))
    t = scheduled_tasks
    async with any_engine.begin() as conn:  # its instances were down for four hours
        await conn.execute(
            update(t)
            .where(t.c.task_name == "reports", t.c.task_instance == "acme")
            .values(execution_time=start)
        )
    missed = await _missed(any_engine, "reports", 1)
    assert {c for _, c, _ in missed} == {"coalesced"}
    assert ran == [start]
    assert [t for t, _, _ in missed][:3] == [start + k * HOUR for k in range(1, 4)]


# -- deterministic, under the TimeMachine --------------------------------------------------------

DAY_START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
TWO_AM = datetime(2026, 3, 11, 2, 0, tzinfo=UTC)


async def test_time_machine_answers_why_two_am_did_not_run(any_database: Any) -> None:
    from datetime import time

    from ekbatan_fastapi.client.read_model import ReadModel
    from ekbatan_fastapi.testing import TimeMachine

    job = CatchUpJob("nightly", Schedules.daily(time(2, 0)))
    seen = MissedSlots()
    async with TimeMachine(
        [job],
        any_database.url,
        start=DAY_START,
        dialect=any_database.override,
        customize=lambda b: b.observer(seen),
    ) as tm:
        await tm.advance(to=TWO_AM + timedelta(days=3, hours=1))  # down for three nights
        ran = await tm.run_due()
        assert [r.execution_time for r in ran] == [TWO_AM]
        history = await tm.client.history("nightly")
        missed = sorted((h.execution_time, h.error_class) for h in history if h.outcome == "missed")
        assert missed == [(TWO_AM + timedelta(days=d), "coalesced") for d in (1, 2, 3)]
        assert [(s, r) for _, _, s, r in seen.slots] == missed
        scheduler = tm.registry.scheduler
        page = await ReadModel.of(tm.client, scheduler).tasks("nightly")
        assert page.tasks[0].consecutive_missed_slots == 3
        await tm.advance(to=TWO_AM + timedelta(days=4))  # the next night runs
        assert [r.execution_time for r in await tm.run_due()] == [TWO_AM + timedelta(days=4)]
        page = await ReadModel.of(tm.client, scheduler).tasks("nightly")
        assert page.tasks[0].consecutive_missed_slots == 0, "a run ends the streak"
        history = await tm.client.history("nightly")
        assert sum(h.outcome == "missed" for h in history) == 3, "nothing more was missed"


# -- the pieces, without a database --------------------------------------------------------------


def test_after_run_splits_late_slots_from_those_due_during_the_run() -> None:
    from ekbatan_fastapi.domain.catchup import SlotReason, after_run

    hourly = Schedules.fixed_rate(HOUR)
    slot = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
    started = slot + 2 * HOUR + MINUTE  # 01:00 and 02:00 were due before the run started
    finished = slot + 5 * HOUR + MINUTE  # 03:00 to 05:00 came due during it
    after = after_run(hourly, CatchUp.latest(), slot, slot, finished, started=started)
    assert after.next_time == slot + 6 * HOUR
    assert [(s.first, s.last, s.count, s.reason) for s in after.passed] == [
        (slot + HOUR, slot + 2 * HOUR, 2, SlotReason.COALESCED),
        (slot + 3 * HOUR, slot + 5 * HOUR, 3, SlotReason.OVERLAP),
    ]
    # a slot due exactly as the run started was due before it: coalesced, not overlapped
    exact = after_run(hourly, CatchUp.latest(), slot, slot, finished, started=slot + 2 * HOUR)
    assert [s.reason for s in exact.passed] == [SlotReason.COALESCED, SlotReason.OVERLAP]
    assert exact.passed[0].last == slot + 2 * HOUR
    calm = after_run(hourly, CatchUp.latest(), slot, slot, slot + MINUTE, started=slot)
    assert calm.passed == (), "nothing merged"
    delay = after_run(
        Schedules.fixed_delay(HOUR), CatchUp.latest(), slot, slot, finished, started=started
    )
    assert delay.passed == (), "no grid"


def test_missed_records_name_the_newest_and_count_the_rest() -> None:
    from ekbatan_fastapi.domain.catchup import PassedSlots, SlotReason
    from ekbatan_fastapi.domain.context import HeartbeatState
    from ekbatan_fastapi.domain.rows import TaskRow
    from ekbatan_fastapi.engine.execution import Execution
    from ekbatan_fastapi.engine.slots import missed_records

    first = datetime(2026, 12, 1, tzinfo=UTC)
    row = TaskRow("often", "recurring", None, first, True, "me", None, None, 0, None, 1, 0)
    heartbeat = HeartbeatState(MINUTE, HOUR)
    job = CatchUpJob("often", Schedules.fixed_rate(MINUTE))
    execution = Execution(row, job, heartbeat, first, Schedules.fixed_rate(MINUTE))
    spans = [
        PassedSlots(first + MINUTE, first + 10 * MINUTE, 10, SlotReason.COALESCED, why="late"),
        PassedSlots(first + 11 * MINUTE, first + 13 * MINUTE, 3, SlotReason.OVERLAP, why="run"),
    ]
    records, named = missed_records(execution, spans, cap=5)
    assert [(r.execution_time - first) // MINUTE for r in records] == [1, 9, 10, 11, 12, 13]
    assert records[0].error_message is not None
    assert records[0].error_message.startswith("8 slots ")  # 1..8 counted, not named
    assert [reason for _, reason in named] == ["coalesced"] * 2 + ["overlap"] * 3
    assert all(r.outcome == "missed" for r in records)


def test_the_tracing_observer_makes_a_span_per_missed_slot() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ekbatan_fastapi.otel import EkbatanTracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    slot = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    EkbatanTracing(provider).slot_missed("nightly", "recurring", slot, "coalesced")
    (span,) = exporter.get_finished_spans()
    assert span.name == "missed nightly"
    assert span.attributes is not None
    assert span.attributes["ekbatan.slot"] == slot.isoformat()
    assert span.attributes["ekbatan.reason"] == "coalesced"


async def test_streaks_of_tasks_that_are_gone_are_pruned(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """A schedule deleted (or ended) leaves its streak row: the maintenance round deletes it,
    and keeps the streaks of the rows that still exist (``ekbatan_missed_streaks`` would
    otherwise grow by one row per schedule ever created that missed a slot)."""
    job = RecordingJob("hourly", Schedules.cron("0 * * * *"))
    registry = await any_registries.start(job)  # its recurring row is written
    streaks = Tables().streaks
    now = await db_now(any_engine)
    async with any_engine.begin() as conn:
        for instance in ("recurring", "gone-schedule"):
            await conn.execute(
                insert(streaks).values(
                    task_name="hourly",
                    task_instance=instance,
                    missed=3,
                    next_time=now,
                    updated_at=now,
                )
            )
    # (the first maintenance round, running meanwhile, may have pruned it already)
    assert await registry.store.jobs.prune_streaks() in (0, 1)
    async with any_engine.connect() as conn:
        left = (await conn.execute(select(streaks.c.task_instance))).scalars().all()
    assert left == ["recurring"]
    assert await registry.store.jobs.prune_streaks() == 0
    # the maintenance round (the leader's, under the cluster lock) runs it
    assert registry.scheduler.maintenance.jobs is registry.store.jobs


def test_the_streaks_kept_in_memory_are_bounded() -> None:
    """``SlotCounter.known`` (the running totals it tells ``missed_streak``) holds one entry
    per task instance that missed a slot: schedules created and deleted for days must not
    grow it without bound."""
    from types import SimpleNamespace

    from ekbatan_fastapi.domain.catchup import PassedSlots, SlotReason
    from ekbatan_fastapi.domain.context import HeartbeatState
    from ekbatan_fastapi.domain.rows import Finish, FinishKind, Owned, TaskRow
    from ekbatan_fastapi.engine import slots
    from ekbatan_fastapi.engine.execution import Execution

    first = datetime(2026, 12, 1, tzinfo=UTC)
    schedule = Schedules.fixed_rate(MINUTE)
    job = CatchUpJob("often", schedule)
    observer = SimpleNamespace(wants=frozenset())
    counter = slots.SlotCounter(None, None, observer)  # type: ignore[arg-type]
    span = PassedSlots(first + MINUTE, first + MINUTE, 1, SlotReason.OVERLAP, why="run")
    for k in range(slots._MAX_PENDING + 5):
        row = TaskRow("often", f"s{k}", None, first, True, "me", None, None, 0, None, 1, 0)
        execution = Execution(row, job, HeartbeatState(MINUTE, HOUR), first, schedule)
        finish = Finish(Owned("often", f"s{k}", 1), FinishKind.SUCCEEDED, first + 2 * MINUTE)
        counter._passed(execution, finish, [span])
    assert len(counter.known) <= slots._MAX_PENDING
    assert len(counter.streaks) <= slots._MAX_PENDING
