"""The ``Schedule`` base: when a recurring job's slots fall, and the slot arithmetic catch-up
policies and jitter need (pure functions of the times passed in; a schedule never reads a clock).

A *slot* is a nominal time of the schedule (10:00 for an hourly cron); its *due time* is when
it runs, the same instant unless the schedule has jitter (``with_jitter``). The row of a
recurring job holds the due time of its next slot.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from .durations import format_iso_duration
from .errors import ScheduleError

__all__ = ["COUNT_CAP", "Jittered", "Schedule"]

TICK = timedelta(microseconds=1)
COUNT_CAP = 10_000
"""Slots counted one by one at most (a wall-clock schedule down for long); beyond it a count
is reported as "at least"."""


def utc(value: datetime, name: str) -> datetime:
    """``value`` in UTC; ScheduleError naming ``name`` if it is not an aware datetime."""
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # the usual case (the database's times, the clock's): nothing to convert
    if not isinstance(value, datetime):
        raise ScheduleError(f"{name} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{name} must be a timezone-aware datetime (UTC), got naive {value.isoformat()}"
        )
    return value.astimezone(UTC)


def positive(value: timedelta, what: str) -> None:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        shown = format_iso_duration(value) if isinstance(value, timedelta) else repr(value)
        raise ScheduleError(f"{what} must be a positive duration, got {shown}")


def beyond_range(what: str) -> ScheduleError:
    return ScheduleError(f"the next {what} slot lies beyond the supported datetime range")


class Schedule(abc.ABC):
    """When a recurring job runs. Implementations are immutable values."""

    @abc.abstractmethod
    def initial_execution_time(self, now: datetime) -> datetime:
        """The first slot's due time, used when the job's row is created at ``now``."""

    @abc.abstractmethod
    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        """The due time after a run of the row time ``last_slot`` that finished at ``now``.

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

    # -- slots ---------------------------------------------------------------------------------

    def following(self, slot: datetime) -> datetime | None:
        """The slot right after ``slot``; None when the schedule has no grid (fixed delay)."""
        return None

    def previous(self, slot: datetime) -> datetime | None:
        """The slot right before ``slot``; None without a grid."""
        return None

    def slot_at_or_before(self, instant: datetime) -> datetime | None:
        """The latest slot at or before ``instant`` on an absolute grid (wall-clock schedules);
        None when the slots are not a function of the clock alone."""
        return None

    def latest_at_or_before(self, first: datetime, instant: datetime) -> datetime:
        """The latest slot of the sequence that starts at ``first`` lying at or before
        ``instant`` (``first`` itself when none later does, or without a grid)."""
        found = self.slot_at_or_before(instant)
        if found is not None:
            return max(first, found)
        slot = first
        for _ in range(COUNT_CAP):
            after = self.following(slot)
            if after is None or after > instant:
                return slot
            slot = after
        return slot

    def back(self, slot: datetime, steps: int) -> datetime:
        """The slot ``steps`` slots before ``slot`` (``slot`` itself without a grid)."""
        for _ in range(steps):
            before = self.previous(slot)
            if before is None:
                break
            slot = before
        return slot

    def count_slots(self, first: datetime, last: datetime, cap: int = COUNT_CAP) -> int:
        """How many slots lie in ``[first, last]``, starting from the slot ``first`` (at most
        ``cap``; 0 when ``last < first``)."""
        count, slot = 0, first
        while slot <= last and count < cap:
            count += 1
            after = self.following(slot)
            if after is None:
                break
            slot = after
        return count

    # -- due times (jitter) --------------------------------------------------------------------

    def slot_of(self, execution_time: datetime) -> datetime:
        """The slot a row due at ``execution_time`` stands for (itself without jitter)."""
        return execution_time

    def due_time(self, slot: datetime) -> datetime:
        """When ``slot`` runs (the slot itself without jitter)."""
        return slot

    def bind(self, task_name: str) -> Schedule:
        """This schedule for the job ``task_name`` (jitter derives its offsets from it)."""
        return self

    @property
    def jitter(self) -> timedelta | None:
        """The largest offset a slot's due time may have (None: no jitter)."""
        return None

    def with_jitter(self, jitter: timedelta) -> Jittered:
        """This schedule with each slot run a deterministic random offset later, at most
        ``jitter`` and always before the next slot (spreads many jobs due at the same time).
        ``ctx.execution_time`` stays the nominal slot, except for a fixed delay (no grid),
        where the jittered time is the slot. A fixed rate with jitter keeps its grid on whole
        multiples of its period since the Unix epoch, so that every instance agrees on it."""
        return Jittered(self, jitter)

    def aligned(self) -> Schedule:
        """The same slots on an absolute grid every instance can compute from the clock alone
        (a fixed rate counted from the Unix epoch); itself where the slots already are."""
        return self


def _fraction(key: str, slot: datetime) -> float:
    """A deterministic number in [0, 1) from the job's name and the slot."""
    digest = hashlib.sha256(f"{key}|{slot.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass(frozen=True)
class Jittered(Schedule):
    """``base`` with each slot's due time moved a deterministic random offset later: at most
    ``jitter``, always before the next slot, the same on every instance and for a revived
    execution (derived from the job's name and the slot)."""

    base: Schedule
    amount: timedelta
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.base, Schedule) or isinstance(self.base, Jittered):
            raise ScheduleError(f"jitter applies to one plain schedule, got {self.base!r}")
        if self.base.is_disabled:
            raise ScheduleError("a disabled schedule has no slots to jitter")
        positive(self.amount, "a jitter")
        object.__setattr__(self, "base", self.base.aligned())

    @property
    def jitter(self) -> timedelta:
        return self.amount

    @property
    def is_deterministic(self) -> bool:
        return self.base.is_deterministic

    def bind(self, task_name: str) -> Jittered:
        return replace(self, key=task_name)

    def describe(self) -> str:
        return f"{self.base.describe()}|JITTER={format_iso_duration(self.amount)}"

    def offset(self, slot: datetime) -> timedelta:
        bound = self.amount
        after = self.base.following(slot)
        if after is not None:
            bound = min(bound, after - slot)
        return timedelta(microseconds=int(_fraction(self.key, slot) * (bound // TICK)))

    def due_time(self, slot: datetime) -> datetime:
        return slot + self.offset(slot)

    def slot_of(self, execution_time: datetime) -> datetime:
        """The slot whose jittered time ``execution_time`` is; a time that is no slot's (a row
        made due by ``run_now``) stands for itself."""
        found = self.base.slot_at_or_before(execution_time)
        if found is None or self.due_time(found) != execution_time:
            return execution_time
        return found

    def initial_execution_time(self, now: datetime) -> datetime:
        now = utc(now, "now")
        if self.base.following(now) is None:  # no grid: the jittered time is the slot
            return self.due_time(self.base.initial_execution_time(now))
        slot = self.base.initial_execution_time(now - self.amount)
        return self._first_due_after(slot, now, inclusive=True)

    def next_execution_time(self, last_slot: datetime, now: datetime) -> datetime:
        now = utc(now, "now")
        if self.base.following(now) is None:
            return self.due_time(self.base.next_execution_time(last_slot, now))
        slot = self.base.next_execution_time(
            self.slot_of(utc(last_slot, "last_slot")), now - self.amount
        )
        return self._first_due_after(slot, now, inclusive=False)

    def _first_due_after(self, slot: datetime, now: datetime, *, inclusive: bool) -> datetime:
        """The due time of the first slot from ``slot`` on whose due time is after ``now``."""
        while True:
            due = self.due_time(slot)
            if due > now or (inclusive and due == now):
                return due
            after = self.base.following(slot)
            if after is None:  # pragma: no cover - only grid schedules get here
                return due
            slot = after

    def following(self, slot: datetime) -> datetime | None:
        return self.base.following(slot)

    def previous(self, slot: datetime) -> datetime | None:
        return self.base.previous(slot)

    def slot_at_or_before(self, instant: datetime) -> datetime | None:
        return self.base.slot_at_or_before(instant)

    def latest_at_or_before(self, first: datetime, instant: datetime) -> datetime:
        return self.base.latest_at_or_before(first, instant)

    def back(self, slot: datetime, steps: int) -> datetime:
        return self.base.back(slot, steps)

    def count_slots(self, first: datetime, last: datetime, cap: int = COUNT_CAP) -> int:
        return self.base.count_slots(first, last, cap)
