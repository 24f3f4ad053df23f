"""Schedules: slot arithmetic, DST rules, parsing, describing and every error path."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ekbatan_fastapi.domain.errors import ScheduleError
from ekbatan_fastapi.domain.schedules import (
    Cron,
    Daily,
    Disabled,
    FixedDelay,
    FixedRate,
    Schedule,
    Schedules,
    parse_schedule,
)

from .helpers import examples

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def run(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    """Slots of a schedule whose every run completes exactly at its slot."""
    slots = [schedule.initial_execution_time(start)]
    while len(slots) < count:
        slots.append(schedule.next_execution_time(slots[-1], slots[-1]))
    return slots


# --- FixedDelay ------------------------------------------------------------------------


def test_fixed_delay_counts_from_completion() -> None:
    schedule = Schedules.fixed_delay(timedelta(minutes=2))
    assert schedule.initial_execution_time(utc(2026, 1, 1, 12)) == utc(2026, 1, 1, 12)
    slot, done = utc(2026, 1, 1, 12), utc(2026, 1, 1, 12, 0, 45)
    assert schedule.next_execution_time(slot, done) == utc(2026, 1, 1, 12, 2, 45)
    assert not schedule.is_deterministic and not schedule.is_disabled
    assert schedule.describe() == str(schedule) == "FIXED_DELAY|PT2M"


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(seconds=-1)])
def test_fixed_delay_must_be_positive(delay: timedelta) -> None:
    with pytest.raises(ScheduleError, match="positive duration"):
        FixedDelay(delay)


# --- FixedRate -------------------------------------------------------------------------


def test_fixed_rate_stays_on_grid_when_runs_finish_late() -> None:
    schedule = Schedules.fixed_rate(timedelta(minutes=10))
    first = schedule.initial_execution_time(utc(2026, 1, 1, 12, 0, 7))
    assert first == utc(2026, 1, 1, 12, 0, 7)
    slot = first
    for minute in range(10, 200, 10):
        slot = schedule.next_execution_time(slot, slot + timedelta(minutes=9, seconds=59))
        assert slot == utc(2026, 1, 1, 12, 0, 7) + timedelta(minutes=minute)


def test_fixed_rate_coalesces_missed_slots() -> None:
    schedule = FixedRate(timedelta(minutes=10))
    slot = utc(2026, 1, 1, 12)
    # Finished 35 minutes late: slots 12:10, 12:20, 12:30 are coalesced into this run.
    assert schedule.next_execution_time(slot, utc(2026, 1, 1, 12, 35)) == utc(2026, 1, 1, 12, 40)
    # Exactly on a grid point: the next slot must lie strictly after now.
    assert schedule.next_execution_time(slot, utc(2026, 1, 1, 12, 30)) == utc(2026, 1, 1, 12, 40)
    # A run that finished before its own slot (skewed clock) still advances one period.
    assert schedule.next_execution_time(slot, utc(2026, 1, 1, 11)) == utc(2026, 1, 1, 12, 10)
    assert schedule.describe() == "FIXED_RATE|PT10M"


@given(
    period=st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(days=30)),
    late=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=365)),
)
def test_fixed_rate_property_on_grid_minimal_and_in_future(
    period: timedelta, late: timedelta
) -> None:
    slot = utc(2026, 1, 1)
    now = slot + late
    result = FixedRate(period).next_execution_time(slot, now)
    assert result > now
    assert (result - slot) % period == timedelta(0)
    assert result - period <= now or result - period == slot


def test_fixed_rate_must_be_positive() -> None:
    with pytest.raises(ScheduleError, match="fixed-rate period must be a positive duration"):
        Schedules.fixed_rate(timedelta(0))


# --- Daily -----------------------------------------------------------------------------


def test_daily_multiple_times_across_midnight() -> None:
    schedule = Schedules.daily(time(23, 30), time(0, 15))
    assert schedule.times == (time(0, 15), time(23, 30))
    assert schedule.is_deterministic
    assert run(schedule, utc(2026, 1, 1, 23), 4) == [
        utc(2026, 1, 1, 23, 30),
        utc(2026, 1, 2, 0, 15),
        utc(2026, 1, 2, 23, 30),
        utc(2026, 1, 3, 0, 15),
    ]


def test_daily_initial_is_at_or_after_now_and_next_is_strictly_after() -> None:
    schedule = Schedules.daily(time(12))
    assert schedule.initial_execution_time(utc(2026, 1, 1, 12)) == utc(2026, 1, 1, 12)
    assert schedule.initial_execution_time(utc(2026, 1, 1, 12, 0, 0, 1)) == utc(2026, 1, 2, 12)
    slot = utc(2026, 1, 1, 12)
    assert schedule.next_execution_time(slot, slot) == utc(2026, 1, 2, 12)


def test_daily_coalesces_missed_days_and_respects_last_slot() -> None:
    schedule = Schedules.daily(time(12))
    # Three days of outage: one run, and the next slot is the first one after now.
    assert schedule.next_execution_time(utc(2026, 1, 1, 12), utc(2026, 1, 4, 13)) == utc(
        2026, 1, 5, 12
    )
    # "now" before the slot that just ran (skewed clock): still after that slot.
    assert schedule.next_execution_time(utc(2026, 1, 1, 12), utc(2026, 1, 1, 11)) == utc(
        2026, 1, 2, 12
    )


def test_daily_in_a_zone_follows_its_offset() -> None:
    schedule = Schedules.daily(time(12), zone="Europe/Rome")
    assert schedule.initial_execution_time(utc(2026, 1, 10)) == utc(2026, 1, 10, 11)
    assert schedule.initial_execution_time(utc(2026, 7, 10)) == utc(2026, 7, 10, 10)


def test_daily_spring_forward_gap_runs_once_at_end_of_gap() -> None:
    # 2026-03-29: Berlin clocks jump from 02:00 CET to 03:00 CEST (01:00 UTC).
    schedule = Schedules.daily(time(2, 30), zone=BERLIN)
    assert run(schedule, utc(2026, 3, 28, 12), 3) == [
        utc(2026, 3, 29, 1),  # 03:00 CEST, the first instant after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
    ]


def test_daily_times_inside_one_gap_run_once() -> None:
    schedule = Schedules.daily(time(2, 15), time(2, 45), time(3, 0), zone=BERLIN)
    assert run(schedule, utc(2026, 3, 28, 23), 3) == [
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 15),
        utc(2026, 3, 30, 0, 45),
    ]


def test_daily_fall_back_repeated_time_runs_once_at_first_occurrence() -> None:
    # 2026-10-25: Berlin 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    schedule = Schedules.daily(time(2, 30), zone=BERLIN)
    assert run(schedule, utc(2026, 10, 24, 12), 3) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first occurrence
        utc(2026, 10, 26, 1, 30),  # 02:30 CET the next day; never at 01:30 UTC on the 25th
        utc(2026, 10, 27, 1, 30),
    ]
    # Created during the second occurrence: that one is not a slot.
    assert schedule.initial_execution_time(utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 26, 1, 30)


def test_daily_new_york_2026_transitions() -> None:
    schedule = Schedules.daily(time(1, 30), time(2, 30), zone=NEW_YORK)
    # 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC); 02:30 does not exist.
    assert run(schedule, utc(2026, 3, 8, 5), 3) == [
        utc(2026, 3, 8, 6, 30),  # 01:30 EST
        utc(2026, 3, 8, 7),  # 03:00 EDT
        utc(2026, 3, 9, 5, 30),  # 01:30 EDT
    ]
    # 2026-11-01: 02:00 EDT -> 01:00 EST; 01:30 happens twice, runs at 05:30 UTC only.
    assert run(schedule, utc(2026, 11, 1, 4), 3) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT
        utc(2026, 11, 1, 7, 30),  # 02:30 EST
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]


def test_daily_equality_ignores_order_duplicates_and_zone_object_identity() -> None:
    a = Daily((time(13, 45), time(12), time(12)), ZoneInfo("Europe/Rome"))
    b = Schedules.daily(time(12), time(13, 45), zone=ZoneInfo.no_cache("Europe/Rome"))
    assert a == b and hash(a) == hash(b)
    assert a != Schedules.daily(time(12), time(13, 45))
    assert a.describe() == "DAILY|12:00,13:45|Europe/Rome"


@pytest.mark.parametrize(
    ("times", "fragment"),
    [
        ((), "at least one time"),
        ((time(12, tzinfo=UTC),), "naive datetime.time"),
        ((time(12, 0, 0, 5),), "whole seconds"),
    ],
)
def test_daily_invalid_times(times: tuple[time, ...], fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment):
        Schedules.daily(*times)


def test_daily_unknown_zone_is_named() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus_Mons'"):
        Schedules.daily(time(12), zone="Mars/Olympus_Mons")


# --- Cron ------------------------------------------------------------------------------


def test_cron_five_fields() -> None:
    schedule = Schedules.cron("0 2 * * *")
    assert schedule.is_deterministic
    assert run(schedule, utc(2026, 1, 1, 2), 2) == [utc(2026, 1, 1, 2), utc(2026, 1, 2, 2)]
    assert schedule.describe() == "CRON|0 2 * * *"


def test_cron_six_fields_put_seconds_first() -> None:
    every_five_minutes = Schedules.cron("0 */5 * * * *", seconds=True)
    assert run(every_five_minutes, utc(2026, 1, 1, 12, 0, 1), 3) == [
        utc(2026, 1, 1, 12, 5),
        utc(2026, 1, 1, 12, 10),
        utc(2026, 1, 1, 12, 15),
    ]
    second_thirty = Schedules.cron("30 * * * * *", seconds=True)
    assert run(second_thirty, utc(2026, 1, 1, 12), 2) == [
        utc(2026, 1, 1, 12, 0, 30),
        utc(2026, 1, 1, 12, 1, 30),
    ]


def test_cron_alias_and_zone() -> None:
    schedule = Schedules.cron("@daily", zone="America/New_York")
    assert schedule.initial_execution_time(utc(2026, 1, 1, 12)) == utc(2026, 1, 2, 5)
    assert schedule.describe() == "CRON|@daily|America/New_York"


def test_cron_coalesces_missed_slots() -> None:
    schedule = Schedules.cron("*/10 * * * *")
    slot = utc(2026, 1, 1, 12)
    assert schedule.next_execution_time(slot, utc(2026, 1, 1, 13, 5)) == utc(2026, 1, 1, 13, 10)


def test_cron_spring_forward_gap_runs_once_at_end_of_gap() -> None:
    daily = Schedules.cron("30 2 * * *", zone=BERLIN)
    assert run(daily, utc(2026, 3, 28, 12), 2) == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]
    half_hourly = Schedules.cron("*/30 * * * *", zone=BERLIN)
    assert run(half_hourly, utc(2026, 3, 29, 0), 4) == [
        utc(2026, 3, 29, 0),  # 01:00 CET
        utc(2026, 3, 29, 0, 30),  # 01:30 CET
        utc(2026, 3, 29, 1),  # 02:00 and 02:30 do not exist: once, at 03:00 CEST
        utc(2026, 3, 29, 1, 30),  # 03:30 CEST
    ]


def test_cron_fall_back_repeated_hour_runs_once_at_first_occurrence() -> None:
    # croniter alone would also fire in the second 02:xx (fold=1); we do not.
    daily = Schedules.cron("30 2 * * *", zone=BERLIN)
    assert run(daily, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    hourly = Schedules.cron("0 * * * *", zone=BERLIN)
    assert run(hourly, utc(2026, 10, 24, 23, 30), 4) == [
        utc(2026, 10, 25, 0),  # 02:00 CEST
        utc(2026, 10, 25, 2),  # 03:00 CET; 02:00 CET (01:00 UTC) is a repeat
        utc(2026, 10, 25, 3),
        utc(2026, 10, 25, 4),
    ]
    # Asked during the repeated hour, the next slot is after it.
    assert hourly.next_execution_time(utc(2026, 10, 25, 0), utc(2026, 10, 25, 1, 10)) == utc(
        2026, 10, 25, 2
    )


def test_cron_new_york_gap() -> None:
    schedule = Schedules.cron("0 2 * * *", zone=NEW_YORK)
    assert run(schedule, utc(2026, 3, 7, 12), 3) == [
        utc(2026, 3, 8, 7),  # 02:00 EST would be in the gap: 03:00 EDT
        utc(2026, 3, 9, 6),
        utc(2026, 3, 10, 6),
    ]


@given(st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1)))
@settings(max_examples=examples(200))
def test_daily_and_cron_agree_in_a_dst_zone(naive: datetime) -> None:
    now = naive.replace(tzinfo=UTC)
    daily = Schedules.daily(time(2, 30), time(14), zone=BERLIN)
    cron = Schedules.cron("30 2 * * *", zone=BERLIN), Schedules.cron("0 14 * * *", zone=BERLIN)
    expected = min(c.next_execution_time(now, now) for c in cron)
    assert daily.next_execution_time(now, now) == expected > now
    assert daily.initial_execution_time(now) >= now


def test_cron_normalises_whitespace_for_equality() -> None:
    assert Cron("0  2 * *\t*") == Cron("0 2 * * *")
    assert hash(Cron("0 2 * * *", BERLIN)) == hash(Cron("0 2 * * *", ZoneInfo("Europe/Berlin")))
    assert Cron("0 2 * * *", BERLIN) != Cron("0 2 * * *")


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty"),
        ("* * *", "has 3 fields"),
        ("0 0 0 * * * *", "has 7 fields"),
        ("@reboot", "'@reboot' has no time slots"),
        ("@fortnightly", "unknown cron alias '@fortnightly'"),
        ("61 * * * *", "invalid cron expression '61 \\* \\* \\* \\*'"),
        ("*/0 * * * *", "invalid cron expression"),
        ("0 0 30 2 *", "never matches"),
        ("R * * * *", "random"),
        ("H * * * *", "hashed"),
    ],
)
def test_cron_invalid_expressions_are_named(expression: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment):
        Schedules.cron(expression)


def test_cron_accepts_month_and_day_names() -> None:
    schedule = Schedules.cron("0 9 * MAR THU")
    assert schedule.initial_execution_time(utc(2026, 1, 1)) == utc(2026, 3, 5, 9)


# --- Disabled, common contract ---------------------------------------------------------


def test_disabled() -> None:
    schedule = Schedules.disabled()
    assert schedule.is_disabled and not schedule.is_deterministic
    assert schedule.describe() == "-" and schedule == Disabled()
    with pytest.raises(ScheduleError, match="disabled schedule has no execution time"):
        schedule.initial_execution_time(utc(2026, 1, 1))
    with pytest.raises(ScheduleError, match="disabled schedule has no execution time"):
        schedule.next_execution_time(utc(2026, 1, 1), utc(2026, 1, 1))


ALL_RUNNABLE: list[Schedule] = [
    FixedDelay(timedelta(seconds=5)),
    FixedRate(timedelta(seconds=5)),
    Daily((time(12),)),
    Cron("0 2 * * *"),
]


@pytest.mark.parametrize("schedule", ALL_RUNNABLE, ids=str)
def test_naive_datetimes_are_rejected_by_name(schedule: Schedule) -> None:
    naive, aware = datetime(2026, 1, 1), utc(2026, 1, 1)
    with pytest.raises(ScheduleError, match="now must be a timezone-aware datetime"):
        schedule.initial_execution_time(naive)
    with pytest.raises(ScheduleError, match="now must be a timezone-aware"):
        schedule.next_execution_time(aware, naive)
    with pytest.raises(ScheduleError, match="last_slot must be a timezone-aware"):
        schedule.next_execution_time(naive, aware)


@pytest.mark.parametrize("schedule", ALL_RUNNABLE, ids=str)
def test_results_are_utc_even_for_other_aware_inputs(schedule: Schedule) -> None:
    now = datetime(2026, 1, 1, 13, tzinfo=ZoneInfo("Europe/Rome"))
    first = schedule.initial_execution_time(now)
    following = schedule.next_execution_time(first, first)
    assert first.tzinfo is UTC and following.tzinfo is UTC
    assert first >= now and following > first


@pytest.mark.parametrize("schedule", ALL_RUNNABLE, ids=str)
def test_end_of_calendar_is_a_schedule_error(schedule: Schedule) -> None:
    end = datetime.max.replace(tzinfo=UTC)
    with pytest.raises(ScheduleError, match=r"range|no next slot"):
        schedule.next_execution_time(end, end)


# --- parse_schedule / describe ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FIXED_DELAY|120s", FixedDelay(timedelta(seconds=120))),
        ("FIXED_DELAY|PT2M", FixedDelay(timedelta(minutes=2))),
        ("  fixed_delay |  pt2m ", FixedDelay(timedelta(minutes=2))),
        ("FIXED_RATE|PT0.5S", FixedRate(timedelta(milliseconds=500))),
        ("Fixed_Rate|3600s", FixedRate(timedelta(hours=1))),
        ("DAILY|12:00,13:45", Daily((time(12), time(13, 45)))),
        (
            "DAILY|13:45, 12:00|Europe/Rome",
            Daily((time(12), time(13, 45)), ZoneInfo("Europe/Rome")),
        ),
        ("daily|7:05:30|UTC", Daily((time(7, 5, 30),))),
        ("CRON|0 2 * * *", Cron("0 2 * * *")),
        ("CRON|0 2 * * *|UTC", Cron("0 2 * * *")),
        ("cron|0 */5 * * * *|Europe/Berlin", Cron("0 */5 * * * *", BERLIN, seconds=True)),
        ("-", Disabled()),
        ("  -  ", Disabled()),
    ],
)
def test_parse_schedule_forms(text: str, expected: Schedule) -> None:
    parsed = parse_schedule(text)
    assert parsed == expected
    assert Schedules.parse_schedule(text) == expected
    assert parse_schedule(parsed.describe()) == parsed


@pytest.mark.parametrize(
    ("schedule", "text"),
    [
        (FixedDelay(timedelta(seconds=120)), "FIXED_DELAY|PT2M"),
        (FixedRate(timedelta(days=1, hours=2)), "FIXED_RATE|P1DT2H"),
        (Daily((time(12, 0, 30), time(9))), "DAILY|09:00,12:00:30"),
        (Daily((time(0, 0),), NEW_YORK), "DAILY|00:00|America/New_York"),
        (Cron("@hourly", BERLIN), "CRON|@hourly|Europe/Berlin"),
        (Disabled(), "-"),
    ],
)
def test_describe_is_canonical_and_round_trips(schedule: Schedule, text: str) -> None:
    assert schedule.describe() == str(schedule) == text
    assert parse_schedule(text) == schedule


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "it is empty; expected FIXED_DELAY"),
        ("   ", "it is empty"),
        ("garbage", "unknown kind 'GARBAGE'"),
        ("WEEKLY|MON", "unknown kind 'WEEKLY'; expected FIXED_DELAY"),
        ("FIXED_DELAY", "nothing follows FIXED_DELAY; expected FIXED_DELAY|<seconds>s"),
        ("FIXED_DELAY|", "is not an ISO-8601 duration"),
        ("FIXED_DELAY|10m", "'10m' is not an ISO-8601 duration; write PT10M"),
        ("FIXED_DELAY|120", "no unit"),
        ("FIXED_DELAY|0s", "must be a positive duration, got PT0S"),
        ("FIXED_DELAY|PT0S", "must be a positive duration"),
        ("FIXED_DELAY|-PT1S", "negative"),
        ("FIXED_DELAY|1.5s", "write PT1.5S"),
        ("FIXED_DELAY|P1M", "years or months"),
        ("FIXED_DELAY|PT1S|x", "takes exactly one duration"),
        ("FIXED_RATE|soon", "expected FIXED_RATE|<seconds>s or FIXED_RATE|<ISO-8601 duration>"),
        ("DAILY|", "'' is not a time of day"),
        ("DAILY|25:00", "'25:00' is not a time of day; expected DAILY|HH:MM"),
        ("DAILY|12:60", "'12:60' is not a time of day"),
        ("DAILY|noon", "'noon' is not a time of day"),
        ("DAILY|12:00,", "'' is not a time of day"),
        ("DAILY|12:00|Mars/Base", "unknown time zone 'Mars/Base'"),
        ("DAILY|12:00|", "unknown time zone ''"),
        ("DAILY|12:00|../etc/passwd", "unknown time zone"),
        ("DAILY|12:00|Europe", "unknown time zone 'Europe'"),
        ("DAILY|12:00|UTC|x", "too many '\\|' parts"),
        ("CRON|", "cron expression is empty; expected CRON\\|"),
        ("CRON|* * *", "has 3 fields"),
        ("CRON|0 0 0 * * * *", "has 7 fields"),
        ("CRON|@reboot", "@reboot"),
        ("CRON|0 2 * * *|Nowhere", "unknown time zone 'Nowhere'"),
        ("CRON|not a cron at all", "invalid cron expression"),
        ("CRON|0 0 31 4 *", "never matches"),
        ("CRON|a|b|c", "too many"),
    ],
)
def test_parse_schedule_errors_quote_the_input(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment) as error:
        parse_schedule(text)
    message = str(error.value)
    assert message.startswith(f"invalid schedule {text!r}: ")
    assert "expected" in message


def test_parse_schedule_rejects_non_strings() -> None:
    with pytest.raises(ScheduleError, match="must be a string"):
        parse_schedule(None)  # type: ignore[arg-type]


def _parses_or_schedule_error(text: str) -> None:
    try:
        schedule = parse_schedule(text)
    except ScheduleError as error:
        assert repr(text) in str(error)
        return
    assert parse_schedule(schedule.describe()) == schedule
    if not schedule.is_disabled:
        now = utc(2026, 10, 25, 0, 45)
        try:
            slot = schedule.initial_execution_time(now)
        except ScheduleError:
            return
        assert slot >= now
        if schedule.is_deterministic:
            assert schedule.next_execution_time(slot, slot) > slot


@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_fuzz_parse_schedule_any_text(text: str) -> None:
    _parses_or_schedule_error(text)


_NEAR_VALID = [
    r"\s?(FIXED_DELAY|fixed_rate)\s?\|\s?([0-9]{1,4}[sS]|-?[pP][tT]?[0-9]{1,3}(\.[0-9]{1,7})?[SMHDYWsm])",
    r"(DAILY|daily)\|[0-9]{1,2}:[0-9]{2}(:[0-9]{2})?(, ?[0-9]{1,2}:[0-9]{1,2}){0,2}"
    r"(\|(UTC|Europe/Rome|America/New_York|Nope/Zone|Europe|Etc/GMT\+[0-9]{1,2}))?",
    r"CRON\|(@[a-z]{4,8}|([1-5]|\*|\*/[0-9]{1,2}|[0-9]-[1-9]|MON|JAN|L|W|\?|R|H|1#2)"
    r"( ([1-5]|\*|\*/[0-9]{1,2}|[0-9]-[1-9]|MON|JAN|L|W|\?|R|H|1#2)){3,6})"
    r"(\|(UTC|Europe/Berlin|America/New_York|X))?",
    r"cron\|(\*|[0-5]|\*/[1-9])( (\*|[1-5]|\*/[1-9]|[1-5]-[1-5])){4,5}(\|(Europe/Berlin|UTC))?",
]
_VALID_EXAMPLES = [
    "FIXED_DELAY|120s",
    "FIXED_RATE|PT0.5S",
    "DAILY|12:00,13:45|Europe/Rome",
    "CRON|0 */5 * * * *|Europe/Berlin",
    "CRON|@daily",
    "-",
]


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    """A valid schedule string with one to three characters inserted, replaced or deleted."""
    text = draw(st.sampled_from(_VALID_EXAMPLES))
    chars = st.one_of(st.sampled_from("0123456789:|,-*/ sSPTMHD@."), st.characters())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "replace", "delete"]))
        if edit == "delete":
            text = text[:at] + text[at + 1 :]
        else:
            keep = at + (1 if edit == "replace" else 0)
            text = text[:at] + draw(chars) + text[keep:]
    return text


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of([st.from_regex(pattern, fullmatch=True) for pattern in _NEAR_VALID]))
def test_fuzz_parse_schedule_near_valid_text(text: str) -> None:
    _parses_or_schedule_error(text)


@settings(max_examples=examples(400), deadline=None)
@given(_mutated())
def test_fuzz_parse_schedule_mutated_valid_text(text: str) -> None:
    _parses_or_schedule_error(text)


@settings(max_examples=examples(100), deadline=None)
@given(
    kind=st.sampled_from(["FIXED_DELAY", "FIXED_RATE", "DAILY", "CRON"]),
    rest=st.lists(st.text(max_size=12), min_size=1, max_size=3),
)
def test_fuzz_parse_schedule_known_kind_with_random_parts(kind: str, rest: list[str]) -> None:
    _parses_or_schedule_error("|".join([kind, *rest]))
