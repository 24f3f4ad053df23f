"""Retries of a recurring slot (``DistributedJob.failure_handler()``): the mark a failed slot's
row carries while its retry is pending.

db-scheduler keeps one row per recurring job, so a retry moves that row's ``execution_time``
to the retry's time; the slot it retries and the attempt number travel in the row's
``task_data`` (unused by a recurring row otherwise). The mark names the retry's time: a row
whose ``execution_time`` is another (the slot succeeded, was run now, was rescheduled) carries
a stale mark, and it is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = ["RetryMark", "read_mark", "retry_time"]

_KEY = "ekbatan_retry"


@dataclass(frozen=True, slots=True)
class RetryMark:
    """A pending retry: attempt ``attempt`` of ``slot``, due at ``at``."""

    slot: datetime
    attempt: int
    at: datetime

    def encode(self) -> bytes:
        body = {"slot": self.slot.isoformat(), "attempt": self.attempt, "at": self.at.isoformat()}
        return encode_mark(_KEY, body)


def encode_mark(key: str, body: dict[str, Any]) -> bytes:
    """A mark a recurring row's ``task_data`` carries (a pending retry, a buffered slot)."""
    return json.dumps({key: body}, separators=(",", ":")).encode()


def mark_body(data: bytes | None, key: str) -> Any:
    """The body of the ``key`` mark in ``data`` (None: no such mark, or unreadable)."""
    if not data or not data.startswith(b'{"' + key.encode()):
        return None
    try:
        return json.loads(data)[key]
    except (ValueError, KeyError, TypeError):
        return None


def retry_time(at: datetime) -> datetime:
    """A retry's due time as stored: whole milliseconds, which every database keeps exactly."""
    return at - timedelta(microseconds=at.microsecond % 1000)


def read_mark(data: bytes | None, row_time: datetime) -> RetryMark | None:
    """The pending retry a recurring row due at ``row_time`` stands for (None: none, or a
    stale or unreadable mark)."""
    body = mark_body(data, _KEY)
    if body is None:
        return None
    try:
        mark = RetryMark(
            datetime.fromisoformat(body["slot"]),
            int(body["attempt"]),
            datetime.fromisoformat(body["at"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if mark.at != row_time:
        return None
    return mark
