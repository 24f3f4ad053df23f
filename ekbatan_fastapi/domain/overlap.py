"""Overlap policies: what a recurring job does with the slots that come due while one of its
executions still runs (Temporal's "overlap policy"; db-scheduler's behaviour is ``skip``).

``Overlap.skip()`` (the default): those slots do not run; the schedule goes on with the first
slot after the run ended. ``Overlap.buffer_one()``: the first of them runs right after the run
ends (``ctx.execution_time`` that slot), the others are skipped. ``Overlap.cancel_other()``: a
slot that comes due while the previous execution still runs stops that execution (as
``client.cancel_running`` does: its history says ``cancelled``, with the reason ``overlap: slot
<t> was due``), then runs.

The slots passed over are reported with the reason ``overlap`` (``domain.catchup.PassedSlots``,
computed by ``after_run``), apart from those due before the run started, which
``CatchUp.latest`` merged into it (``coalesced``); with ``record_missed_slots`` on, each is
named in the history (outcome ``missed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import ConfigurationError
from .retries import encode_mark, mark_body
from .schedule import Schedule

__all__ = [
    "BufferMark",
    "Overlap",
    "checked_overlap",
    "next_due_after",
    "overlap_reason",
    "overlap_slot_of",
    "read_buffer_mark",
]

_POLICIES = ("skip", "buffer_one", "cancel_other")


@dataclass(frozen=True)
class Overlap:
    """A recurring job's overlap policy (``DistributedJob.overlap()``)."""

    policy: str

    @staticmethod
    def skip() -> Overlap:
        """Slots that come due while a run is going do not run (the default)."""
        return Overlap("skip")

    @staticmethod
    def buffer_one() -> Overlap:
        """The first slot that came due while a run was going runs right after it; the
        others are skipped."""
        return Overlap("buffer_one")

    @staticmethod
    def cancel_other() -> Overlap:
        """A slot that comes due while the previous execution still runs stops it (cancelled
        cluster-wide, as ``client.cancel_running`` does), then runs."""
        return Overlap("cancel_other")

    def describe(self) -> str:
        return self.policy

    @property
    def buffers(self) -> bool:
        return self.policy == "buffer_one"

    @property
    def cancels(self) -> bool:
        return self.policy == "cancel_other"


_REASON_PREFIX = "overlap: slot "


def overlap_reason(slot: datetime) -> str:
    """The reason a cancelled-by-overlap execution's history gives."""
    return f"{_REASON_PREFIX}{slot.isoformat()} was due"


def overlap_slot_of(reason: str | None) -> datetime | None:
    """The slot an ``overlap_reason`` names (None: another reason)."""
    if not reason or not reason.startswith(_REASON_PREFIX):
        return None
    try:
        return datetime.fromisoformat(reason[len(_REASON_PREFIX) :].split(" ", 1)[0])
    except ValueError:
        return None


def next_due_after(schedule: Schedule, slot: datetime, now: datetime) -> datetime | None:
    """The first slot after ``slot`` that is not due at ``now`` (None: no grid). A run that
    started late (its successors already due: a catch-up) is overlapped by this one."""
    latest = schedule.latest_at_or_before(slot, now)
    following = schedule.following(latest)
    while following is not None and schedule.due_time(following) <= now:
        following = schedule.following(following)  # a jittered slot: once or twice at most
    return following


def checked_overlap(value: Any, where: str) -> Overlap:
    """``value`` as a job's overlap policy, or ``ConfigurationError`` naming it and the fix."""
    if isinstance(value, Overlap) and value.policy in _POLICIES:
        return value
    raise ConfigurationError(
        f"{where}.overlap() must return Overlap.skip(), Overlap.buffer_one() or "
        f"Overlap.cancel_other(), got {value!r}"
    )


_KEY = "ekbatan_buffered"


@dataclass(frozen=True, slots=True)
class BufferMark:
    """``Overlap.buffer_one``'s mark in a recurring row's ``task_data`` (as a retry's, see
    ``domain.retries``): the row, due at ``at``, runs the buffered ``slot``; the slots after
    it up to ``through`` were skipped, and the schedule goes on after ``through``."""

    slot: datetime
    through: datetime
    at: datetime

    def encode(self) -> bytes:
        body = {
            "slot": self.slot.isoformat(),
            "through": self.through.isoformat(),
            "at": self.at.isoformat(),
        }
        return encode_mark(_KEY, body)


def read_buffer_mark(data: bytes | None, row_time: datetime) -> BufferMark | None:
    """The buffered slot a recurring row due at ``row_time`` stands for (None: none, or a
    stale or unreadable mark)."""
    body = mark_body(data, _KEY)
    if body is None:
        return None
    try:
        mark = BufferMark(
            datetime.fromisoformat(body["slot"]),
            datetime.fromisoformat(body["through"]),
            datetime.fromisoformat(body["at"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if mark.at != row_time:
        return None
    return mark
