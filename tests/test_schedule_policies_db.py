"""Schedule policies on every database: catch-up after downtime, jitter, backfill, rolling
deploys (separate OS processes with different schedules and versions).

Downtime is simulated the way the database sees it: while no instance runs, the recurring row
is moved N slots into the past of the database clock (the same as the clock moving N slots
past the row), then the scheduler starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    CatchUp,
    ExecutionContext,
    JobRegistry,
    OneTimeJob,
    Schedule,
    Schedules,
    TaskPausedError,
    scheduled_tasks,
)
from ekbatan_fastapi.store.tables import Tables

from .conftest import Database
from .helpers import (
    CatchUpJob,
    Polls,
    RecordingJob,
    RegistryFactory,
    Worker,
    db_now,
    downtime,
    wait_until,
)
from .plan_jobs import A, B, rolling_row

HOUR = timedelta(hours=1)


async def _row_time(engine: AsyncEngine, name: str, instance: str = "recurring") -> datetime:
    t = scheduled_tasks
    async with engine.connect() as conn:
        value = (
            await conn.execute(
                select(t.c.execution_time).where(
                    t.c.task_name == name, t.c.task_instance == instance
                )
            )
        ).scalar_one()
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def _history(engine: AsyncEngine, name: str) -> list[tuple[str, datetime, str | None]]:
    h = Tables().history
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(h.c.outcome, h.c.execution_time, h.c.error_message)
            .where(h.c.task_name == name)
            .order_by(h.c.execution_time, h.c.id)
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def _history_of(
    engine: AsyncEngine, name: str, count: int
) -> list[tuple[str, datetime, str | None]]:
    """The history of ``name`` once it holds ``count`` records (written off the hot path)."""

    async def written() -> bool:
        return len(await _history(engine, name)) >= count

    await wait_until(written, what=f"{count} history records of {name}")
    return await _history(engine, name)


async def _counts(registry: JobRegistry, name: str) -> tuple[int, int, int]:
    stored = (await registry.client.job_definitions()).get(name)
    return (0, 0, 0) if stored is None else (stored.missed, stored.caught_up, stored.skipped)


@pytest.mark.parametrize(
    "schedule",
    [Schedules.fixed_rate(HOUR), None],
    ids=["fixed-rate", "cron"],
)
async def test_catch_up_all_runs_every_missed_slot_once_oldest_first_across_two_instances(
    any_registries: RegistryFactory, any_engine: AsyncEngine, schedule: Schedule | None
) -> None:
    row = await downtime(any_engine, "billing", 5, whole_minute=schedule is None)
    if schedule is None:  # an hourly cron whose slots fall where the row is
        schedule = Schedules.cron(f"{row.minute} * * * *")
    jobs = [CatchUpJob("billing", schedule, CatchUp.all(max_slots=10)) for _ in range(2)]
    registries = [await any_registries.start(job) for job in jobs]
    expected = [row + k * HOUR for k in range(6)]

    async def caught_up() -> bool:
        return await _row_time(any_engine, "billing") == row + 6 * HOUR

    await wait_until(caught_up, what="the six missed slots run")
    await wait_until(lambda: not any(r.scheduler.running for r in registries), what="recorded")
    ran = sorted(jobs[0].slots + jobs[1].slots)
    assert ran == expected, "each missed slot once, with its own ctx.execution_time"
    for job in jobs:
        assert job.slots == sorted(job.slots), "oldest first"
    await wait_until(lambda: _counted(registries[0], "billing", (0, 5, 0)), what="counted")
    outcomes = [o for o, _, _ in await _history_of(any_engine, "billing", 6)]
    assert outcomes == ["succeeded"] * 6


async def _counted(registry: JobRegistry, name: str, expected: tuple[int, int, int]) -> bool:
    return await _counts(registry, name) == expected


async def test_catch_up_all_beyond_max_slots_skips_the_oldest_and_records_them(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "billing", 5)
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.all(max_slots=3))
    registry = await any_registries.start(job)
    await wait_until(lambda: len(job.slots) == 3, what="the newest three slots")
    assert job.slots == [row + 3 * HOUR, row + 4 * HOUR, row + 5 * HOUR]
    await wait_until(lambda: _counted(registry, "billing", (0, 2, 3)), what="counted")
    history = await _history_of(any_engine, "billing", 7)  # 3 runs, 1 decision, 3 named
    assert [o for o, _, _ in history].count("missed") == 3
    skipped = [(t, m) for o, t, m in history if o == "skipped"]
    assert len(skipped) == 1 and _same(skipped[0][0], row)
    assert skipped[0][1] is not None and "skipped 3 slots" in skipped[0][1]
    assert "CatchUp.all(max_slots=3)" in skipped[0][1]
    assert [o for o, _, _ in history].count("succeeded") == 3


async def test_catch_up_latest_runs_once_and_counts_the_coalesced_slots(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "billing", 5)
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.latest())
    registry = await any_registries.start(job)
    await wait_until(lambda: _counted(registry, "billing", (5, 0, 0)), what="counted")
    assert job.slots == [row], "db-scheduler's behaviour: one run, of the overdue slot"
    assert await _row_time(any_engine, "billing") == row + 6 * HOUR
    history = await _history_of(any_engine, "billing", 6)
    assert [o for o, _, _ in history if o != "missed"] == ["succeeded"]
    # each coalesced slot is named (record_missed_slots, on by default: test_missed_slots.py)
    named = [t for o, t, _ in history if o == "missed"]
    assert len(named) == 5
    assert all(_same(t, row + k * HOUR) for k, t in enumerate(named, 1))


async def test_catch_up_skip_runs_the_slot_within_grace_and_skips_the_rest(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "billing", 5)
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.skip(timedelta(minutes=5)))
    registry = await any_registries.start(job)
    await wait_until(lambda: _counted(registry, "billing", (0, 0, 5)), what="counted")
    assert job.slots == [row + 5 * HOUR]
    outcomes = [o for o, _, _ in await _history_of(any_engine, "billing", 7)]
    assert sorted(o for o in outcomes if o != "missed") == ["skipped", "succeeded"]
    assert outcomes.count("missed") == 5, "each skipped slot named too"


async def test_catch_up_skip_past_grace_runs_nothing_and_schedules_the_next_slot(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    row = await downtime(any_engine, "billing", 5)
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.skip(timedelta(seconds=10)))
    registry = await any_registries.start(job)
    await wait_until(lambda: _counted(registry, "billing", (0, 0, 6)), what="counted")
    assert job.slots == []
    assert await _row_time(any_engine, "billing") == row + 6 * HOUR
    stored = await registry.client.get("billing", "recurring")
    assert stored is not None and stored.consecutive_failures in (None, 0)
    assert stored.last_success is None, "a skip is not a run: the counters stay"
    history = await _history_of(any_engine, "billing", 7)
    decided = [(o, m is not None and "found later than the grace" in m) for o, _, m in history]
    assert [d for d in decided if d[0] != "missed"] == [("skipped", True)]
    assert [o for o, _, _ in history].count("missed") == 6, "each skipped slot named too"


async def test_slot_counts_show_on_jobs_and_in_metrics(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    from ekbatan_fastapi.metrics import EkbatanMetrics

    await downtime(any_engine, "billing", 5)
    metrics = EkbatanMetrics()
    job = CatchUpJob("billing", Schedules.fixed_rate(HOUR), CatchUp.skip(timedelta(minutes=5)))
    registry = await any_registries.start(job, customize=lambda b: b.observer(metrics))
    await wait_until(lambda: _counted(registry, "billing", (0, 0, 5)), what="counted")
    body = metrics.render()[0].decode()
    assert 'ekbatan_slots_total{decision="skipped",task="billing"} 5.0' in body


def _same(a: datetime, b: datetime) -> bool:
    return abs((a.replace(tzinfo=None) - b.replace(tzinfo=None)).total_seconds()) < 1e-6


# -- jitter --------------------------------------------------------------------------------------


async def test_jittered_slots_run_after_their_offset_with_the_nominal_execution_time(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    schedule = Schedules.cron("* * * * * *", seconds=True).with_jitter(timedelta(milliseconds=400))
    job = RecordingJob("jittered", schedule)
    registry = await any_registries.start(job)
    await wait_until(lambda: len(job.slots) >= 3, what="three jittered runs")
    await registry.stop()
    bound = schedule.bind("jittered")
    for ctx in job.contexts:
        assert ctx.execution_time.microsecond == 0, "ctx.execution_time is the nominal slot"
    row_time = await _row_time(any_engine, "jittered")
    slot = bound.slot_of(row_time)
    assert slot.microsecond == 0 and row_time == bound.due_time(slot)


# -- backfill ------------------------------------------------------------------------------------


async def test_backfill_runs_each_slot_once_on_whichever_instance_claims_it(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    hourly = Schedules.cron("0 * * * *")
    jobs = [RecordingJob("billing", hourly) for _ in range(2)]
    registries = [await any_registries.start(job) for job in jobs]
    now = await db_now(any_engine)
    start = now.replace(minute=30, second=0, microsecond=0) - 4 * HOUR
    result = await registries[0].client.backfill("billing", start, start + 3 * HOUR)
    assert result.inserted == 3 and len(result.slots) == 3
    again = await registries[1].client.backfill("billing", start, start + 3 * HOUR)
    assert again.inserted in (0, 1, 2, 3)  # rows already run and deleted may be asked again
    await wait_until(lambda: len(jobs[0].slots) + len(jobs[1].slots) >= 3, what="three runs")

    async def drained() -> bool:
        return not await registries[0].client.backfill_counts()

    await wait_until(drained, what="the backfill rows deleted once they ran")
    contexts = jobs[0].contexts + jobs[1].contexts
    first_runs = {ctx.execution_time for ctx in contexts}
    assert first_runs == set(result.slots)
    for ctx in contexts:
        assert ctx.is_backfill and ctx.task_instance.startswith("backfill:")
        assert ctx.idempotency_key == ("billing", "recurring", ctx.execution_time)
    row = await registries[0].client.get("billing", "recurring")
    assert row is not None and row.execution_time > now, "the recurring row is untouched"


async def test_backfill_of_a_paused_job_is_refused_unless_forced_and_waits_for_resume(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = RecordingJob("billing", Schedules.cron("0 * * * *"))
    polls = Polls()
    registry = await any_registries.start(job, customize=lambda b: b.observer(polls))
    client = registry.client
    await client.pause("billing", reason="migration")
    now = await db_now(any_engine)
    start = now.replace(minute=0, second=0, microsecond=0) - 2 * HOUR
    with pytest.raises(TaskPausedError, match="force=True"):
        await client.backfill("billing", start, start + 2 * HOUR)
    forced = await client.backfill("billing", start, start + 2 * HOUR, force=True)
    assert forced.inserted == 2
    assert (await client.backfill_counts()) == {"billing": 2}
    views = {v.name: v for v in await _views(registry)}
    assert views["billing"].backfill_pending == 2, "visible on /jobs while it waits"
    assert await polls.next(2) == 0, "paused: the backfill waits"
    assert job.slots == []
    await client.resume("billing")
    await wait_until(lambda: len(job.slots) == 2, what="the backfill after resume")


async def test_a_failed_backfilled_slot_is_retried_later_not_lost(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = RecordingJob("billing", Schedules.cron("0 * * * *"), fail=True)
    registry = await any_registries.start(job)
    now = await db_now(any_engine)
    start = now.replace(minute=0, second=0, microsecond=0) - HOUR
    result = await registry.client.backfill("billing", start, start + HOUR)
    await wait_until(lambda: len(job.slots) == 1, what="the failing run")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    instance = f"backfill:{result.slots[0].isoformat(timespec='microseconds')}"
    row = await registry.client.get("billing", instance)
    assert row is not None and row.consecutive_failures == 1 and row.execution_time > now


class _Once(OneTimeJob):
    def name(self) -> str:
        return "once"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


async def test_backfill_names_what_it_needs(any_registries: RegistryFactory) -> None:
    from ekbatan_fastapi import ScheduleError, UnknownJobError

    registry = await any_registries.start(
        _Once(), RecordingJob("delay", Schedules.fixed_delay(HOUR))
    )
    now = datetime.now().astimezone()
    with pytest.raises(UnknownJobError, match="one-time job"):
        await registry.client.backfill("once", now - HOUR, now)
    with pytest.raises(UnknownJobError, match="no recurring job named 'nope'"):
        await registry.client.backfill("nope", now - HOUR, now)
    with pytest.raises(ScheduleError, match="no fixed slots"):
        await registry.client.backfill("delay", now - HOUR, now)


# -- rolling deploys -----------------------------------------------------------------------------


async def _run_once(database: Database, version: str, schedule: str) -> None:
    args = ["--schedule", schedule, "--app-version", version]
    if database.override:
        args += ["--dialect", database.override]
    worker = await Worker.start("rollout", database.url, *args)
    assert await worker.stop() == 0


@pytest.mark.multiprocess
async def test_processes_of_two_versions_started_alternately_move_the_row_once(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    await _run_once(any_database, "1.9", A)
    first_time, first_version = await rolling_row(any_engine)
    await _run_once(any_database, "1.10", B)  # the newer version: applies B once
    moved_time, moved_version = await rolling_row(any_engine)
    assert moved_version == first_version + 1 and moved_time != first_time
    for version, schedule in [("1.9", A), ("1.10", B), ("1.9", A)]:
        await _run_once(any_database, version, schedule)
        assert await rolling_row(any_engine) == (moved_time, moved_version), "never moved back"
    async with any_engine.connect() as conn:
        stored = (
            await conn.execute(
                text("SELECT schedule, app_version FROM ekbatan_jobs WHERE task_name = 'rolling'")
            )
        ).one()
    assert tuple(stored) == (B, "1.10")


class _Rolling(RecordingJob):
    def __init__(self, schedule: str) -> None:
        super().__init__("rolling", Schedules.parse_schedule(schedule))


async def test_an_older_instance_runs_by_the_newer_schedule_and_follows_a_later_deploy(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    newer = await any_registries.start(
        _Rolling("FIXED_RATE|PT1H"), customize=lambda b: b.app_version("2")
    )
    older_job = _Rolling("FIXED_RATE|PT0.2S")
    older = await any_registries.start(older_job, customize=lambda b: b.app_version("1"))
    assert older.scheduler.schedules["rolling"].describe() == "FIXED_RATE|PT1H"
    await newer.stop()
    await older.client.run_now("rolling")
    # At least one run: on a loaded machine the older instance may also have run the first slot
    # before the newer one claimed it (it is due at the start), and that run's slot and
    # run_now's can both be recorded before this wait first looks (seen once, under load).
    await wait_until(lambda: len(older_job.slots) >= 1, what="the older instance's run")
    await wait_until(lambda: not older.scheduler.running, what="recorded")
    row_time, _ = await rolling_row(any_engine)
    naive_now = (await db_now(any_engine)).replace(tzinfo=None)
    assert row_time.replace(tzinfo=None) > naive_now + timedelta(minutes=30), (
        "its next time came from the newer version's schedule, not its own 0.2 s"
    )
    latest = await any_registries.start(
        _Rolling("FIXED_RATE|PT2H"), customize=lambda b: b.app_version("3")
    )
    await wait_until(
        lambda: older.scheduler.schedules["rolling"].describe() == "FIXED_RATE|PT2H",
        what="the older instance follows the later deploy",
    )
    assert latest.scheduler.schedules["rolling"].describe() == "FIXED_RATE|PT2H"
    jobs = {v.name: v for v in await _views(older)}
    assert jobs["rolling"].own_schedule == "FIXED_RATE|PT0.2S"


async def _views(registry: JobRegistry) -> list[Any]:
    from ekbatan_fastapi.client.read_model import ReadModel

    return list(await ReadModel.of(registry.client, registry.scheduler).job_views())


async def test_one_version_two_schedules_keeps_the_stored_one_and_warns(
    any_registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    await any_registries.start(_Rolling(A), customize=lambda b: b.app_version("5"))
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        second = await any_registries.start(_Rolling(B), customize=lambda b: b.app_version("5"))
    assert second.scheduler.schedules["rolling"].describe() == A
    assert any("two instances of version 5 disagree" in r.getMessage() for r in caplog.records)


async def _alone(registry: Any) -> Any:
    """The scheduler's definitions, with the housekeeper's periodic re-read detached and one
    in flight finished: the test's own re-reads are the only ones."""
    scheduler = registry.scheduler
    scheduler.housekeeper.refresh_definitions = None
    running = scheduler.definitions._refreshing
    if running is not None:
        await running
    return scheduler.definitions


def _reads_of(store: Any) -> list[list[str]]:
    """The names each ``store.definitions`` call from now on returns, one list per call."""
    read: list[list[str]] = []
    original = store.definitions

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        found = await original(*args, **kwargs)
        read.append(sorted(found))
        return found

    store.definitions = recorded
    return read


async def test_a_re_read_of_the_definitions_does_not_read_an_unchanged_deploy_again(
    any_registries: RegistryFactory,
) -> None:
    """Definitions written together (all of a deploy's, at startup) are not read back: the
    instance's own are left out of its re-reads, and each later re-read starts from when the
    previous one began (less the overlap), not from the newest definition, which would read
    the whole deploy at every recurring completion."""
    yearly = Schedules.cron("0 0 1 1 *")
    registry = await any_registries.start(*(RecordingJob(f"deploy-{i}", yearly) for i in range(30)))
    definitions = await _alone(registry)
    read = _reads_of(definitions.store)
    later = registry.scheduler.link.now() + timedelta(seconds=10)
    definitions._now = lambda: later  # the database's clock, 10 s on
    await definitions.refresh()
    await definitions.refresh()
    assert read == [[], []]


async def test_a_re_read_leaves_out_only_what_this_instance_wrote_at_startup(
    any_registries: RegistryFactory,
) -> None:
    """What another instance wrote is read, whenever it was written; so is what an instance of
    the same name (a misconfigured fleet) wrote, after this one's startup or during it (a
    stamp that is not one of this instance's own)."""
    yearly = Schedules.cron("0 0 1 1 *")
    registry = await any_registries.start(*(RecordingJob(f"mine-{i}", yearly) for i in range(5)))
    definitions = await _alone(registry)
    store = definitions.store
    ours = definitions.ours()
    peer = dataclasses.replace(ours["mine-1"], written_by="another-instance")
    await store.write([peer])
    same_name_later = dataclasses.replace(ours["mine-2"], written_by=definitions.name)
    await asyncio.sleep(0.01)  # the database's clock moves past this instance's startup
    await store.write([same_name_later])
    (own_stamp,) = definitions._stamps
    j = store.table
    async with registry.engine.begin() as conn:  # as if written during this one's startup
        await conn.execute(
            update(j)
            .where(j.c.task_name == "mine-3")
            .values(written_at=own_stamp - timedelta(milliseconds=1))
        )
    read = _reads_of(store)
    await definitions.refresh()
    assert read == [["mine-1", "mine-2", "mine-3"]]


async def test_a_failing_look_for_a_newer_schedule_still_records_the_run(
    any_registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The re-read before a recurring run is recorded fails (not a database error, which it
    handles itself): the run is recorded by the schedule it had, and the error is logged."""
    job = RecordingJob("steady", Schedules.fixed_delay(timedelta(milliseconds=100)))
    registry = await any_registries.start(job)

    async def broken(max_age: float = 0.0) -> None:
        raise RuntimeError("definitions broke")

    registry.scheduler.definitions.refresh = broken  # type: ignore[method-assign]
    # a re-read is due before each recording (the housekeeper's own re-reads, which would
    # put it off by a second, leave it due)
    definitions = registry.scheduler.definitions
    definitions._mark_refreshed = lambda at: None  # type: ignore[method-assign]
    definitions.fresh_until = 0.0
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await wait_until(lambda: len(job.slots) >= 3, what="runs recorded and run again")
    assert "could not look for a newer stored schedule of steady/recurring" in caplog.text
