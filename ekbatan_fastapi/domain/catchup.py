"""Catch-up policies: what a recurring job does with the slots that fell due while nothing ran
it (every instance down, a long execution, a paused job resumed).

``CatchUp.latest()`` (the default, db-scheduler's behaviour): the overdue row runs once, and
the slots missed meanwhile are coalesced into that run. ``CatchUp.all(max_slots)``: every
missed slot runs once, oldest first, each with its own ``ctx.execution_time``; beyond
``max_slots`` the oldest are skipped. ``CatchUp.skip(grace)``: a slot found more than
``grace`` late does not run; the latest one within ``grace`` does, or else the next future
slot is scheduled. The row stays db-scheduler's single row per job: the policy is applied
when an instance claims it (``plan``) and when an execution ends (``after_run``).

Every slot that passes without a run is in one span, ``PassedSlots``, with its
``SlotReason``: ``after_run`` gives the spans a run passed over (``coalesced``: due before it
started; ``overlap``: due while it ran, or skipped by ``Overlap.buffer_one``), and
``skipped_by_plan`` the span a claim's plan skipped (``catch_up``). The history's ``missed``
records, ``slot_missed``, the missed count and the streak all read these spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from .durations import format_iso_duration
from .errors import ScheduleError
from .overlap import Overlap
from .schedule import COUNT_CAP, Schedule

__all__ = [
    "MISSED_SLOTS_NAMED",
    "AfterRun",
    "CatchUp",
    "PassedSlots",
    "SlotPlan",
    "SlotReason",
    "after_run",
    "next_after_run",
    "passed_slots",
    "plan",
    "skipped_by_plan",
]

MISSED_SLOTS_NAMED = 100
"""Slots one completion names in the history (and in ``slot_missed`` events) at most, the
newest first; the older ones of each span are written as one summary record with their count
(a job down for a year on a 1 s schedule writes 101 records, not 31 million)."""


class SlotReason(StrEnum):
    """Why a slot of a recurring job passed without a run (``PassedSlots.reason``, the
    ``error_class`` of its ``missed`` history record, the ``reason`` of ``slot_missed``)."""

    COALESCED = "coalesced"
    """Merged by ``CatchUp.latest``: it fell due before (or as) the run that took its place
    started (every instance down, the job paused, the scheduler behind)."""
    OVERLAP = "overlap"
    """It fell due while the previous run was still going (``Overlap.skip``, the default,
    and ``Overlap.cancel_other``), or ``Overlap.buffer_one`` skipped it (only the first such
    slot runs)."""
    CATCH_UP = "catch_up"
    """Skipped by the catch-up policy (``CatchUp.all(max_slots)`` beyond its count,
    ``CatchUp.skip(grace)`` past its grace)."""


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


@dataclass(frozen=True, slots=True)
class PassedSlots:
    """The slots ``first`` .. ``last`` of a schedule that passed without a run, and why: what
    a completion decided beyond the slot it ran (``after_run``: merged by ``CatchUp.latest``,
    passed over by an overlap policy) or what a claim's plan skipped (``skipped_by_plan``).
    ``Execution.passed_spans()`` has them all; recorded, when ``record_missed_slots`` is on,
    as the newest ``MISSED_SLOTS_NAMED`` slots by name plus one summary record for the rest,
    and counted in the task's streak of missed slots."""

    first: datetime
    last: datetime
    count: int
    """How many slots ``first`` .. ``last`` holds (at least this many when ``capped``)."""
    reason: SlotReason
    capped: bool = False
    why: str = field(default="", compare=False)
    """Words for the history (the policy, the run it was merged into); not part of its
    identity."""


def skipped_by_plan(plan: SlotPlan, catch_up: CatchUp | None) -> PassedSlots | None:
    """The slots ``plan`` skipped (None: none)."""
    if not plan.skipped or plan.skipped_from is None or plan.skipped_to is None:
        return None
    policy = f"CatchUp.{(catch_up or CatchUp.latest()).describe()}"
    return PassedSlots(
        plan.skipped_from,
        plan.skipped_to,
        plan.skipped,
        SlotReason.CATCH_UP,
        plan.capped,
        f"skipped by {policy}",
    )


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


@dataclass(frozen=True, slots=True)
class AfterRun:
    """What follows a run of a recurring row: its next due time, and the slots that passed
    without running (each span with its reason: ``coalesced`` or ``overlap``)."""

    next_time: datetime
    passed: tuple[PassedSlots, ...] = ()
    buffered: datetime | None = None
    """``Overlap.buffer_one``: the slot the next run runs (``next_time`` is its due time)."""
    through: datetime | None = None
    """With ``buffered``: the last slot passed over; after the buffered run the schedule goes
    on from the slot that follows it."""

    @property
    def missed(self) -> int:
        """Slots passed over (coalesced or skipped), never run."""
        return sum(p.count for p in self.passed)


def next_after_run(
    schedule: Schedule, catch_up: CatchUp, row_time: datetime, slot: datetime, finished: datetime
) -> tuple[datetime, int]:
    """After a run of ``slot`` (the row was due at ``row_time``) that ended at ``finished``:
    the row's next due time and how many slots that coalesces (missed, never run)."""
    after = after_run(schedule, catch_up, row_time, slot, finished)
    return after.next_time, after.missed


def after_run(
    schedule: Schedule,
    catch_up: CatchUp,
    row_time: datetime,
    slot: datetime,
    finished: datetime,
    *,
    started: datetime | None = None,
    overlap: Overlap | None = None,
    ran: datetime | None = None,
) -> AfterRun:
    """After a run of ``slot`` (the row was due at ``row_time``) that started at ``started``
    and ended at ``finished``: the row's next due time, and the slots passed over. Those due
    by ``started`` were merged into the run by ``CatchUp.latest`` (``coalesced``), those due
    while it ran were overlapped by it (``overlap``). ``Overlap.buffer_one``: the first slot
    due by ``finished`` runs next, the others due by then are skipped (``overlap``). ``ran``:
    the slot the run ran, for the history's words, when it is not ``slot`` (a buffered slot's
    run goes on from the last slot skipped then)."""
    ran = slot if ran is None else ran
    following = schedule.following(slot)
    if (
        overlap is not None
        and overlap.buffers
        and following is not None
        and schedule.due_time(following) <= finished
    ):
        last = _latest_due(schedule, following, finished)
        passed: tuple[PassedSlots, ...] = ()
        after = schedule.following(following)
        if last > following and after is not None:
            count, capped = _count(schedule, after, last)
            why = (
                f"fell due while the run of {ran.isoformat()} was going (Overlap.buffer_one: "
                f"{following.isoformat()} runs next, the others are skipped)"
            )
            passed = (PassedSlots(after, last, count, SlotReason.OVERLAP, capped, why),)
        return AfterRun(schedule.due_time(following), passed, following, last)
    if catch_up.policy != "latest" and following is not None:
        return AfterRun(schedule.due_time(following))  # the next claim's plan decides
    next_time = schedule.next_execution_time(row_time, finished)
    if following is None:
        return AfterRun(next_time)
    next_slot = schedule.slot_of(next_time)
    if next_slot <= following:  # the usual case: nothing coalesced
        return AfterRun(next_time)
    last = schedule.back(next_slot, 1)
    policy = "skip" if overlap is None else overlap.describe()
    return AfterRun(
        next_time, passed_slots(schedule, following, last, started, run=ran, policy=policy)
    )


def passed_slots(
    schedule: Schedule,
    first: datetime,
    last: datetime,
    started: datetime | None,
    *,
    run: datetime,
    policy: str = "skip",
) -> tuple[PassedSlots, ...]:
    """The slots ``first`` to ``last`` that the run of ``run`` (started at ``started``)
    passed over, split at ``started``: due by then, merged into it by ``CatchUp.latest``
    (``coalesced``); due while it ran (``overlap``, under ``Overlap.<policy>``)."""
    merged = f"merged into the run of {run.isoformat()} by CatchUp.latest (due before it started)"
    going = f"fell due while the run of {run.isoformat()} was going (Overlap.{policy})"

    def span(a: datetime, b: datetime, reason: SlotReason, why: str) -> PassedSlots:
        count, capped = _count(schedule, a, b)
        return PassedSlots(a, b, count, reason, capped, why)

    if started is None or schedule.due_time(first) > started:
        return (span(first, last, SlotReason.OVERLAP, going),)
    before = _latest_due(schedule, first, started)
    after = schedule.following(before) if before < last else None
    if after is None:
        return (span(first, last, SlotReason.COALESCED, merged),)
    return (
        span(first, before, SlotReason.COALESCED, merged),
        span(after, last, SlotReason.OVERLAP, going),
    )


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
