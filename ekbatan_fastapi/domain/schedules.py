"""Schedules: when a recurring job's slots fall (pure functions of the time passed in).

A schedule never reads a clock: the scheduler passes ``now`` (the database clock) in.
Every datetime taken or returned is timezone-aware; results are in UTC. The base class and
jitter are in ``schedule``, the wall-clock schedules (``Daily``, ``Cron``) in ``wallclock``;
this module has the fixed ones, the string forms and the ``Schedules`` factory.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from .durations import format_iso_duration, parse_iso_duration
from .errors import ScheduleError
from .schedule import COUNT_CAP, Jittered, Schedule, beyond_range, positive, utc
from .wallclock import UTC_ZONE, Cron, Daily, load_zone, zone_of

__all__ = [
    "Cron",
    "Daily",
    "Disabled",
    "FixedDelay",
    "FixedRate",
    "Jittered",
    "Schedule",
    "Schedules",
    "parse_schedule",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class FixedDelay(Schedule):
    """Run again ``delay`` after the previous run finished."""

    delay: timedelta

    def __post_init__(self) -> None:
        positive(self.delay, "a fixed-delay delay")

    def initial_execution_time(self, now: datetime) -> datetime:
        return utc(now, "now")

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        # the usual case (UTC datetimes: the database's, the clock's) tested here, not in utc()
        if not (now.__class__ is last_slot.__class__ is datetime) or not (
            now.tzinfo is last_slot.tzinfo is UTC
        ):
            utc(last_slot, "last_slot")
            now = utc(now, "now")
        try:
            return now + self.delay
        except OverflowError:
            raise beyond_range("fixed-delay") from None

    def describe(self) -> str:
        return f"FIXED_DELAY|{format_iso_duration(self.delay)}"


@dataclass(frozen=True)
class FixedRate(Schedule):
    """Run every ``period`` on a fixed grid from the first slot; it never drifts."""

    period: timedelta

    def __post_init__(self) -> None:
        positive(self.period, "a fixed-rate period")

    def initial_execution_time(self, now: datetime) -> datetime:
        return utc(now, "now")

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """``last_slot + k * period`` for the smallest k >= 1 that lies after ``now``."""
        last, current = utc(last_slot, "last_slot"), utc(now, "now")
        steps = max(1, (current - last) // self.period + 1)
        try:
            return last + self.period * steps
        except OverflowError:
            raise beyond_range("fixed-rate") from None

    def describe(self) -> str:
        return f"FIXED_RATE|{format_iso_duration(self.period)}"

    def following(self, slot: datetime) -> datetime:
        return utc(slot, "slot") + self.period

    def previous(self, slot: datetime) -> datetime:
        return utc(slot, "slot") - self.period

    def latest_at_or_before(self, first: datetime, instant: datetime) -> datetime:
        return first + self.period * max(0, (instant - first) // self.period)

    def back(self, slot: datetime, steps: int) -> datetime:
        return slot - self.period * steps

    def count_slots(self, first: datetime, last: datetime, cap: int = COUNT_CAP) -> int:
        """Exact, whatever ``cap``: a grid needs no walking."""
        return 0 if last < first else (last - first) // self.period + 1

    def aligned(self) -> FixedRate:
        return _AlignedRate(self.period)


@dataclass(frozen=True)
class _AlignedRate(FixedRate):
    """A fixed rate whose slots are whole multiples of the period since the Unix epoch (what
    ``with_jitter`` uses: an instance can tell a slot from its jittered time)."""

    def initial_execution_time(self, now: datetime) -> datetime:
        now = utc(now, "now")
        slot = self.slot_at_or_before(now)
        return slot if slot == now else slot + self.period

    def slot_at_or_before(self, instant: datetime) -> datetime:
        return _EPOCH + self.period * ((utc(instant, "instant") - _EPOCH) // self.period)


@dataclass(frozen=True)
class Disabled(Schedule):
    """The schedule that never runs; a job with it has no row in the table."""

    @property
    def is_disabled(self) -> bool:
        return True

    def initial_execution_time(self, now: datetime) -> datetime:
        raise ScheduleError("disabled schedule has no execution time")

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        raise ScheduleError("disabled schedule has no execution time")

    def describe(self) -> str:
        return "-"


_FORMS = (
    "FIXED_DELAY|<duration>, FIXED_RATE|<duration>, DAILY|HH:MM[,HH:MM...][|zone], "
    "CRON|<cron expression>[|zone] or - (disabled), each optionally followed by |JITTER=PT30S"
)
_DURATION_FORM = "{0}|<seconds>s or {0}|<ISO-8601 duration>, e.g. {0}|120s or {0}|PT2M"
_EXPECTED = {
    "FIXED_DELAY": _DURATION_FORM.format("FIXED_DELAY"),
    "FIXED_RATE": _DURATION_FORM.format("FIXED_RATE"),
    "DAILY": "DAILY|HH:MM[:SS][,HH:MM...][|zone], e.g. DAILY|12:00,13:45|Europe/Rome",
    "CRON": "CRON|<cron expression: 5 fields, or 6 with seconds first>[|zone], e.g. "
    "CRON|0 2 * * *|Europe/Rome",
}
_JITTER = "JITTER="
_LEGACY_SECONDS = re.compile(r"([0-9]{1,15})[sS]")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")


def _invalid(text: str, reason: str, expected: str) -> ScheduleError:
    return ScheduleError(f"invalid schedule {text!r}: {reason}; expected {expected}")


def _parse_time(item: str) -> time:
    match = _TIME.fullmatch(item.strip())
    try:
        if match is not None:
            return time(int(match[1]), int(match[2]), int(match[3] or 0))
    except ValueError:
        pass
    raise ScheduleError(f"{item.strip()!r} is not a time of day")


def _build(kind: str, parts: list[str]) -> Schedule:
    """The schedule of ``kind`` from the (stripped) ``|``-separated parts after the kind."""
    if kind in ("FIXED_DELAY", "FIXED_RATE"):
        if len(parts) != 1:
            raise ScheduleError(f"{kind} takes exactly one duration")
        legacy = _LEGACY_SECONDS.fullmatch(parts[0])
        duration = timedelta(seconds=int(legacy[1])) if legacy else parse_iso_duration(parts[0])
        return FixedDelay(duration) if kind == "FIXED_DELAY" else FixedRate(duration)
    if len(parts) > 2:
        raise ScheduleError("too many '|' parts")
    zone = load_zone(parts[1]) if len(parts) == 2 else UTC_ZONE
    if kind == "CRON":
        # db-scheduler's string form: six fields are seconds first by its own rule
        return Cron(parts[0], zone, seconds=len(parts[0].split()) == 6)
    return Daily(tuple(_parse_time(item) for item in parts[0].split(",")), zone)


_PARSED_KEPT = 4096
"""Schedule strings whose parse is kept (``parse_schedule``)."""


def parse_schedule(text: str) -> Schedule:
    """Parse db-scheduler's string forms (``FIXED_DELAY|120s``, ``DAILY|12:00|Europe/Rome``,
    ``-``) plus ours (ISO durations, ``FIXED_RATE|PT1H``, ``CRON|0 2 * * *|UTC``).

    Raises ScheduleError, quoting ``text`` and the expected form, for anything else. The
    last ``_PARSED_KEPT`` strings' schedules are kept (they are immutable): a schedule row is
    read at each of its slots, and 1,000 rows of one schedule coming due together parse it
    once (an error is not kept)."""
    if type(text) is not str:
        if not isinstance(text, str):
            raise ScheduleError(f"a schedule must be a string such as {_FORMS}, got {text!r}")
        text = str(text)
    return _parse(text)


@functools.lru_cache(maxsize=_PARSED_KEPT)
def _parse(text: str) -> Schedule:
    stripped = text.strip()
    if stripped == "-":
        return Disabled()
    if not stripped:
        raise _invalid(text, "it is empty", _FORMS)
    kind, separator, rest = stripped.partition("|")
    kind = kind.strip().upper()
    expected = _EXPECTED.get(kind)
    if expected is None:
        raise _invalid(text, f"unknown kind {kind!r}", _FORMS)
    if not separator:
        raise _invalid(text, f"nothing follows {kind}", expected)
    parts = [part.strip() for part in rest.split("|")]
    jitter = None
    if parts and parts[-1].upper().startswith(_JITTER):
        jitter = parts.pop()[len(_JITTER) :].strip()
        expected += f", optionally followed by |{_JITTER}<ISO-8601 duration>"
    try:
        schedule = _build(kind, parts)
        return schedule if jitter is None else Jittered(schedule, parse_iso_duration(jitter))
    except ScheduleError as exc:
        raise _invalid(text, str(exc), expected) from None
    except OverflowError:  # FIXED_DELAY|99999999999999s: past the longest timedelta
        raise _invalid(text, "the duration is too large", expected) from None


class Schedules:
    """Factory functions, named after db-scheduler's ``Schedules``."""

    fixed_delay = staticmethod(FixedDelay)
    fixed_rate = staticmethod(FixedRate)
    disabled = staticmethod(Disabled)
    parse_schedule = staticmethod(parse_schedule)

    @staticmethod
    def daily(*times: time, zone: str | ZoneInfo | None = None) -> Daily:
        """Run at these wall-clock times each day in ``zone`` (default UTC)."""
        return Daily(times, zone_of(zone))

    @staticmethod
    def cron(expression: str, zone: str | ZoneInfo | None = None, *, seconds: bool = False) -> Cron:
        """Run when the cron ``expression`` matches: five fields (minute hour day-of-month
        month weekday), or six with ``seconds=True`` (second first, as in db-scheduler:
        ``Schedules.cron("0 */5 * * * *", seconds=True)``). Six fields without it are an
        error that shows how they read: a stray field must not silently mean another
        schedule."""
        return Cron(expression, zone_of(zone), seconds=seconds)
