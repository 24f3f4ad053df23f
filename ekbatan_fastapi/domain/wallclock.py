"""Wall-clock schedules: ``Daily`` and ``Cron``, whose slots are local times in an IANA zone.

One DST rule for both: a wall time that does not exist that day runs once, at the first
instant after the gap; a wall time that occurs twice runs once, at its first occurrence.
Slots are a pure function of the clock, so every instance computes the same ones.
"""

from __future__ import annotations

import abc
import copy
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from .errors import ScheduleError
from .schedule import TICK, Schedule, beyond_range, utc

__all__ = ["UTC_ZONE", "Cron", "Daily", "load_zone", "resolve_wall", "zone_of"]

UTC_ZONE = ZoneInfo("UTC")
_CRON_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_CRON_PROBE_START = datetime(2000, 1, 1, tzinfo=UTC)
_CRON_MAX_STEPS = 100_000  # a per-second cron skips at most 3600 slots in a repeated hour
_CRON_CACHE = 1024
"""Distinct cron texts whose validation and parsed form are kept (an application has few)."""
_SLOT_CACHE = 4096
"""Cron slots kept by (expression, zone, instant): startup asks every job for its first slot
after the same database now, so 100,000 jobs of one expression compute it once."""
_DAILY_LOOKBACK = timedelta(days=3)
"""A daily schedule has a slot within any three days, even where a zone skips a day."""


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The naive local wall-clock time of ``instant`` in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def resolve_wall(wall: datetime, zone: ZoneInfo) -> datetime:
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


def load_zone(key: str) -> ZoneInfo:
    """ZoneInfo for an IANA key; ScheduleError naming the key if there is no such zone."""
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown time zone {key!r}; expected an IANA name such as Europe/Rome or UTC"
        ) from None


def zone_of(zone: str | ZoneInfo | None) -> ZoneInfo:
    """Normalise a zone argument: None is UTC, a string is an IANA key."""
    if zone is None:
        return UTC_ZONE
    if isinstance(zone, str):
        return load_zone(zone)
    if not isinstance(zone, ZoneInfo) or zone.key is None:
        raise ScheduleError(f"zone must be an IANA ZoneInfo or name, got {zone!r}")
    return zone


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
            return self._first_slot_after(instant - TICK if inclusive else instant)
        except OverflowError:
            raise beyond_range(type(self).__name__) from None

    def initial_execution_time(self, now: datetime) -> datetime:
        """The first slot at or after ``now``."""
        return self._slot_after(utc(now, "now"), inclusive=True)

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """The first slot strictly after both ``now`` and ``last_slot``."""
        return self._slot_after(max(utc(now, "now"), utc(last_slot, "last_slot")))

    def _slot_near(self, instant: datetime) -> datetime:
        """Some slot at or before ``instant`` (the search starts from it)."""
        return self._slot_after(instant - _DAILY_LOOKBACK)

    def following(self, slot: datetime) -> datetime:
        return self._slot_after(utc(slot, "slot"))

    def slot_at_or_before(self, instant: datetime) -> datetime:
        """The latest slot at or before ``instant``: a slot near it, then forward."""
        instant = utc(instant, "instant")
        slot = self._slot_near(instant)
        for _ in range(_CRON_MAX_STEPS):
            after = self._slot_after(slot)
            if after > instant:
                return slot
            slot = after
        raise beyond_range(type(self).__name__)  # pragma: no cover - needs a pathological case

    def previous(self, slot: datetime) -> datetime:
        return self.slot_at_or_before(utc(slot, "slot") - TICK)

    def _init_zone(self) -> None:
        """Normalise ``zone`` (frozen dataclass field) and record its key for eq/hash."""
        zone = zone_of(self.zone)
        object.__setattr__(self, "zone", zone)
        object.__setattr__(self, "_zone_key", zone.key)

    def _zone_suffix(self) -> str:
        return "" if self.zone.key == "UTC" else f"|{self.zone.key}"


@dataclass(frozen=True)
class Daily(_WallClock):
    """Run at the given wall-clock times every day, in an IANA zone (UTC by default)."""

    times: tuple[time, ...]
    zone: ZoneInfo = field(default=UTC_ZONE, compare=False)
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
                slot = resolve_wall(datetime.combine(day, value), self.zone)
                if slot > instant:
                    return slot
            day += timedelta(days=1)
        raise beyond_range("daily")  # pragma: no cover - unreachable for real zones

    def describe(self) -> str:
        shown = ",".join(t.strftime("%H:%M:%S" if t.second else "%H:%M") for t in self.times)
        return f"DAILY|{shown}{self._zone_suffix()}"


def _validate_cron(expression: str) -> None:
    """Raise ScheduleError unless ``expression`` is a 5/6-field cron or an alias that matches.
    Judged once per text (``_cron_problem``): the same message every time."""
    problem = _cron_problem(expression)
    if problem is not None:
        raise ScheduleError(problem)


@functools.lru_cache(maxsize=_CRON_CACHE)
def _cron_problem(expression: str) -> str | None:
    """What is wrong with ``expression`` (None: nothing), kept per text."""
    try:
        _judge_cron(expression)
    except ScheduleError as error:
        return str(error)
    return None


@functools.lru_cache(maxsize=_CRON_CACHE)
def _cron_template(expression: str) -> croniter:
    """The parsed expression (croniter's expanded fields), parsed once per text; ``_matches``
    copies it for each search."""
    return croniter(expression, _CRON_PROBE_START, ret_type=datetime, second_at_beginning=True)


def _matches(expression: str, start: datetime) -> croniter:
    """A croniter over ``expression`` positioned at ``start``, without parsing it again. The
    copy owns its position and its ``#`` sets (croniter updates those in place)."""
    matches = copy.copy(_cron_template(expression))
    matches.nth_weekday_of_month = {
        day: set(nth) for day, nth in matches.nth_weekday_of_month.items()
    }
    matches.set_current(start, force=True)
    return matches


def _judge_cron(expression: str) -> None:
    """``_validate_cron``'s rules, uncached."""
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
    if not expression.startswith("@"):
        _check_fields(expression)
    try:
        _matches(expression, _CRON_PROBE_START).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError(f"cron expression {expression!r} never matches a date") from None
    except Exception as exc:  # croniter raises assorted exception types for bad input
        raise ScheduleError(f"invalid cron expression {expression!r}: {exc}") from None


_CRON_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("weekday", 0, 7),
)
_NUMERIC_ITEM = re.compile(r"(\*|\d+|\d+-\d+)(?:/(\d+))?")


def _looks_like_seconds_last(fields: list[str]) -> bool:
    """Six fields, every second, and a last field that is no plausible weekday: croniter's
    own six-field order (seconds last) written for ours (seconds first)."""
    last = fields[-1]
    return (
        len(fields) == 6
        and fields[0] == "*"
        and ("/" in last or any(int(n) > 7 for n in re.findall(r"\d+", last)))
    )


def _check_seconds(expression: str, seconds: bool) -> None:
    """Six fields only with ``seconds=True``, and ``seconds=True`` only with six fields."""
    fields = expression.split()
    if len(fields) == 6 and not seconds:
        reading = ", ".join(
            f"{name} {text}" for text, (name, _, _) in zip(fields, _CRON_FIELDS, strict=True)
        )
        raise ScheduleError(
            f"cron expression {expression!r} has six fields, which read {reading} (seconds "
            f"first, as in db-scheduler): if that is meant, say so with seconds=True "
            f"(Schedules.cron({expression!r}, seconds=True)); a five-field cron is minute "
            f"hour day-of-month month weekday, e.g. {' '.join(fields[:5])!r}"
        )
    if seconds and len(fields) != 6:
        raise ScheduleError(
            f"cron expression {expression!r} has no seconds field, but seconds=True was "
            "given: six fields put seconds first (e.g. '30 0 2 * * *' is 02:00:30); drop "
            "seconds=True for a five-field cron or an alias"
        )


def _check_fields(expression: str) -> None:
    """Each field on its own, named as the user wrote it: values and steps in range (croniter
    accepts ``*/61`` seconds), then what croniter makes of the field alone (names, ``L``,
    ``W``, ``#``)."""
    fields = expression.split()
    bad = f"invalid cron expression {expression!r}:"
    if _looks_like_seconds_last(fields):
        order = " ".join([fields[-1], *fields[:-1]])
        raise ScheduleError(
            f"{bad} its last field {fields[-1]!r} looks like seconds, "
            "but six fields read second minute hour day-of-month month weekday (seconds first, "
            f"as in db-scheduler and Spring; croniter's seconds-last order is not used): write "
            f"{order!r}"
        )
    spec = _CRON_FIELDS[-len(fields) :]
    for text, (name, low, high) in zip(fields, spec, strict=True):
        for item in text.split(","):
            match = _NUMERIC_ITEM.fullmatch(item)
            if match is None:
                continue  # names, L, W, #, ?: croniter judges them below
            values, step = match.groups()
            for number in re.findall(r"\d+", values):
                if not low <= int(number) <= high:
                    raise ScheduleError(
                        f"{bad} {number} in the {name} field {text!r} "
                        f"is out of range; {name} values go from {low} to {high}"
                    )
            if step is not None and not 1 <= int(step) <= high:
                raise ScheduleError(
                    f"{bad} the step /{step} in the {name} field "
                    f"{text!r} is out of range; {name} steps go from 1 to {high}"
                )
    for index, (text, (name, _, _)) in enumerate(zip(fields, spec, strict=True)):
        alone = ["*"] * len(fields)
        alone[index] = text
        try:
            croniter(" ".join(alone), _CRON_PROBE_START, second_at_beginning=True)
        except Exception:  # croniter's message shows its own field order: ours is clearer
            raise ScheduleError(
                f"{bad} the {name} field {text!r} is not valid; use "
                "numbers, ranges (1-5), lists (1,3), steps (*/15, 0-30/5)"
                + {"month": ", names (JAN)", "weekday": ", names (MON), 5#3 (third Friday)"}.get(
                    name, ""
                )
                + (", L or W (15W)" if name == "day-of-month" else "")
            ) from None


@dataclass(frozen=True)
class Cron(_WallClock):
    """Run at the times a cron expression matches, in an IANA zone (UTC by default).

    Five fields are standard cron (minute hour day-of-month month weekday). Six fields put
    seconds first (db-scheduler's and Spring's order: ``0 */5 * * * *`` is every five
    minutes) and need ``seconds=True``: a stray sixth field (``0 2 * * * *`` written for
    ``0 2 * * *``) would otherwise silently mean another schedule. The string form
    (``CRON|...``, db-scheduler's) reads six fields as seconds first by itself. Aliases such
    as ``@daily`` are accepted.
    """

    expression: str
    zone: ZoneInfo = field(default=UTC_ZONE, compare=False)
    seconds: bool = field(default=False, compare=False, kw_only=True)
    """The expression has six fields, seconds first (checked: six fields need it, and it
    needs six fields)."""
    _zone_key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ScheduleError(f"a cron expression must be a string, got {self.expression!r}")
        expression = " ".join(self.expression.split())
        _validate_cron(expression)
        _check_seconds(expression, self.seconds)
        object.__setattr__(self, "expression", expression)
        self._init_zone()

    def _first_slot_after(self, instant: datetime) -> datetime:
        return _cron_slot_after(self.expression, self.zone, instant)

    def _slot_near(self, instant: datetime) -> datetime:
        # The previous match in wall-clock time maps to an instant at or before ``instant``
        # (our DST mapping is monotonic); in a repeated hour it may be an earlier one, and
        # ``slot_at_or_before`` walks forward from it.
        start = _wall(instant, self.zone).replace(tzinfo=UTC) + TICK
        try:
            matches = _matches(self.expression, start)
            for _ in range(_CRON_MAX_STEPS):
                slot = resolve_wall(matches.get_prev(datetime).replace(tzinfo=None), self.zone)
                if slot <= instant:
                    return slot
        except Exception as exc:  # croniter gives up near the start of the calendar
            raise ScheduleError(f"cron {self.expression!r} has no earlier slot: {exc}") from None
        raise beyond_range("cron")  # pragma: no cover - needs a pathological expression

    def describe(self) -> str:
        return f"CRON|{self.expression}{self._zone_suffix()}"


@functools.lru_cache(maxsize=_SLOT_CACHE)
def _cron_slot_after(expression: str, zone: ZoneInfo, instant: datetime) -> datetime:
    """The earliest slot of ``expression`` in ``zone`` strictly after the UTC ``instant``.

    Iterate matches in naive wall-clock time (encoded as UTC so that croniter does no zone
    arithmetic), then map each to an instant with our DST rule. The mapping is monotonic, so
    the first mapped match after ``instant`` is the answer. A pure function, kept per
    arguments (errors are not kept)."""
    start = _wall(instant, zone).replace(tzinfo=UTC)
    try:
        matches = _matches(expression, start)
        for _ in range(_CRON_MAX_STEPS):
            wall = matches.get_next(datetime).replace(tzinfo=None)
            slot = resolve_wall(wall, zone)
            if slot > instant:
                return slot
    except OverflowError:
        raise
    except Exception as exc:  # croniter gives up near the end of the calendar
        raise ScheduleError(f"cron {expression!r} has no next slot: {exc}") from None
    raise beyond_range("cron")  # pragma: no cover - needs a pathological expression
