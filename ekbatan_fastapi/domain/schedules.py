"""Schedules: when a recurring job's slots fall (pure functions of the time passed in).

A schedule never reads a clock: the scheduler passes ``now`` (the database clock) in.
Every datetime taken or returned is timezone-aware; results are in UTC. Wall-clock
schedules (``Daily``, ``Cron``) follow one DST rule: a wall time that does not exist that
day runs once, at the first instant after the gap; a wall time that occurs twice runs
once, at its first occurrence.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from .durations import format_iso_duration, parse_iso_duration
from .errors import ScheduleError

__all__ = [
    "Cron",
    "Daily",
    "Disabled",
    "FixedDelay",
    "FixedRate",
    "Schedule",
    "Schedules",
    "parse_schedule",
]

_UTC_ZONE = ZoneInfo("UTC")
_TICK = timedelta(microseconds=1)
_CRON_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_CRON_PROBE_START = datetime(2000, 1, 1, tzinfo=UTC)
_CRON_MAX_STEPS = 100_000  # a per-second cron skips at most 3600 slots in a repeated hour


def _utc(value: datetime, name: str) -> datetime:
    """``value`` in UTC; ScheduleError naming ``name`` if it is not an aware datetime."""
    if not isinstance(value, datetime):
        raise ScheduleError(f"{name} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{name} must be a timezone-aware datetime (UTC), got naive {value.isoformat()}"
        )
    return value.astimezone(UTC)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The naive local wall-clock time of ``instant`` in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def _resolve_wall(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant at which the naive wall time ``wall`` in ``zone`` runs.

    A repeated wall time (fall-back) maps to its first occurrence (fold=0). A wall time
    inside a gap (spring-forward) maps to the first instant after the gap, found by
    bisection between the two candidate instants (transitions fall on whole seconds).
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if _wall(first, zone) == wall:
        return first
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)  # before the transition
    if low >= first:
        return first
    low_s, high_s = 0, int((first - low).total_seconds())
    while high_s - low_s > 1:
        mid = (low_s + high_s) // 2
        if _wall(low + timedelta(seconds=mid), zone) >= wall:
            high_s = mid
        else:
            low_s = mid
    return low + timedelta(seconds=high_s)


def _load_zone(key: str) -> ZoneInfo:
    """ZoneInfo for an IANA key; ScheduleError naming the key if there is no such zone."""
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown time zone {key!r}; expected an IANA name such as Europe/Rome or UTC"
        ) from None


def _zone(zone: str | ZoneInfo | None) -> ZoneInfo:
    """Normalise a zone argument: None is UTC, a string is an IANA key."""
    if zone is None:
        return _UTC_ZONE
    if isinstance(zone, str):
        return _load_zone(zone)
    if not isinstance(zone, ZoneInfo) or zone.key is None:
        raise ScheduleError(f"zone must be an IANA ZoneInfo or name, got {zone!r}")
    return zone


def _positive(value: timedelta, what: str) -> None:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        shown = format_iso_duration(value) if isinstance(value, timedelta) else repr(value)
        raise ScheduleError(f"{what} must be a positive duration, got {shown}")


def _beyond_range(what: str) -> ScheduleError:
    return ScheduleError(f"the next {what} slot lies beyond the supported datetime range")


class Schedule(abc.ABC):
    """When a recurring job runs. Implementations are immutable values."""

    @abc.abstractmethod
    def initial_execution_time(self, now: datetime) -> datetime:
        """The first slot, used when the job's row is created at ``now``."""

    @abc.abstractmethod
    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """The slot after a run of ``last_slot`` that finished at ``now``.

        Slots missed meanwhile are coalesced: deterministic schedules return a time
        strictly after ``now``.
        """

    @property
    def is_deterministic(self) -> bool:
        """True when the slots are a pure function of the wall clock (Daily, Cron)."""
        return False

    @property
    def is_disabled(self) -> bool:
        """True for the schedule that never runs (its row is removed)."""
        return False

    @abc.abstractmethod
    def describe(self) -> str:
        """The canonical string form; ``parse_schedule(s.describe()) == s``."""

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class FixedDelay(Schedule):
    """Run again ``delay`` after the previous run finished."""

    delay: timedelta

    def __post_init__(self) -> None:
        _positive(self.delay, "a fixed-delay delay")

    def initial_execution_time(self, now: datetime) -> datetime:
        return _utc(now, "now")

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        _utc(last_slot, "last_slot")
        try:
            return _utc(now, "now") + self.delay
        except OverflowError:
            raise _beyond_range("fixed-delay") from None

    def describe(self) -> str:
        return f"FIXED_DELAY|{format_iso_duration(self.delay)}"


@dataclass(frozen=True)
class FixedRate(Schedule):
    """Run every ``period`` on a fixed grid from the first slot; it never drifts."""

    period: timedelta

    def __post_init__(self) -> None:
        _positive(self.period, "a fixed-rate period")

    def initial_execution_time(self, now: datetime) -> datetime:
        return _utc(now, "now")

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """``last_slot + k * period`` for the smallest k >= 1 that lies after ``now``."""
        last, current = _utc(last_slot, "last_slot"), _utc(now, "now")
        steps = max(1, (current - last) // self.period + 1)
        try:
            return last + self.period * steps
        except OverflowError:
            raise _beyond_range("fixed-rate") from None

    def describe(self) -> str:
        return f"FIXED_RATE|{format_iso_duration(self.period)}"


class _WallClock(Schedule):
    """Shared logic of the schedules whose slots are wall-clock times in a zone."""

    zone: ZoneInfo

    @property
    def is_deterministic(self) -> bool:
        return True

    @abc.abstractmethod
    def _first_slot_after(self, instant: datetime) -> datetime:
        """The earliest slot strictly after the UTC ``instant``."""

    def _slot_after(self, instant: datetime, *, inclusive: bool = False) -> datetime:
        try:
            return self._first_slot_after(instant - _TICK if inclusive else instant)
        except OverflowError:
            raise _beyond_range(type(self).__name__) from None

    def initial_execution_time(self, now: datetime) -> datetime:
        """The first slot at or after ``now``."""
        return self._slot_after(_utc(now, "now"), inclusive=True)

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """The first slot strictly after both ``now`` and ``last_slot``."""
        return self._slot_after(max(_utc(now, "now"), _utc(last_slot, "last_slot")))

    def _init_zone(self) -> None:
        """Normalise ``zone`` (frozen dataclass field) and record its key for eq/hash."""
        zone = _zone(self.zone)
        object.__setattr__(self, "zone", zone)
        object.__setattr__(self, "_zone_key", zone.key)

    def _zone_suffix(self) -> str:
        return "" if self.zone.key == "UTC" else f"|{self.zone.key}"


@dataclass(frozen=True)
class Daily(_WallClock):
    """Run at the given wall-clock times every day, in an IANA zone (UTC by default)."""

    times: tuple[time, ...]
    zone: ZoneInfo = field(default=_UTC_ZONE, compare=False)
    _zone_key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        times = tuple(self.times)
        for value in times:
            if not isinstance(value, time) or value.tzinfo is not None or value.microsecond:
                raise ScheduleError(
                    f"daily times must be naive datetime.time values with whole seconds "
                    f"(the zone is separate), got {value!r}"
                )
        if not times:
            raise ScheduleError("a daily schedule needs at least one time of day")
        object.__setattr__(self, "times", tuple(sorted({t.replace(fold=0) for t in times})))
        self._init_zone()

    def _first_slot_after(self, instant: datetime) -> datetime:
        day: date = _wall(instant, self.zone).date() - timedelta(days=1)
        for _ in range(8):  # a slot exists within two days even when a zone skips a day
            for value in self.times:
                slot = _resolve_wall(datetime.combine(day, value), self.zone)
                if slot > instant:
                    return slot
            day += timedelta(days=1)
        raise _beyond_range("daily")  # pragma: no cover - unreachable for real zones

    def describe(self) -> str:
        shown = ",".join(t.strftime("%H:%M:%S" if t.second else "%H:%M") for t in self.times)
        return f"DAILY|{shown}{self._zone_suffix()}"


def _validate_cron(expression: str) -> None:
    """Raise ScheduleError unless ``expression`` is a 5/6-field cron or an alias that matches."""
    if not expression:
        raise ScheduleError("the cron expression is empty")
    if expression.startswith("@"):
        if expression.lower() == "@reboot":
            raise ScheduleError("cron '@reboot' has no time slots; it is not supported")
        if expression.lower() not in _CRON_ALIASES:
            raise ScheduleError(
                f"unknown cron alias {expression!r}; expected one of {', '.join(_CRON_ALIASES)}"
            )
    elif len(expression.split()) not in (5, 6):
        raise ScheduleError(
            f"cron expression {expression!r} has {len(expression.split())} fields; expected 5 "
            "(minute hour day month weekday) or 6 (second minute hour day month weekday)"
        )
    if "|" in expression or re.search(r"(?<![A-Z])[HR](?![A-Z])", expression.upper()):
        raise ScheduleError(
            f"cron expression {expression!r} uses '|', hashed (H) or random (R) fields, "
            "which are not supported: every instance must compute the same slots"
        )
    try:
        probe = croniter(expression, _CRON_PROBE_START, ret_type=datetime, second_at_beginning=True)
        probe.get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError(f"cron expression {expression!r} never matches a date") from None
    except Exception as exc:  # croniter raises assorted exception types for bad input
        raise ScheduleError(f"invalid cron expression {expression!r}: {exc}") from None


@dataclass(frozen=True)
class Cron(_WallClock):
    """Run at the times a cron expression matches, in an IANA zone (UTC by default).

    Five fields are standard cron; six fields put seconds first (Spring/Quartz style,
    ``0 */5 * * * *`` is every five minutes). Aliases such as ``@daily`` are accepted.
    """

    expression: str
    zone: ZoneInfo = field(default=_UTC_ZONE, compare=False)
    _zone_key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ScheduleError(f"a cron expression must be a string, got {self.expression!r}")
        expression = " ".join(self.expression.split())
        _validate_cron(expression)
        object.__setattr__(self, "expression", expression)
        self._init_zone()

    def _first_slot_after(self, instant: datetime) -> datetime:
        # Iterate matches in naive wall-clock time (encoded as UTC so that croniter does no
        # zone arithmetic), then map each to an instant with our DST rule. The mapping is
        # monotonic, so the first mapped match after ``instant`` is the answer.
        start = _wall(instant, self.zone).replace(tzinfo=UTC)
        try:
            matches = croniter(self.expression, start, ret_type=datetime, second_at_beginning=True)
            for _ in range(_CRON_MAX_STEPS):
                wall = matches.get_next(datetime).replace(tzinfo=None)
                slot = _resolve_wall(wall, self.zone)
                if slot > instant:
                    return slot
        except OverflowError:
            raise
        except Exception as exc:  # croniter gives up near the end of the calendar
            raise ScheduleError(f"cron {self.expression!r} has no next slot: {exc}") from None
        raise _beyond_range("cron")  # pragma: no cover - needs a pathological expression

    def describe(self) -> str:
        return f"CRON|{self.expression}{self._zone_suffix()}"


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
    "CRON|<cron expression>[|zone] or - (disabled)"
)
_DURATION_FORM = "{0}|<seconds>s or {0}|<ISO-8601 duration>, e.g. {0}|120s or {0}|PT2M"
_EXPECTED = {
    "FIXED_DELAY": _DURATION_FORM.format("FIXED_DELAY"),
    "FIXED_RATE": _DURATION_FORM.format("FIXED_RATE"),
    "DAILY": "DAILY|HH:MM[:SS][,HH:MM...][|zone], e.g. DAILY|12:00,13:45|Europe/Rome",
    "CRON": "CRON|<5 or 6 field cron expression>[|zone], e.g. CRON|0 2 * * *|Europe/Rome",
}
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
    zone = _load_zone(parts[1]) if len(parts) == 2 else _UTC_ZONE
    if kind == "CRON":
        return Cron(parts[0], zone)
    return Daily(tuple(_parse_time(item) for item in parts[0].split(",")), zone)


def parse_schedule(text: str) -> Schedule:
    """Parse db-scheduler's string forms (``FIXED_DELAY|120s``, ``DAILY|12:00|Europe/Rome``,
    ``-``) plus ours (ISO durations, ``FIXED_RATE|PT1H``, ``CRON|0 2 * * *|UTC``).

    Raises ScheduleError, quoting ``text`` and the expected form, for anything else.
    """
    if not isinstance(text, str):
        raise ScheduleError(f"a schedule must be a string such as {_FORMS}, got {text!r}")
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
    try:
        return _build(kind, [part.strip() for part in rest.split("|")])
    except ScheduleError as exc:
        raise _invalid(text, str(exc), expected) from None


class Schedules:
    """Factory functions, named after db-scheduler's ``Schedules``."""

    fixed_delay = staticmethod(FixedDelay)
    fixed_rate = staticmethod(FixedRate)
    disabled = staticmethod(Disabled)
    parse_schedule = staticmethod(parse_schedule)

    @staticmethod
    def daily(*times: time, zone: str | ZoneInfo | None = None) -> Daily:
        """Run at these wall-clock times each day in ``zone`` (default UTC)."""
        return Daily(times, _zone(zone))

    @staticmethod
    def cron(expression: str, zone: str | ZoneInfo | None = None) -> Cron:
        """Run when the 5- or 6-field (seconds first) cron ``expression`` matches."""
        return Cron(expression, _zone(zone))
