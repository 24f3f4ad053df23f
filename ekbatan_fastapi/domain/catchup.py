"""Catch-up policies: what a recurring job does with the slots that fell due while nothing ran
it (every instance down, a long execution, a paused job resumed).

``CatchUp.latest()`` (the default, db-scheduler's behaviour): the overdue row runs once, and
the slots missed meanwhile are coalesced into that run. ``CatchUp.all(max_slots)``: every
missed slot runs once, oldest first, each with its own ``ctx.execution_time``; beyond
``max_slots`` the oldest are skipped. ``CatchUp.skip(grace)``: a slot found more than
``grace`` late does not run; the latest one within ``grace`` does, or else the next future
slot is scheduled. The row stays db-scheduler's single row per job: the policy is applied
when an instance claims it (``plan``) and when an execution ends (``next_after_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .durations import format_iso_duration
from .errors import ScheduleError
from .schedule import COUNT_CAP, Schedule

__all__ = ["CatchUp", "SlotPlan", "next_after_run", "plan"]


@dataclass(frozen=True)
class CatchUp:
    """A recurring job's catch-up policy (``DistributedJob.catch_up()``)."""

    policy: str
    max_slots: int | None = None
    grace: timedelta | None = None

    @staticmethod
    def latest() -> CatchUp:
        """Run the overdue slot once; missed slots are coalesced into it (the default)."""
        return CatchUp("latest")

    @staticmethod
    def all(max_slots: int) -> CatchUp:
        """Run every missed slot once, oldest first; at most ``max_slots`` of them (the
        newest), the older ones are skipped and counted."""
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1:
            raise ScheduleError(
                f"CatchUp.all(max_slots=...) takes a whole number >= 1, got {max_slots!r}"
            )
        return CatchUp("all", max_slots=max_slots)

    @staticmethod
    def skip(grace: timedelta) -> CatchUp:
        """Do not run a slot found more than ``grace`` late; schedule the next one."""
        if not isinstance(grace, timedelta) or grace < timedelta(0):
            raise ScheduleError(
                f"CatchUp.skip(grace=...) takes a duration >= 0 (timedelta), got {grace!r}"
            )
        return CatchUp("skip", grace=grace)

    def describe(self) -> str:
        if self.policy == "all":
            return f"all(max_slots={self.max_slots})"
        if self.policy == "skip":
            assert self.grace is not None
            return f"skip(grace={format_iso_duration(self.grace)})"
        return "latest"


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """What a claimed recurring row does now."""

    slot: datetime | None
    """The slot to run (its ``ctx.execution_time``); None: run nothing, reschedule."""
    next_time: datetime | None = None
    """With ``slot`` None: the row's new due time."""
    skipped: int = 0
    """Slots the policy does not run (at least this many when ``capped``)."""
    skipped_from: datetime | None = None
    skipped_to: datetime | None = None
    capped: bool = False
    caught_up: bool = False
    """This run is of a slot whose successor is due too (latest would have coalesced it)."""


def _count(schedule: Schedule, first: datetime, last: datetime) -> tuple[int, bool]:
    count = schedule.count_slots(first, last, COUNT_CAP)
    return count, count == COUNT_CAP


def plan(schedule: Schedule, catch_up: CatchUp, row_time: datetime, now: datetime) -> SlotPlan:
    """The plan for a recurring row due at ``row_time``, claimed at ``now``."""
    first = schedule.slot_of(row_time)
    if catch_up.policy == "latest":
        return SlotPlan(first)
    if schedule.following(first) is None:  # no grid (fixed delay): nothing to catch up
        late = now - row_time
        if catch_up.policy == "skip" and catch_up.grace is not None and late > catch_up.grace:
            return SlotPlan(None, schedule.next_execution_time(row_time, now), 1, first, first)
        return SlotPlan(first)
    latest = _latest_due(schedule, first, now)
    if catch_up.policy == "all":
        assert catch_up.max_slots is not None
        due = schedule.count_slots(first, latest, catch_up.max_slots + 1)
        if due <= catch_up.max_slots:
            return SlotPlan(first, caught_up=first < latest)
        start = schedule.back(latest, catch_up.max_slots - 1)
        dropped_to = schedule.back(start, 1)
        count, capped = _count(schedule, first, dropped_to)
        return SlotPlan(start, None, count, first, dropped_to, capped, caught_up=start < latest)
    assert catch_up.grace is not None
    if now - schedule.due_time(latest) <= catch_up.grace:
        if latest == first:
            return SlotPlan(first)
        skipped_to = schedule.back(latest, 1)
        count, capped = _count(schedule, first, skipped_to)
        return SlotPlan(latest, None, count, first, skipped_to, capped)
    following = schedule.following(latest)
    assert following is not None
    count, capped = _count(schedule, first, latest)
    return SlotPlan(None, schedule.due_time(following), count, first, latest, capped)


def _latest_due(schedule: Schedule, first: datetime, now: datetime) -> datetime:
    """The latest slot from ``first`` on whose due time has come (``first`` at least)."""
    latest = schedule.latest_at_or_before(first, now)
    while latest > first and schedule.due_time(latest) > now:
        latest = schedule.back(latest, 1)
    return latest


def next_after_run(
    schedule: Schedule, catch_up: CatchUp, row_time: datetime, slot: datetime, finished: datetime
) -> tuple[datetime, int]:
    """After a run of ``slot`` (the row was due at ``row_time``) that ended at ``finished``:
    the row's next due time and how many slots that coalesces (missed, never run)."""
    following = schedule.following(slot)
    if catch_up.policy != "latest" and following is not None:
        return schedule.due_time(following), 0  # the next claim's plan decides
    next_time = schedule.next_execution_time(row_time, finished)
    if following is None:
        return next_time, 0
    next_slot = schedule.slot_of(next_time)
    if next_slot <= following:  # the usual case: nothing coalesced
        return next_time, 0
    last_missed = schedule.back(next_slot, 1)
    return next_time, schedule.count_slots(following, last_missed, COUNT_CAP)


def skip_message(plan: SlotPlan, catch_up: CatchUp | None) -> str:
    """The history's words for the slots ``plan`` skipped."""
    policy = f"CatchUp.{(catch_up or CatchUp.latest()).describe()}"
    count = f"at least {plan.skipped}" if plan.capped else str(plan.skipped)
    noun = "slot" if plan.skipped == 1 and not plan.capped else "slots"
    span = ""
    if plan.skipped_from is not None and plan.skipped_to is not None:
        span = f" {plan.skipped_from.isoformat()}"
        if plan.skipped_to != plan.skipped_from:
            span += f" to {plan.skipped_to.isoformat()}"
    why = (
        f"only the newest {catch_up.max_slots} run"
        if catch_up is not None and catch_up.policy == "all"
        else "found later than the grace"
    )
    return f"skipped {count} {noun}{span} ({policy}: {why})"
