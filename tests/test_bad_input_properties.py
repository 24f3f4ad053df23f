"""Bad input, property-based: schedules, cron expressions, durations and settings.

Only the documented exceptions come out (``ScheduleError`` for schedules and durations,
``ConfigurationError`` for settings), each with a message that names what was wrong; nothing
else escapes, and no message repeats a password. ``tests/test_schedules.py`` and
``tests/test_durations.py`` already fuzz ``parse_schedule`` and ``parse_iso_duration`` with
arbitrary text; these tests cover the other entry points and the calendar's edges.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ekbatan_fastapi import Schedule, Schedules, parse_schedule
from ekbatan_fastapi.domain.durations import format_iso_duration, parse_iso_duration
from ekbatan_fastapi.domain.errors import ConfigurationError, ScheduleError
from ekbatan_fastapi.settings import EkbatanSettings, JobsSettings

from .helpers import examples

ZONES = ["UTC", "Europe/Rome", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
JUNK_ZONES = ["", " ", "Nope/Zone", "../../etc/passwd", "UTC\x00", "Europe/", "+01:00", "😀"]

# -- schedules ---------------------------------------------------------------------------------


_FIELD = st.one_of(
    st.sampled_from(["*", "?", "L", "W", "#", "-", "/", ",", "*/0", "*/15", "1-5", "MON-FRI"]),
    st.integers(-5, 70).map(str),
    st.builds("{}-{}".format, st.integers(0, 70), st.integers(0, 70)),
    st.builds("*/{}".format, st.integers(0, 100)),
    st.text(string.printable, max_size=4),
)
_CRON = st.one_of(
    st.lists(_FIELD, min_size=0, max_size=8).map(" ".join),
    st.sampled_from(["@daily", "@hourly", "@reboot", "@every 5m", "@", "@yearly "]),
    st.text(max_size=40),
)


def _check_schedule(schedule: Schedule, now: datetime) -> None:
    """A schedule that was accepted gives aware UTC times after ``now``, or a ScheduleError at
    the end of the calendar; it describes itself in a form ``parse_schedule`` reads back."""
    assert parse_schedule(schedule.describe()) == schedule
    try:
        first = schedule.initial_execution_time(now)
        following = schedule.next_execution_time(first, first)
    except ScheduleError:
        return
    assert first.tzinfo is UTC and following.tzinfo is UTC
    assert first >= now and following > first


@settings(max_examples=examples(300), deadline=None)
@given(expression=_CRON, zone=st.one_of(st.none(), st.sampled_from(ZONES + JUNK_ZONES)))
def test_cron_expressions_are_accepted_or_refused_by_name(
    expression: str, zone: str | None
) -> None:
    try:
        schedule = Schedules.cron(expression, zone)
    except ScheduleError as error:
        message = str(error)
        assert "cron" in message or (zone is not None and repr(zone) in message), message
        return
    _check_schedule(schedule, datetime(2026, 3, 29, 0, 30, tzinfo=UTC))


@settings(max_examples=examples(200), deadline=None)
@given(
    times=st.lists(st.times(), min_size=0, max_size=4),
    zone=st.one_of(st.none(), st.sampled_from(ZONES + JUNK_ZONES), st.text(max_size=20)),
)
def test_daily_times_and_zones_are_accepted_or_refused_by_name(
    times: list[time], zone: str | None
) -> None:
    try:
        schedule = Schedules.daily(*times, zone=zone)
    except ScheduleError as error:
        message = str(error)
        assert "daily" in message or (zone is not None and repr(zone) in message), message
        return
    _check_schedule(schedule, datetime(2026, 10, 25, 0, 45, tzinfo=UTC))


_VALID = st.one_of(
    st.timedeltas(timedelta(microseconds=1), timedelta(days=3650)).map(Schedules.fixed_delay),
    st.timedeltas(timedelta(microseconds=1), timedelta(days=3650)).map(Schedules.fixed_rate),
    st.builds(
        lambda times, zone: Schedules.daily(*times, zone=zone),
        st.lists(st.times().map(lambda t: t.replace(microsecond=0)), min_size=1, max_size=3),
        st.sampled_from(ZONES),
    ),
    st.builds(
        Schedules.cron,
        st.sampled_from(["*/5 * * * *", "0 2 * * *", "30 1 29 2 *", "0 0 31 * *", "@hourly"]),
        st.sampled_from(ZONES),
    ),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    schedule=_VALID,
    now=st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12))]
        ),
    ),
)
def test_every_schedule_answers_or_refuses_across_the_whole_calendar(
    schedule: Schedule, now: datetime
) -> None:
    """From year 1 to year 9999, in any offset: a time after now, or a ScheduleError (never an
    OverflowError or ValueError from date arithmetic)."""
    _check_schedule(schedule, now)


@settings(max_examples=examples(300), deadline=None)
@given(text=st.text(max_size=60), setting=st.sampled_from(["jobs.polling-interval", "x"]))
def test_duration_errors_name_the_setting_and_the_value(text: str, setting: str) -> None:
    try:
        value = parse_iso_duration(text, setting=setting)
    except ScheduleError as error:
        assert f"for {setting}" in str(error) and repr(text) in str(error)
        return
    assert parse_iso_duration(format_iso_duration(value)) == value


# -- settings ----------------------------------------------------------------------------------

_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["PT10S", "10s", "P1Y", "PT-1S", "-PT1S", "PT0S", "P99999999999999D", "3"]),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
_KEYS = sorted(JobsSettings.model_fields)


def _spellings(key: str) -> st.SearchStrategy[str]:
    camel = key.split("_")[0] + "".join(part.title() for part in key.split("_")[1:])
    return st.sampled_from([key, key.replace("_", "-"), camel])


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    with mock.patch.dict(os.environ, values):
        yield


def _accepted_or_named(make: Any, key: str, env: str | None = None) -> None:
    try:
        make()
    except ConfigurationError as error:
        message = str(error)
        assert key.replace("_", "-") in message, message
        if env is not None:
            assert env in message, message


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), key=st.sampled_from(_KEYS), value=_JUNK)
def test_junk_job_settings_are_refused_naming_the_key(
    data: st.DataObject, key: str, value: Any
) -> None:
    spelled = data.draw(_spellings(key))
    _accepted_or_named(lambda: EkbatanSettings(jobs={spelled: value}), key)


@settings(max_examples=examples(200), deadline=None)
@given(
    key=st.sampled_from(_KEYS),
    value=st.text(st.characters(codec="utf-8", exclude_characters="\x00")),
)
def test_junk_job_settings_from_the_environment_are_refused_naming_the_variable(
    key: str, value: str
) -> None:
    env = f"EKBATAN_JOBS__{key.upper()}"
    with _environment({env: value}):
        _accepted_or_named(EkbatanSettings, key, env)


_YAML_VALUES = st.recursive(
    _JUNK,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(
                st.sampled_from([*_KEYS, "jobs", "sharding", "groups", "members"]),
                st.text(max_size=8),
            ),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    document=st.one_of(
        st.text(max_size=80),
        st.builds(lambda v: yaml.safe_dump({"ekbatan": v}), _YAML_VALUES),
        st.builds(lambda v: yaml.safe_dump({"ekbatan": {"jobs": v}}), _YAML_VALUES),
        st.builds(lambda v: json.dumps(v), _YAML_VALUES),
    )
)
def test_junk_yaml_files_are_refused_with_a_configuration_error(
    tmp_path: Path, document: str
) -> None:
    path = tmp_path / "application.yml"
    path.write_text(document, encoding="utf-8", errors="surrogatepass")
    try:
        EkbatanSettings(_config_file=path)
    except ConfigurationError as error:
        assert str(error)


def _free_text(max_size: int, alphabet: str | None = None) -> st.SearchStrategy[str]:
    """Text around the password placeholder, never the placeholder itself: newer Hypothesis
    also tries the module's string literals, and a host or database named "PASSWORD" would put
    the password where a URL's visible parts are."""
    text = st.text(alphabet, max_size=max_size) if alphabet else st.text(max_size=max_size)
    return text.filter(lambda value: "PASSWORD" not in value)


@settings(max_examples=examples(300), deadline=None)
@given(
    url=st.one_of(
        _free_text(40),
        st.builds(
            "{}://{}:{}@{}/{}".format,
            st.sampled_from(["postgresql+asyncpg", "mysql+asyncmy", "jdbc:postgresql", "", "x"]),
            _free_text(5, string.ascii_letters),
            st.just("PASSWORD"),
            _free_text(12),
            _free_text(8),
        ),
    ),
    jdbc=st.booleans(),
    password=st.booleans(),
)
def test_junk_database_urls_are_refused_without_showing_the_password(
    url: str, jdbc: bool, password: bool
) -> None:
    secret = "s3cr3t-Hunter2"
    url = url.replace("PASSWORD", secret)
    slot: dict[str, Any] = {"jdbc-url" if jdbc else "url": url}
    if password:
        slot["password"] = secret
    try:
        settings_ = EkbatanSettings(
            sharding={"groups": [{"members": [{"configs": {"jobs-config": slot}}]}]}
        )
        settings_.jobs_datasource().sqlalchemy_url()
    except ConfigurationError as error:
        assert secret not in str(error), str(error)
