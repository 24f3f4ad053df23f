"""Backfill: slots of a recurring job run again on demand, as one-time rows of the job.

``client.backfill(job, start, end)`` inserts one row per slot of the job's schedule in the
window, ``task_instance = "backfill:<slot in ISO-8601 UTC>"``: the slot is the row's identity
(its idempotency key), so asking twice for the same window runs each slot once. The row runs
on whichever instance claims it, with ``ctx.execution_time`` = the slot, and is deleted once it
succeeds; a failure retries it with a backoff. The job's own ``recurring`` row is untouched.
"""

from __future__ import annotations

from datetime import UTC, datetime

from .errors import ScheduleError
from .schedule import COUNT_CAP, Schedule

__all__ = [
    "BACKFILL_PREFIX",
    "MAX_BACKFILL_SLOTS",
    "backfill_instance",
    "backfill_slot",
    "backfill_slots",
]

BACKFILL_PREFIX = "backfill:"
MAX_BACKFILL_SLOTS = COUNT_CAP
"""Slots one backfill may ask for (ask again with a later start for more)."""


def backfill_instance(slot: datetime) -> str:
    """The ``task_instance`` of the backfill row of ``slot``."""
    return BACKFILL_PREFIX + slot.astimezone(UTC).isoformat(timespec="microseconds")


def backfill_slot(task_instance: str) -> datetime | None:
    """The slot of a backfill row's ``task_instance`` (None: not a backfill row)."""
    if not task_instance.startswith(BACKFILL_PREFIX):
        return None
    try:
        slot = datetime.fromisoformat(task_instance[len(BACKFILL_PREFIX) :])
    except ValueError:
        return None
    return slot.astimezone(UTC) if slot.tzinfo is not None else None


def backfill_slots(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The slots of ``schedule`` in ``[start, end)``, oldest first."""
    if schedule.following(start) is None:
        raise ScheduleError(
            f"{schedule.describe()} has no fixed slots to backfill (a fixed delay depends on "
            "when each run ends); backfill needs a fixed-rate, daily or cron schedule"
        )
    if end <= start:
        raise ScheduleError(
            f"backfill end {end.isoformat()} must be after its start {start.isoformat()}"
        )
    # A fixed rate anchored at its first slot has no absolute grid: its slots count from start.
    grid = schedule.slot_at_or_before(start)
    slot: datetime | None = start if grid is None or grid == start else schedule.following(grid)
    slots: list[datetime] = []
    while slot is not None and slot < end:
        if len(slots) == MAX_BACKFILL_SLOTS:
            raise ScheduleError(
                f"the backfill window {start.isoformat()} to {end.isoformat()} holds more "
                f"than {MAX_BACKFILL_SLOTS} slots; ask for a shorter window at a time"
            )
        slots.append(slot)
        slot = schedule.following(slot)
    return slots
