"""Property-based tests over every parser a user or a row can feed (issue 27, "Also").

ISO durations, schedule strings (db-scheduler's forms and ours), cron expressions, the
settings' duration and number fields (through to a built registry), table names, task data
(plain and typed), the MySQL literals, and history paging. The properties: only the
library's documented errors come out, what a formatter writes parses back to the same value,
and accepted values are within their bounds. Bounded and deterministic (``derandomize``):
the file runs in seconds. ``tests/test_bad_input_properties.py``,
``tests/test_bad_input_names.py`` and the fuzz tests of ``test_schedules.py`` and
``test_durations.py`` cover arbitrary text; these build near-valid input from the grammars.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    JobRegistry,
    Schedule,
    Schedules,
    job_registry,
    parse_schedule,
)
from ekbatan_fastapi.domain.codec import (
    DataModel,
    TaskDataError,
    TaskDataInvalid,
    decode_data,
    encode_data,
)
from ekbatan_fastapi.domain.durations import format_iso_duration, parse_iso_duration
from ekbatan_fastapi.domain.errors import ScheduleError
from ekbatan_fastapi.engine.config import MAX_CLAIM_AHEAD, MIN_MISSED_HEARTBEATS
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.store.mysql.literals import quote_text
from ekbatan_fastapi.store.tables import Tables, validate_table_name

from .helpers import examples

QUICK = settings(max_examples=examples(100), deadline=None, derandomize=True)
DOCUMENTED = (ConfigurationError, ScheduleError)
URL = "postgresql+asyncpg://u@127.0.0.1:1/db"  # never connected: build() opens nothing

# -- ISO durations ----------------------------------------------------------------------------

_MAX = timedelta(days=999_999_999)


@QUICK
@given(st.timedeltas(min_value=timedelta(0), max_value=_MAX))
def test_a_formatted_duration_parses_back(value: timedelta) -> None:
    text = format_iso_duration(value)
    assert parse_iso_duration(text) == value
    assert parse_iso_duration(text.lower()) == value


def _number(digits: int) -> st.SearchStrategy[str]:
    return st.integers(0, 10**digits - 1).map(str)


@st.composite
def _iso(draw: st.DrawFn) -> tuple[str, int | None]:
    """An ISO-8601 duration as people write them (any case, ``,`` decimals, spaces around),
    and its length in microseconds where it has one."""
    weeks = draw(st.none() | _number(4))
    days = draw(st.none() | _number(12))
    hours = draw(st.none() | _number(12))
    minutes = draw(st.none() | _number(12))
    seconds = draw(st.none() | _number(14))
    fraction = draw(st.none() | st.text("0123456789", min_size=1, max_size=8))
    fraction = fraction if seconds is not None else None
    comma = draw(st.booleans())
    text = "P" + (f"{weeks}W" if weeks else "") + (f"{days}D" if days else "")
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds is not None:
        clock += seconds + (("," if comma else ".") + fraction if fraction else "") + "S"
    text += f"T{clock}" if clock else ""
    text = "".join(c.lower() if draw(st.booleans()) else c for c in text)
    text = draw(st.sampled_from(["", " ", "\t"])) + text + draw(st.sampled_from(["", " "]))
    if fraction and len(fraction.rstrip("0")) > 6:
        return text, None
    whole = int(weeks or 0) * 7 * 86400 + int(days or 0) * 86400
    whole += int(hours or 0) * 3600 + int(minutes or 0) * 60 + int(seconds or 0)
    micros = int((fraction or "").rstrip("0").ljust(6, "0")[:6])
    return text, whole * 1_000_000 + micros


@QUICK
@given(_iso())
def test_iso_durations_parse_to_their_length_or_are_refused(case: tuple[str, int | None]) -> None:
    text, micros = case
    try:
        value = parse_iso_duration(text, setting="jobs.polling-interval")
    except ScheduleError as error:
        assert repr(text) in str(error) and "jobs.polling-interval" in str(error)
        empty = re.fullmatch(r"\s*pt?\s*", text, re.I) is not None
        too_big = micros is not None and micros > _MAX // timedelta(microseconds=1)
        assert micros is None or empty or too_big, (text, error)
        return
    assert micros is not None and value == timedelta(microseconds=micros)
    assert value >= timedelta(0)


@QUICK
@given(st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.text())))
def test_durations_and_schedules_that_are_not_text_are_refused(value: Any) -> None:
    with pytest.raises(ScheduleError):
        parse_iso_duration(value)
    with pytest.raises(ScheduleError):
        parse_schedule(value)


# -- schedule strings and cron -----------------------------------------------------------------

ZONES = ["UTC", "Europe/Rome", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
_DURATIONS = st.timedeltas(timedelta(milliseconds=1), timedelta(days=3650))
_CRON_FIELD = st.one_of(
    st.just("*"),
    st.integers(0, 59).map(str),
    st.integers(1, 30).map("*/{}".format),
    st.builds("{}-{}".format, st.integers(0, 5), st.integers(6, 11)),
)


@st.composite
def _cron(draw: st.DrawFn) -> str:
    minute, hour = draw(_CRON_FIELD), draw(st.sampled_from(["*", "0", "*/6", "1-5", "23"]))
    day = draw(st.sampled_from(["*", "1", "15", "L", "1-7", "29"]))
    month = draw(st.sampled_from(["*", "1", "2", "*/3", "JAN", "12"]))
    weekday = draw(st.sampled_from(["*", "MON-FRI", "0", "6", "SUN"]))
    fields = [minute, hour, day, month, weekday]
    if draw(st.booleans()):
        fields.insert(0, draw(st.sampled_from(["0", "*/15", "30"])))
    return " ".join(fields)


_SCHEDULES = st.one_of(
    _DURATIONS.map(Schedules.fixed_delay),
    _DURATIONS.map(Schedules.fixed_rate),
    st.builds(
        lambda times, zone: Schedules.daily(*times, zone=zone),
        st.lists(st.times().map(lambda t: t.replace(microsecond=0)), min_size=1, max_size=3),
        st.sampled_from(ZONES),
    ),
)


@QUICK
@given(schedule=_SCHEDULES, padding=st.sampled_from(["", " ", "  "]))
def test_a_described_schedule_parses_back(schedule: Schedule, padding: str) -> None:
    text = schedule.describe()
    assert parse_schedule(padding + text + padding) == schedule
    kind, _, rest = text.partition("|")
    assert parse_schedule(f"{kind.lower()}|{rest}") == schedule


@QUICK
@given(expression=_cron(), zone=st.sampled_from(ZONES))
def test_cron_expressions_parse_back_and_move_forward(expression: str, zone: str) -> None:
    try:
        schedule = Schedules.cron(expression, zone)
    except ScheduleError:
        return  # e.g. day 29 of February only: refused by name (test_bad_input_properties)
    assert parse_schedule(schedule.describe()) == schedule
    assert parse_schedule(f"CRON|{expression}|{zone}") == schedule
    now = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    first = schedule.initial_execution_time(now)
    second = schedule.next_execution_time(first, first)
    assert now <= first < second and first.tzinfo is UTC


@QUICK
@given(seconds=st.integers(0, 10**15), kind=st.sampled_from(["FIXED_DELAY", "fixed_delay"]))
@example(seconds=10**14, kind="FIXED_DELAY")  # was an OverflowError
def test_db_scheduler_seconds_form(seconds: int, kind: str) -> None:
    """db-scheduler's ``FIXED_DELAY|120s``: whole seconds, or a ScheduleError when too long."""
    try:
        schedule = parse_schedule(f"{kind}|{seconds}s")
    except ScheduleError as error:
        assert seconds > _MAX.total_seconds() or seconds == 0, error
        return
    assert schedule == Schedules.fixed_delay(timedelta(seconds=seconds))


@QUICK
@given(schedule=_SCHEDULES, jitter=_DURATIONS)
def test_jitter_form_parses(schedule: Schedule, jitter: timedelta) -> None:
    text = f"{schedule.describe()}|JITTER={format_iso_duration(jitter)}"
    try:
        parsed = parse_schedule(text)
    except ScheduleError as error:
        assert repr(text) in str(error)  # a jitter longer than the schedule allows, say
        return
    assert parse_schedule(parsed.describe()) == parsed


# -- settings -----------------------------------------------------------------------------------

_DURATION_KEYS = [
    "polling_interval",
    "heartbeat_interval",
    "shutdown_max_wait",
    "delete_unresolved_after",
    "timeout_grace",
    "claim_ahead",
    "idle_transaction_timeout",
    "shutdown_results_wait",
]
_DURATION_VALUES = st.one_of(
    st.timedeltas(timedelta(0), _MAX).map(format_iso_duration),
    st.sampled_from(["PT0S", "PT0.001S", "P999999999D", "PT1S", "PT10S", "P1D", "PT0.000001S"]),
    _iso().map(lambda case: case[0]),
    st.timedeltas(timedelta(0), _MAX),
    st.integers(-(10**6), 10**6),
)


class _Tick(DistributedJob):
    def name(self) -> str:
        return "tick"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(seconds=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


@settings(max_examples=examples(80), deadline=None, derandomize=True)
@given(
    durations=st.dictionaries(st.sampled_from(_DURATION_KEYS), _DURATION_VALUES, max_size=4),
    missed=st.one_of(st.none(), st.integers(-10, 10**12), st.sampled_from(["6", "x", "1e3"])),
)
@example(durations={"heartbeat_interval": "P999999999D"}, missed=None)  # an OverflowError
def test_accepted_settings_are_in_bounds_and_build_a_registry(
    durations: dict[str, Any], missed: Any
) -> None:
    """Any mix of duration and number values: refused naming the key, or accepted within
    the bounds and turned into a registry, which refuses only with a ConfigurationError."""
    from ekbatan_fastapi.web.lifespan import build_registry

    jobs: dict[str, Any] = dict(durations)
    if missed is not None:
        jobs["missed_heartbeats_limit"] = missed
    try:
        parsed = EkbatanSettings(jobs=jobs)
    except ConfigurationError:
        return
    knobs = parsed.jobs
    for key in _DURATION_KEYS:
        value = getattr(knobs, key)
        assert value is None or timedelta(0) <= value <= _MAX, (key, value)
    assert isinstance(knobs.missed_heartbeats_limit, int)
    try:
        registry = build_registry(parsed, [_Tick()], connection=URL)
    except DOCUMENTED:
        return
    config = registry.scheduler.config
    assert config.missed_heartbeats_limit >= MIN_MISSED_HEARTBEATS
    assert timedelta(0) <= config.claim_ahead <= MAX_CLAIM_AHEAD
    assert config.polling_interval > timedelta(0) and config.heartbeat_interval > timedelta(0)


@settings(max_examples=examples(80), deadline=None, derandomize=True)
@given(
    poll=st.timedeltas(timedelta(0), _MAX),
    beat=st.timedeltas(timedelta(0), _MAX),
    missed=st.integers(0, 10**6),
)
@example(poll=timedelta(seconds=1), beat=timedelta(days=10**6), missed=6)  # an OverflowError
@example(poll=_MAX, beat=timedelta(seconds=1), missed=6)
def test_builder_intervals_build_or_are_refused(
    poll: timedelta, beat: timedelta, missed: int
) -> None:
    """Programmatic intervals up to the largest ``timedelta``: a registry, or a
    ConfigurationError; never an OverflowError from the arithmetic on them."""
    builder = (
        job_registry()
        .connection_provider(URL)
        .with_job(_Tick())
        .poll_interval(poll)
        .heartbeat_interval(beat)
        .customize_scheduler(lambda b: b.missed_heartbeats_limit(missed))
    )
    try:
        registry: JobRegistry = builder.build()
    except DOCUMENTED:
        return
    assert registry.scheduler.config.polling_interval == poll


# -- table names --------------------------------------------------------------------------------

_IDENT_CHARS = "abcXYZ_09٣é\n. -`\"'"


def _reference_table_name(name: str) -> bool:
    """An independent statement of the rule: one or two dot-separated ASCII identifiers of
    1 to 63 letters, digits and underscores, not starting with a digit."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2:
        return False
    for part in parts:
        if not 1 <= len(part) <= 63 or part[0].isdigit():
            return False
        if any(not (c.isascii() and (c.isalnum() or c == "_")) for c in part):
            return False
    return True


@QUICK
@given(
    st.one_of(
        st.text(_IDENT_CHARS, max_size=20),
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,70}(\.[A-Za-z_][A-Za-z0-9_]{0,70})?\n?"),
    )
)
def test_table_names_are_accepted_exactly_by_the_rule(name: str) -> None:
    try:
        validate_table_name(name)
    except ConfigurationError as error:
        assert not _reference_table_name(name), name
        assert repr(name) in str(error)
        return
    assert _reference_table_name(name), name
    tables = Tables(name)
    schema, _, table = name.rpartition(".")
    assert tables.tasks.name == table and tables.tasks.schema == (schema or None)


# -- task data ---------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or type(value) in (str, int, bool)


@QUICK
@given(_JSON)
def test_task_data_round_trips(data: Any) -> None:
    raw = encode_data(data, where="j/i")
    assert decode_data(raw, where="j/i") == data


_RAW = st.one_of(
    st.binary(max_size=60),
    _JSON.map(lambda v: encode_data(v, where="j/i") or b"null"),
    st.lists(
        st.sampled_from(
            [b"[", b"]", b"{", b"}", b'"a":', b",", b"NaN", b"-Infinity", b"1e400", b"1", b"\xff"]
        ),
        max_size=12,
    ).map(b"".join),
)


@QUICK
@given(_RAW)
def test_decoding_any_row_gives_plain_values_or_a_task_data_error(raw: bytes) -> None:
    try:
        value = decode_data(raw, where="j/i")
    except TaskDataError as error:
        assert "j/i" in str(error)
        return
    assert _plain(value), value


class _Model(BaseModel):
    n: int
    when: datetime | None = None
    tags: list[str] = []
    extra: Any = None


_TYPED = DataModel(_Model, "a job")


@QUICK
@given(_RAW)
def test_a_typed_job_reads_any_row_as_its_model_or_parks_it(raw: bytes) -> None:
    try:
        value = _TYPED.decode(raw, task_name="j", task_instance="i")
    except TaskDataInvalid as error:
        assert "j/i" in str(error)
        return
    assert type(value) is _Model and _plain(value.extra)


@QUICK
@given(
    data=st.one_of(
        _JSON,
        st.fixed_dictionaries(
            {"n": st.integers(-(2**70), 2**70)},
            optional={
                "when": st.datetimes(timezones=st.just(UTC)),
                "tags": st.lists(st.text(max_size=5), max_size=3),
                "extra": _JSON | st.floats(),
            },
        ),
    )
)
def test_typed_data_is_stored_and_read_back_or_refused(data: Any) -> None:
    try:
        raw = _TYPED.encode(data, where="j/i")
    except (TaskDataInvalid, ConfigurationError) as error:
        assert "j/i" in str(error)
        return
    assert raw is not None
    assert _TYPED.decode(raw, task_name="j", task_instance="i") == _TYPED.validate(
        data, where="j/i"
    )


# -- MySQL literals ----------------------------------------------------------------------------


def _read_literal(sql: str, no_backslash_escapes: bool) -> tuple[str, str]:
    """How MySQL reads a single-quoted literal at the start of ``sql``: (value, the rest)."""
    assert sql[0] == "'"
    out, i = [], 1
    escapes = {"0": "\x00", "n": "\n", "r": "\r", "Z": "\x1a", "t": "\t", "b": "\b"}
    while True:
        c = sql[i]
        if c == "'" and sql[i + 1 : i + 2] == "'":
            out.append("'")
            i += 2
        elif c == "'":
            return "".join(out), sql[i + 1 :]
        elif c == "\\" and not no_backslash_escapes:
            out.append(escapes.get(sql[i + 1], sql[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1


@QUICK
@given(
    value=st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
    | st.lists(st.sampled_from(["'", "\\", '"', "\x00", "\n", "#", "-- ", "😀", "a"])).map("".join),
    mode=st.booleans(),
)
def test_a_quoted_text_is_read_back_whole_in_its_mode(value: str, mode: bool) -> None:
    """The literal ends where it is meant to: what follows it stays SQL, in either mode."""
    literal = quote_text(value, mode)
    assert _read_literal(literal + " AND x", mode) == (value, " AND x")


@QUICK
@given(st.text(st.characters(categories=("Cs",)), min_size=1, max_size=3), st.booleans())
def test_text_with_a_lone_surrogate_is_refused(value: str, mode: bool) -> None:
    with pytest.raises(ValueError, match="surrogate"):
        quote_text("a" + value, mode)


# -- history paging ----------------------------------------------------------------------------


@pytest.fixture
async def history_client(registries: Any) -> AsyncIterator[Any]:
    registry = registries.build(_Tick())
    from ekbatan_fastapi.store.migrate import create_schema

    await create_schema(registry.engine)
    # three records of "tick": a page whose limit were not applied would show more than 1 or 2
    now = datetime.now(UTC)
    history = Tables().history
    async with registry.engine.begin() as conn:
        await conn.execute(
            history.insert(),
            [
                {
                    "task_name": "tick",
                    "task_instance": "recurring",
                    "execution_time": now - timedelta(minutes=i),
                    "started_at": now - timedelta(minutes=i),
                    "finished_at": now - timedelta(minutes=i),
                    "outcome": "succeeded",
                }
                for i in range(3)
            ],
        )
    yield registry.client


@settings(
    max_examples=examples(60),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    limit=st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 1000, 1001])),
    before=st.one_of(
        st.none(), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**63 - 1, 2**63])
    ),
    name=st.one_of(st.none(), st.just("tick"), st.text(max_size=5)),
)
@example(limit=50, before=0, name=None)  # answered, as no page of ids below 0
@example(limit=50, before=2**63, name="tick")  # a database error (bigint out of range)
async def test_history_paging_answers_or_refuses_by_name(
    history_client: Any, limit: int, before: int | None, name: str | None
) -> None:
    try:
        records = await history_client.history(name, limit=limit, before_id=before)
    except ConfigurationError as error:
        message = str(error)
        assert "limit" in message or "before" in message or "name" in message, message
        return
    assert 1 <= limit <= 1000 and len(records) <= limit
    assert before is None or 1 <= before <= 2**63 - 1


def test_time_strategy_is_not_empty() -> None:
    """(``st.times`` is used above; a sanity check that the module imported cleanly.)"""
    assert time(0, 0) < time(23, 59)
