"""ISO-8601 durations: accepted forms, helpful rejections, display and round trips."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ekbatan_fastapi.domain.durations import format_iso_duration, parse_iso_duration
from ekbatan_fastapi.domain.errors import ScheduleError

from .helpers import examples


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT10S", timedelta(seconds=10)),
        ("pt10s", timedelta(seconds=10)),
        (" PT10S\n", timedelta(seconds=10)),
        ("PT0.2S", timedelta(milliseconds=200)),
        ("PT0,5S", timedelta(milliseconds=500)),
        ("PT1.000001S", timedelta(seconds=1, microseconds=1)),
        ("PT1.5000000S", timedelta(seconds=1.5)),
        ("PT5M", timedelta(minutes=5)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("PT90M", timedelta(minutes=90)),
        ("PT1H2M3S", timedelta(hours=1, minutes=2, seconds=3)),
        ("P1D", timedelta(days=1)),
        ("P14D", timedelta(days=14)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("P2W", timedelta(days=14)),
        ("PT0S", timedelta(0)),
        ("PT30M", timedelta(minutes=30)),
    ],
)
def test_parses_iso_durations(text: str, expected: timedelta) -> None:
    assert parse_iso_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (timedelta(seconds=10), "PT10S"),
        (timedelta(milliseconds=200), "PT0.2S"),
        (timedelta(microseconds=1), "PT0.000001S"),
        (timedelta(minutes=5), "PT5M"),
        (timedelta(hours=1, minutes=30), "PT1H30M"),
        (timedelta(days=14), "P14D"),
        (timedelta(days=1, hours=2), "P1DT2H"),
        (timedelta(days=1, seconds=1.5), "P1DT1.5S"),
        (timedelta(0), "PT0S"),
        (timedelta(seconds=-5), "-PT5S"),
    ],
)
def test_formats_canonical_iso(text: timedelta, expected: str) -> None:
    assert format_iso_duration(text) == expected


@pytest.mark.parametrize("text", ["PT10S", "PT0.2S", "PT5M", "PT1H30M", "P14D", "P1DT2H"])
def test_canonical_forms_round_trip(text: str) -> None:
    assert format_iso_duration(parse_iso_duration(text)) == text


@given(st.timedeltas(min_value=timedelta(0)))
def test_format_then_parse_is_identity(value: timedelta) -> None:
    assert parse_iso_duration(format_iso_duration(value)) == value


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("10s", "PT10S"),
        ("10S", "PT10S"),
        ("200ms", "PT0.2S"),
        ("1.5s", "PT1.5S"),
        ("5m", "PT5M"),
        ("90m", "PT1H30M"),
        ("2h", "PT2H"),
        ("1d", "P1D"),
        ("14 d", "P14D"),
    ],
)
def test_shorthand_is_rejected_with_the_iso_form(text: str, hint: str) -> None:
    with pytest.raises(ScheduleError) as error:
        parse_iso_duration(text, setting="jobs.polling_interval")
    assert str(error.value) == (
        f"{text!r} is not an ISO-8601 duration for jobs.polling_interval; write {hint}"
    )


def test_message_without_setting_name() -> None:
    with pytest.raises(ScheduleError, match=r"^'10s' is not an ISO-8601 duration; write PT10S$"):
        parse_iso_duration("10s")


def test_bare_number_suggests_seconds() -> None:
    with pytest.raises(ScheduleError, match=r"'10'.*no unit.*PT10S"):
        parse_iso_duration("10", setting="x")


@pytest.mark.parametrize("text", ["P1Y", "P1M", "p2m", "P1Y2M3DT4H", "P1MT1S"])
def test_years_and_months_are_ambiguous(text: str) -> None:
    with pytest.raises(ScheduleError, match=r"years or months.*ambiguous") as error:
        parse_iso_duration(text, setting="jobs.delete_unresolved_after")
    assert repr(text) in str(error.value)
    assert "jobs.delete_unresolved_after" in str(error.value)


@pytest.mark.parametrize("text", ["-PT10S", "PT-10S", "P-1D", " -P1D"])
def test_negative_durations_are_rejected(text: str) -> None:
    with pytest.raises(ScheduleError, match="negative") as error:
        parse_iso_duration(text)
    assert repr(text) in str(error.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "expected a form like PT10S"),
        ("P", "expected a form like PT10S"),
        ("PT", "expected a form like PT10S"),
        ("P1DT", "expected a form like PT10S"),
        ("PT1M1H", "expected a form like PT10S"),
        ("PT.5S", "expected a form like PT10S"),
        ("PT1.S", "expected a form like PT10S"),
        ("PT1.5M", "expected a form like PT10S"),
        ("ten seconds", "expected a form like PT10S"),
        ("PT\u0663S", "expected a form like PT10S"),  # non-ASCII digit
        ("\u00b2", "expected a form like PT10S"),  # str.isdigit() but not int()-able
        ("PT1.1234567S", "finer than a microsecond"),
        ("P9999999999D", "too large"),
        ("PT" + "9" * 40 + "S", "too large"),
    ],
)
def test_other_invalid_durations(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment) as error:
        parse_iso_duration(text, setting="jobs.heartbeat_interval")
    assert repr(text) in str(error.value)
    assert "jobs.heartbeat_interval" in str(error.value)


def test_non_string_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="10"):
        parse_iso_duration(10)  # type: ignore[arg-type]


def _parses_or_schedule_error(text: str) -> None:
    try:
        value = parse_iso_duration(text)
    except ScheduleError:
        return
    assert value >= timedelta(0)
    assert parse_iso_duration(format_iso_duration(value)) == value


@settings(max_examples=examples(300))
@given(st.text())
def test_fuzz_any_text_raises_only_schedule_error(text: str) -> None:
    _parses_or_schedule_error(text)


@settings(max_examples=examples(300))
@given(
    st.from_regex(
        r"\s?-?[pP]?[0-9]{0,5}[YyMmWwDd]?[tT]?[0-9]{0,5}[HhMm]?[0-9]{0,5}[.,]?[0-9]{0,9}"
        r"(ms|[SsMmHhDd])?\s?",
        fullmatch=True,
    )
)
def test_fuzz_near_valid_text_raises_only_schedule_error(text: str) -> None:
    _parses_or_schedule_error(text)
