"""Schedules as data: ``PersistentScheduleJob``, a job with one row per schedule, each row
carrying its own schedule and data in ``task_data`` (``ScheduleSpec``, documented in
docs/task-data.md so that another program can write one).

A row's ``task_data`` is UTF-8 JSON::

    {"schedule": "DAILY|07:30|Europe/Berlin", "data": {"user_id": 42},
     "start_at": "2026-01-01T00:00:00+00:00", "end_at": null, "max_runs": null, "runs": 0,
     "paused": null, "format": 1}

Only ``schedule`` is required. Everything here is pure: time is passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from typing_extensions import TypeVar

from .catchup import CatchUp
from .codec import TaskDataError, TaskDataInvalid, decode_data, encode_data
from .errors import ScheduleError
from .failure import FailureHandler
from .job import OneTimeJob
from .overlap import BufferMark, Overlap, read_buffer_mark
from .retries import RetryMark, read_mark
from .rows import PARKED_TIME
from .schedules import Schedule, parse_schedule

__all__ = [
    "FORMAT",
    "PAUSED_TIME",
    "PLAIN_TAIL",
    "PersistentScheduleJob",
    "ScheduleRowInvalid",
    "ScheduleSpec",
    "first_slot",
    "parse_spec",
    "schedule_text",
]

FORMAT = 1
"""The ``task_data`` format this version writes and reads (a larger one is parked)."""

PAUSED_TIME = PARKED_TIME - timedelta(days=1)
"""The ``execution_time`` of a paused schedule: no poll reaches it; ``resume_schedule``
moves it back to its next slot."""

D = TypeVar("D", default=Any)


class PersistentScheduleJob(OneTimeJob[D]):
    """A job whose schedules are rows: ``client.create_schedule(job, instance_id, schedule,
    data)`` adds one, each with its own schedule and data; every slot of every schedule runs
    once across the cluster, with ``ctx.task_instance`` the schedule's id,
    ``ctx.execution_time`` the slot and ``ctx.data`` its data (the model, for
    ``PersistentScheduleJob[Model]``). Nothing is created at startup.

    ``catch_up()``, ``overlap()``, ``failure_handler()``, ``pause_after_failures()``,
    ``record_missed_slots()``, ``timeout()``, ``max_concurrency()``/``concurrency_key()`` and a
    pause of the job apply to each of its schedules; jitter is part of a schedule
    (``Schedules.daily(...).with_jitter(...)``, or ``|JITTER=PT5M`` in its string form)."""

    def catch_up(self) -> CatchUp:
        """What each schedule does with the slots it missed (see ``DistributedJob.catch_up``)."""
        return CatchUp.latest()

    def overlap(self) -> Overlap:
        """What each schedule does with a slot that comes due while its previous execution
        still runs (see ``DistributedJob.overlap``)."""
        return Overlap.skip()

    def failure_handler(self) -> FailureHandler | None:  # type: ignore[override]
        """How a schedule's failed slot is retried, as for a recurring job (see
        ``DistributedJob.failure_handler``): None (the default) lets the next slot follow."""
        return None

    def pause_after_failures(self) -> int | None:
        """Pause a schedule (that one only) after this many consecutive failed attempts,
        ``paused_by="ekbatan"``, as for a recurring job (see
        ``DistributedJob.pause_after_failures``). None (the default): never."""
        return None

    def record_missed_slots(self) -> bool | None:
        """Record each slot of a schedule that passes without a run (see
        ``DistributedJob.record_missed_slots``); None: as the setting says."""
        return None


class ScheduleRowInvalid(TaskDataInvalid):
    """A schedule row's ``task_data`` cannot be read: the row is parked with this reason."""


def schedule_text(schedule: Schedule | str | Any, *, where: str) -> str:
    """The db-scheduler string form of ``schedule`` (a ``Schedule`` or its string), checked."""
    if isinstance(schedule, Schedule):
        text = schedule.describe()
    elif isinstance(schedule, str):
        text = schedule
    else:
        raise ScheduleError(
            f"schedule of {where} must be a Schedule (see Schedules) or its string form such "
            f"as 'DAILY|07:30|Europe/Berlin', got {schedule!r}"
        )
    try:
        parsed = parse_schedule(text)
    except ScheduleError as error:
        raise ScheduleError(f"schedule of {where}: {error}") from None
    if parsed.is_disabled:
        raise ScheduleError(
            f"schedule of {where} is disabled ('-'): delete the schedule, or pause it, instead"
        )
    return text


def _instant(value: Any, field: str, where: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ScheduleError(
                f"{field} of {where} must be a timezone-aware datetime, got {value!r}; use e.g. "
                "datetime(2027, 1, 1, tzinfo=UTC)"
            )
        return value.astimezone(UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.astimezone(UTC)
    raise ScheduleError(
        f"{field} of {where} must be an ISO-8601 instant with an offset, such as "
        f"'2027-01-01T00:00:00+00:00', got {value!r}"
    )


def _max_runs(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(
            f"max_runs of {where} must be a whole number >= 1 or None, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule row's ``task_data``: its schedule, data and bounds."""

    schedule: str
    """db-scheduler's string form (``CRON|0 8 * * 1-5|Europe/Berlin``)."""
    data: Any = None
    """The data as stored (plain JSON; a typed job's model's JSON form)."""
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    runs: int = 0
    """Slots run so far (counted when each ends)."""
    paused: dict[str, Any] | None = None
    """``{"by", "at", "reason"}`` while the schedule is paused."""
    pending: dict[str, Any] | None = None
    """What the row's next due time stands for, when it is no slot of its own: a retry of a
    failed slot (``{"ekbatan_retry": ...}``, see ``domain.retries``) or a slot
    ``Overlap.buffer_one`` buffered (``{"ekbatan_buffered": ...}``). Stale (ignored) once
    the row is due at another time."""
    counted_slot: str | None = None
    """The slot (ISO 8601) ``runs`` last counted: a run of that slot again (its result was
    never written: the process died between the count and the result, and the row was
    revived) is not counted twice, and ``max_runs`` does not end the schedule a slot early."""

    @staticmethod
    def build(
        schedule: Schedule | str,
        data: Any,
        *,
        where: str,
        start_at: Any = None,
        end_at: Any = None,
        max_runs: Any = None,
        checked: bool = False,
    ) -> ScheduleSpec:
        """A spec from a caller's values, each checked (``ScheduleError`` names the field);
        ``checked``: ``schedule`` is a string ``schedule_text`` accepted already."""
        spec = ScheduleSpec(
            schedule
            if checked and isinstance(schedule, str)
            else schedule_text(schedule, where=where),
            data,
            _instant(start_at, "start_at", where),
            _instant(end_at, "end_at", where),
            _max_runs(max_runs, where),
        )
        if spec.start_at and spec.end_at and spec.end_at <= spec.start_at:
            raise ScheduleError(
                f"end_at of {where} ({spec.end_at.isoformat()}) must be after its start_at "
                f"({spec.start_at.isoformat()})"
            )
        return spec

    def parsed(self, task_name: str, task_instance: str) -> Schedule:
        """The schedule, bound to the row (its jitter offsets derive from ``name/id``)."""
        return parse_schedule(self.schedule).bind(f"{task_name}/{task_instance}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schedule": self.schedule,
            "data": self.data,
            "start_at": self.start_at.isoformat() if self.start_at else None,
            "end_at": self.end_at.isoformat() if self.end_at else None,
            "max_runs": self.max_runs,
            "runs": self.runs,
            "paused": self.paused,
            **({"pending": self.pending} if self.pending is not None else {}),
            **({"counted_slot": self.counted_slot} if self.counted_slot is not None else {}),
        }

    def encode(self, *, where: str) -> bytes:
        encoded = encode_data(self.to_json(), where=where)
        assert encoded is not None
        return encoded

    @staticmethod
    def plain_head(schedule: str) -> bytes:
        """What ``encode`` writes before the data of a spec with only a schedule and data (no
        bounds, never run, not paused): ``head + data's JSON + PLAIN_TAIL`` is that spec's
        ``encode``, byte for byte, without building the spec (``create_schedules``)."""
        return b'{"format":%d,"schedule":%s,"data":' % (FORMAT, json.dumps(schedule).encode())

    def data_bytes(self, *, where: str) -> bytes | None:
        """The data alone, as a one-time row would hold it (what ``ctx.data`` decodes)."""
        return encode_data(self.data, where=where)

    def counted(self, *, slot: bool = True, at: datetime | None = None) -> ScheduleSpec:
        """After a run of the slot ``at``: ``runs + 1`` (not for a retry of a slot: ``slot``
        False; nor for a slot counted already, ``counted_slot``), and no pending retry or
        buffered slot."""
        if at is None:
            return replace(self, runs=self.runs + int(slot), pending=None)
        key = at.isoformat()
        new = slot and key != self.counted_slot
        return replace(
            self,
            runs=self.runs + int(new),
            pending=None,
            counted_slot=key if slot else self.counted_slot,
        )

    def with_pending(self, mark: bytes) -> ScheduleSpec:
        """The spec carrying ``mark`` (a ``RetryMark`` or ``BufferMark``'s encoding)."""
        return replace(self, pending=json.loads(mark))

    def _mark(self) -> bytes | None:
        if not self.pending:
            return None
        return json.dumps(self.pending, separators=(",", ":")).encode()

    def retry_mark(self, row_time: datetime) -> RetryMark | None:
        """The pending retry a row due at ``row_time`` stands for (None: none)."""
        return read_mark(self._mark(), row_time)

    def buffered_mark(self, row_time: datetime) -> BufferMark | None:
        """The buffered slot a row due at ``row_time`` stands for (None: none)."""
        return read_buffer_mark(self._mark(), row_time)

    def end_reason(self, next_time: datetime) -> str | None:
        """Why the schedule ends after a run whose next due time is ``next_time`` (None: it
        goes on). ``runs`` already counts that run."""
        if self.max_runs is not None and self.runs >= self.max_runs:
            return f"schedule ended: max_runs {self.max_runs} reached"
        if self.end_at is not None and next_time > self.end_at:
            return (
                f"schedule ended: its next slot {next_time.isoformat()} is after end_at "
                f"{self.end_at.isoformat()}"
            )
        return None


PLAIN_TAIL = b',"start_at":null,"end_at":null,"max_runs":null,"runs":0,"paused":null}'
"""What ``ScheduleSpec.encode`` writes after the data of a plain spec (``plain_head``)."""


def first_slot(spec: ScheduleSpec, schedule: Schedule, now: datetime) -> datetime | None:
    """When a schedule created (or changed) at ``now`` is first due: its first slot at or
    after ``max(now, start_at)``. None: that is past ``end_at`` (nothing would ever run)."""
    begin = now if spec.start_at is None or spec.start_at < now else spec.start_at
    at = schedule.initial_execution_time(begin)
    if spec.end_at is not None and at > spec.end_at:
        return None
    return at


def _field_error(where: str, field: str, reason: str) -> ScheduleRowInvalid:
    return ScheduleRowInvalid(
        f"the stored schedule row {where} cannot be read: {field}: {reason}; the row is "
        "parked, not retried: fix it with client.update_schedule(...) or drop it with "
        "client.delete_schedule(...) (docs/task-data.md describes the format)",
        [{"loc": (field,), "msg": reason, "type": "schedule_row"}],
    )


def _kind(value: Any) -> str:
    """What a decoded JSON value is, without its content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({len(value)} characters)"
    if isinstance(value, list):
        return f"an array ({len(value)} item{'' if len(value) == 1 else 's'})"
    return type(value).__name__


def parse_spec(raw: bytes | None, *, where: str) -> ScheduleSpec:
    """A row's ``task_data`` as a spec; ``ScheduleRowInvalid`` names the field that is wrong
    (the row is then parked)."""
    try:
        value = decode_data(raw, where=where)
    except TaskDataError as error:
        raise _field_error(where, "task_data", str(error)) from None
    if not isinstance(value, dict):
        # The kind, never the value: it is the application's data (personal data, perhaps),
        # and this message is shown where the data is not (the schedules' list and page).
        raise _field_error(where, "task_data", f"a JSON object is expected, got {_kind(value)}")
    version = value.get("format", FORMAT)
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT:
        raise _field_error(
            where, "format", f"{version!r} is not a format this version reads (<= {FORMAT})"
        )
    try:
        text = schedule_text(value.get("schedule"), where=where)
    except ScheduleError as error:
        raise _field_error(where, "schedule", str(error)) from None
    try:
        start_at = _instant(value.get("start_at"), "start_at", where)
        end_at = _instant(value.get("end_at"), "end_at", where)
        max_runs = _max_runs(value.get("max_runs"), where)
    except ScheduleError as error:
        field = str(error).split(" ", 1)[0]
        raise _field_error(where, field, str(error)) from None
    runs = value.get("runs", 0)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
        raise _field_error(where, "runs", f"a whole number >= 0 is expected, got {runs!r}")
    paused = value.get("paused")
    if paused is not None and not isinstance(paused, dict):
        raise _field_error(where, "paused", f"an object or null is expected, got {paused!r}")
    pending = value.get("pending")
    if not isinstance(pending, dict):
        pending = None  # a mark this version cannot read: as if none were pending
    counted_slot = value.get("counted_slot")
    if not isinstance(counted_slot, str):
        counted_slot = None  # unreadable: the next run is counted
    return ScheduleSpec(
        text, value.get("data"), start_at, end_at, max_runs, runs, paused, pending, counted_slot
    )
