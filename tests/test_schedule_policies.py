"""Schedule policies, pure parts: jitter, catch-up plans, backfill windows, rolling-deploy
decisions. (The database parts are in test_schedule_policies_db.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest

from ekbatan_fastapi import (
    CatchUp,
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    Schedule,
    ScheduleError,
    Schedules,
    job_registry,
    parse_schedule,
)
from ekbatan_fastapi.domain.backfill import backfill_instance, backfill_slot, backfill_slots
from ekbatan_fastapi.domain.catchup import next_after_run, plan
from ekbatan_fastapi.domain.rollout import compare_versions, decide
from ekbatan_fastapi.domain.rows import JobDefinition

NOW = datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
HOUR = timedelta(hours=1)


# -- jitter --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base",
    [
        Schedules.cron("0 * * * *", zone="Europe/Berlin"),
        Schedules.daily(time(2, 30), zone="America/New_York"),
        Schedules.fixed_rate(timedelta(minutes=1)),
        Schedules.cron("*/2 * * * * *", seconds=True),
    ],
    ids=["cron", "daily", "fixed-rate", "cron-seconds"],
)
def test_jitter_is_deterministic_bounded_and_keeps_the_nominal_slot(base: Schedule) -> None:
    jitter = timedelta(seconds=30)
    schedule = base.with_jitter(jitter).bind("billing")
    other = base.with_jitter(jitter).bind("reports")
    due = schedule.initial_execution_time(NOW)
    offsets = set()
    for _ in range(50):
        slot = schedule.slot_of(due)
        following = schedule.following(slot)
        assert following is not None
        offset = due - slot
        assert timedelta(0) <= offset <= jitter
        assert due < following, "jitter never moves a slot past the next one"
        assert schedule.due_time(slot) == due, "the same offset every time (a revived run too)"
        assert base.bind("x").slot_at_or_before(slot) in (slot, None)
        offsets.add(offset)
        assert other.due_time(slot) != due or offset == timedelta(0)
        due = schedule.next_execution_time(due, due)
    assert len(offsets) > 40, "offsets vary from slot to slot"


def test_jitter_round_trips_through_its_string_form_and_changes_the_fingerprint() -> None:
    schedule = Schedules.cron("0 * * * *", zone="Europe/Berlin").with_jitter(timedelta(seconds=30))
    assert schedule.describe() == "CRON|0 * * * *|Europe/Berlin|JITTER=PT30S"
    assert parse_schedule(schedule.describe()) == schedule
    assert parse_schedule("FIXED_RATE|PT1H|jitter=PT5M").describe() == "FIXED_RATE|PT1H|JITTER=PT5M"
    assert schedule.jitter == timedelta(seconds=30)
    assert Schedules.cron("0 * * * *").jitter is None


def test_a_fixed_rate_with_jitter_sits_on_a_grid_from_the_unix_epoch() -> None:
    schedule = Schedules.fixed_rate(HOUR).with_jitter(timedelta(minutes=10)).bind("x")
    due = schedule.initial_execution_time(NOW)
    slot = schedule.slot_of(due)
    assert slot == datetime(2026, 12, 1, 11, tzinfo=UTC) or slot == NOW.replace(minute=0)
    assert slot.minute == 0 and slot.second == 0


def test_a_fixed_delay_with_jitter_includes_the_offset_in_its_time() -> None:
    schedule = Schedules.fixed_delay(timedelta(minutes=5)).with_jitter(timedelta(seconds=20))
    schedule = schedule.bind("x")
    due = schedule.next_execution_time(NOW, NOW)
    assert NOW + timedelta(minutes=5) <= due <= NOW + timedelta(minutes=5, seconds=20)
    assert schedule.slot_of(due) == due, "no grid: the jittered time is the slot"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Schedules.fixed_rate(HOUR).with_jitter(timedelta(0)), "positive duration"),
        (lambda: Schedules.fixed_rate(HOUR).with_jitter(-HOUR), "positive duration"),
        (lambda: Schedules.disabled().with_jitter(HOUR), "disabled schedule"),
        (lambda: parse_schedule("CRON|0 * * * *|JITTER=30s"), "PT30S"),
    ],
)
def test_bad_jitter_is_refused_naming_the_value(make: object, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        make()  # type: ignore[operator]


# -- catch-up plans ------------------------------------------------------------------------------

ROW = NOW - timedelta(hours=5, minutes=1)  # five slots and a minute behind an hourly grid


@pytest.mark.parametrize(
    "schedule",
    [Schedules.fixed_rate(HOUR), Schedules.cron("4 * * * *")],
    ids=["fixed-rate", "cron"],
)
def test_catch_up_plans(schedule: Schedule) -> None:
    latest = plan(schedule, CatchUp.latest(), ROW, NOW)
    assert (latest.slot, latest.skipped, latest.caught_up) == (ROW, 0, False)

    every = plan(schedule, CatchUp.all(max_slots=10), ROW, NOW)
    assert (every.slot, every.skipped, every.caught_up) == (ROW, 0, True)

    newest = plan(schedule, CatchUp.all(max_slots=3), ROW, NOW)
    assert newest.slot == ROW + 3 * HOUR and newest.skipped == 3 and newest.caught_up
    assert (newest.skipped_from, newest.skipped_to) == (ROW, ROW + 2 * HOUR)

    within = plan(schedule, CatchUp.skip(grace=timedelta(minutes=5)), ROW, NOW)
    assert within.slot == ROW + 5 * HOUR and within.skipped == 5

    beyond = plan(schedule, CatchUp.skip(grace=timedelta(seconds=30)), ROW, NOW)
    assert beyond.slot is None and beyond.skipped == 6
    assert beyond.next_time == ROW + 6 * HOUR, "the next future slot"


def test_after_a_run_latest_coalesces_and_counts_while_all_steps_to_the_next_slot() -> None:
    schedule = Schedules.cron("4 * * * *")
    assert next_after_run(schedule, CatchUp.latest(), ROW, ROW, NOW) == (ROW + 6 * HOUR, 5)
    assert next_after_run(schedule, CatchUp.all(10), ROW, ROW, NOW) == (ROW + HOUR, 0)
    on_time = ROW + 5 * HOUR
    assert next_after_run(schedule, CatchUp.latest(), on_time, on_time, NOW) == (
        ROW + 6 * HOUR,
        0,
    )


def test_a_fixed_delay_has_nothing_to_catch_up_but_can_skip_a_late_run() -> None:
    schedule = Schedules.fixed_delay(HOUR)
    assert plan(schedule, CatchUp.all(5), ROW, NOW).slot == ROW
    skipped = plan(schedule, CatchUp.skip(timedelta(minutes=1)), ROW, NOW)
    assert skipped.slot is None and skipped.skipped == 1 and skipped.next_time == NOW + HOUR


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CatchUp.all(0), "whole number >= 1"),
        (lambda: CatchUp.all(True), "whole number >= 1"),
        (lambda: CatchUp.skip(timedelta(seconds=-1)), "duration >= 0"),
        (lambda: CatchUp.skip(5), "duration >= 0"),  # type: ignore[arg-type]
    ],
)
def test_bad_catch_up_policies_are_refused(make: object, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        make()  # type: ignore[operator]


class _WrongCatchUp(DistributedJob):
    def name(self) -> str:
        return "wrong"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(HOUR)

    def catch_up(self) -> CatchUp:
        return "all"  # type: ignore[return-value]

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


def test_a_catch_up_that_is_not_a_policy_stops_the_build_naming_the_job() -> None:
    builder = job_registry().connection_provider("postgresql+asyncpg://u@h/db")
    with pytest.raises(ConfigurationError, match=r"_WrongCatchUp.catch_up\(\) must return"):
        builder.with_jobs([_WrongCatchUp()]).build()


# -- backfill windows ----------------------------------------------------------------------------


def test_backfill_slots_are_the_schedules_slots_in_the_window() -> None:
    schedule = Schedules.cron("0 * * * *")
    start = datetime(2026, 11, 30, 22, 30, tzinfo=UTC)
    assert backfill_slots(schedule, start, start + 3 * HOUR) == [
        datetime(2026, 11, 30, 23, tzinfo=UTC),
        datetime(2026, 12, 1, 0, tzinfo=UTC),
        datetime(2026, 12, 1, 1, tzinfo=UTC),
    ]
    on_slot = datetime(2026, 12, 1, 0, tzinfo=UTC)
    assert backfill_slots(schedule, on_slot, on_slot + HOUR) == [on_slot]
    instance = backfill_instance(on_slot)
    assert instance == "backfill:2026-12-01T00:00:00.000000+00:00"
    assert backfill_slot(instance) == on_slot and backfill_slot("recurring") is None


@pytest.mark.parametrize(
    ("schedule", "start", "end", "message"),
    [
        (Schedules.fixed_delay(HOUR), NOW - HOUR, NOW, "no fixed slots to backfill"),
        (Schedules.cron("0 * * * *"), NOW, NOW - HOUR, "must be after its start"),
        (
            Schedules.cron("* * * * * *", seconds=True),
            NOW - 12 * HOUR,
            NOW,
            "more than 10000 slots",
        ),
    ],
)
def test_bad_backfill_windows_are_refused(
    schedule: Schedule, start: datetime, end: datetime, message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        backfill_slots(schedule, start, end)


# -- rolling deploys -----------------------------------------------------------------------------


def _definition(schedule: str, version: str | None) -> JobDefinition:
    return JobDefinition(
        task_name="billing",
        kind="recurring",
        schedule=schedule,
        fingerprint=schedule,
        app_version=version,
        timeout=None,
        max_concurrency=None,
        keyed=False,
        written_by="p1",
        written_at=NOW,
    )


def test_versions_compare_naturally() -> None:
    assert compare_versions("1.10", "1.9") == 1
    assert compare_versions("2026.12.01-2", "2026.12.01-10") == -1
    assert compare_versions("v3", "V3") == 0


def test_the_newer_version_applies_its_schedule_the_older_adopts_the_stored_one() -> None:
    a, b = "CRON|0 0 1 1 *", "CRON|0 0 1 7 *"
    first = decide(_definition(a, "1"), None)
    assert first.ours and first.changed and first.write
    newer = decide(_definition(b, "2"), _definition(a, "1"))
    assert newer.ours and newer.changed and newer.write
    older = decide(_definition(a, "1"), _definition(b, "2"))
    assert not older.ours and not older.changed and not older.write
    same = decide(_definition(b, "2"), _definition(b, "2"))
    assert same.ours and not same.changed and same.write
    unchanged_older = decide(_definition(b, "1"), _definition(b, "2"))
    assert not unchanged_older.write, "an older version never overwrites a newer one's mark"


def test_disagreement_at_one_version_keeps_the_stored_schedule_and_warns() -> None:
    decision = decide(_definition("CRON|0 0 1 1 *", "2"), _definition("CRON|0 0 1 7 *", "2"))
    assert not decision.ours and decision.warning is not None
    assert "two instances of version 2 disagree" in decision.warning


def test_without_a_version_a_changed_schedule_is_applied_with_a_warning() -> None:
    decision = decide(_definition("CRON|0 0 1 1 *", None), _definition("CRON|0 0 1 7 *", "2"))
    assert decision.ours and decision.changed and decision.warning is not None
    assert "jobs.app-version" in decision.warning


def test_a_time_that_is_no_slot_stands_for_itself_under_jitter() -> None:
    schedule = Schedules.cron("0 * * * *").with_jitter(timedelta(minutes=5)).bind("x")
    made_due = datetime(2026, 12, 1, 10, 37, 12, tzinfo=UTC)  # run_now: not a jittered slot
    assert schedule.slot_of(made_due) == made_due
    after = schedule.next_execution_time(made_due, made_due)
    assert schedule.slot_of(after) == datetime(2026, 12, 1, 11, tzinfo=UTC)
