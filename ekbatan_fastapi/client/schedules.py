"""Schedules as data: the client's verbs for a ``PersistentScheduleJob``'s schedules (one row
of ``scheduled_tasks`` each, the schedule in its ``task_data``; ``domain/persistent.py``).

``ScheduleVerbs`` is a base of ``SchedulerClient``: ``client.create_schedule(...)`` etc."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..domain.codec import encode_data, encode_task_data
from ..domain.errors import (
    ConfigurationError,
    EkbatanError,
    ScheduleError,
    TaskNotFoundError,
    TaskPickedError,
    UnknownJobError,
)
from ..domain.job import Job
from ..domain.persistent import (
    PAUSED_TIME,
    PLAIN_TAIL,
    PersistentScheduleJob,
    ScheduleRowInvalid,
    ScheduleSpec,
    first_slot,
    parse_spec,
    schedule_text,
)
from ..domain.rows import PARKED_TIME, NewTask, TaskRow
from ..domain.schedules import Schedule, parse_schedule
from ..domain.tasks import ScheduledTask
from ..domain.text import MAX_NAME_LENGTH, is_storable_text, validate_name
from ..store.schedules import ScheduleRows

if TYPE_CHECKING:
    from ..store.dialects import Store
    from ..store.external import Caller
    from ..store.tasks import TaskStore

__all__ = ["MAX_SEARCH", "SCHEDULE_STATES", "ScheduleInfo", "ScheduleVerbs"]

_UNSET: Any = object()
_ATTEMPTS = 10
"""Times an update is tried against a row that keeps changing under it."""
_MAX_PAGE = 1000
MAX_SEARCH = MAX_NAME_LENGTH
"""The longest ``search`` of ``list_schedules``: an id is at most this long."""

SCHEDULE_STATES = ("scheduled", "running", "paused", "parked")
"""What a schedule is doing: waiting for its next slot, running one, paused, or parked (its
row cannot be read, or its typed data no longer fits: see ``error``)."""


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule of a ``PersistentScheduleJob`` as stored."""

    job: str
    instance_id: str
    schedule: str | None
    """db-scheduler's string form (None: the row cannot be read, see ``error``)."""
    data: Any
    """The stored data (plain JSON; a typed job's model's JSON form)."""
    next_time: datetime | None
    """When its next slot is due (None: paused or parked)."""
    state: str
    """One of ``SCHEDULE_STATES``."""
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    runs: int = 0
    paused: Mapping[str, Any] | None = None
    error: str | None = None
    """Why the row is parked."""
    task: ScheduledTask | None = None
    """The row itself (failures, last success, who runs it)."""

    def to_json(self) -> dict[str, Any]:
        """As ``GET /jobs/{name}/schedules`` and ``ekbatan-jobs schedules list --json`` show it."""
        task = self.task

        def iso(at: datetime | None) -> str | None:
            return at.isoformat() if at is not None else None

        return {
            "job": self.job,
            "instance_id": self.instance_id,
            "schedule": self.schedule,
            "data": self.data,
            "state": self.state,
            "next_time": iso(self.next_time),
            "start_at": iso(self.start_at),
            "end_at": iso(self.end_at),
            "max_runs": self.max_runs,
            "runs": self.runs,
            "paused": dict(self.paused) if self.paused is not None else None,
            "error": self.error,
            "picked_by": task.picked_by if task else None,
            "last_success": iso(task.last_success) if task else None,
            "last_failure": iso(task.last_failure) if task else None,
            "consecutive_failures": task.consecutive_failures if task else 0,
        }


def schedule_info(row: TaskRow) -> ScheduleInfo:
    """A schedule row as the client shows it (an unreadable one: ``parked`` with the reason)."""
    task = ScheduledTask.from_row(row)
    where = f"{row.task_name}/{row.task_instance}"
    try:
        spec = parse_spec(row.task_data, where=where)
    except ScheduleRowInvalid as error:  # parked when it is claimed, if not yet
        parked = row.execution_time >= PARKED_TIME
        state = "running" if row.picked else "parked" if parked else "scheduled"
        return ScheduleInfo(row.task_name, row.task_instance, None, None, None, state,
                            error=str(error), task=task)  # fmt: skip
    if row.picked:
        state, next_time = "running", row.execution_time
    elif row.execution_time >= PARKED_TIME:
        state, next_time = "parked", None
    elif spec.paused is not None or row.execution_time >= PAUSED_TIME:
        state, next_time = "paused", None
    else:
        state, next_time = "scheduled", row.execution_time
    return ScheduleInfo(
        row.task_name,
        row.task_instance,
        spec.schedule,
        spec.data,
        next_time,
        state,
        spec.start_at,
        spec.end_at,
        spec.max_runs,
        spec.runs,
        spec.paused,
        "its data no longer fits the job's model (see the history)" if state == "parked" else None,
        task,
    )


class ScheduleVerbs:
    """The schedule verbs of ``SchedulerClient`` (which provides these attributes)."""

    _store: Store
    _tasks: TaskStore
    _jobs: Mapping[str, Job]

    async def _woken(self, at: datetime | None, *, notify: bool) -> None:
        raise NotImplementedError

    def _caller(self, connection: Any) -> Caller:
        raise NotImplementedError

    async def _woken_after_commit(
        self, caller: Caller, at: datetime | None, *, notify: bool
    ) -> None:
        raise NotImplementedError

    unregistered_schedules: bool = False
    """Accept schedules of a job not registered here (the CLI, which loads no jobs): their
    data is then checked as JSON only, and a typed job's model checks it when a slot runs
    (a row it refuses is parked)."""

    @property
    def _schedule_rows(self) -> ScheduleRows:
        return ScheduleRows(self._tasks)

    def _schedule_job(self, job_name: str) -> PersistentScheduleJob:
        validate_name(job_name, "job name")
        job = self._jobs.get(job_name)
        if isinstance(job, PersistentScheduleJob):
            return job
        if job is None and self.unregistered_schedules:
            return _Unregistered(job_name)
        known = sorted(n for n, j in self._jobs.items() if isinstance(j, PersistentScheduleJob))
        what = "is registered" if job is None else f"is a {type(job).__name__}, not one"
        raise UnknownJobError(
            f"schedules belong to a PersistentScheduleJob, and {job_name!r} {what}; "
            f"registered PersistentScheduleJobs: {', '.join(known) or '(none)'}"
        )

    @staticmethod
    def _stored_data(job: PersistentScheduleJob, data: Any, where: str) -> Any:
        """``data`` as stored: a typed job's model validated (``TaskDataInvalid`` names the
        field) into its JSON form; untyped data as given (checked when the row is encoded)."""
        if job.data_model is None:
            return data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        encoded = encode_task_data(job.data_model, data, where=where)
        return None if encoded is None else json.loads(encoded)

    def _new_row(
        self,
        job: PersistentScheduleJob,
        instance_id: str,
        schedule: Schedule | str,
        data: Any,
        now: datetime,
        *,
        start_at: Any = None,
        end_at: Any = None,
        max_runs: Any = None,
        parsed: _Parsed | None = None,
    ) -> NewTask:
        """A schedule's row; ``parsed`` caches each schedule's check, its parse and (without
        jitter, bounds) its first slot across the rows of one ``create_schedules``."""
        name = job.name()
        validate_name(instance_id, "instance id")
        where = f"{name}/{instance_id}"
        cache = parsed if parsed is not None else _Parsed()
        key: Any = schedule if isinstance(schedule, str) else id(schedule)
        known = cache.schedules.get(key)
        if known is None:
            text = schedule_text(schedule, where=where)  # the schedule's error first
            known = cache.schedules[key] = (text, parse_schedule(text))
            cache.kept.append(schedule)  # alive while cached: its id stays its own
        text, plain = known
        spec = ScheduleSpec.build(
            text,
            self._stored_data(job, data, where),
            where=where,
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
            checked=True,
        )
        first: datetime | None
        if plain.jitter is None and spec.start_at is None and spec.end_at is None:
            first = cache.firsts.get(text)
            if first is None:
                first = cache.firsts[text] = first_slot(spec, plain, now)
        else:
            first = first_slot(spec, plain.bind(where), now)
        if first is None:
            raise ScheduleError(
                f"end_at of {where} ({spec.end_at.isoformat() if spec.end_at else ''}) comes "
                "before its first slot: it would never run; give a later end_at"
            )
        return NewTask(name, instance_id, first, spec.encode(where=where), job.priority())

    async def create_schedule(
        self,
        job_name: str,
        instance_id: str,
        schedule: Schedule | str,
        data: Any = None,
        *,
        replace: bool = False,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        max_runs: int | None = None,
        connection: Any = None,
    ) -> bool:
        """Add schedule ``instance_id`` of ``PersistentScheduleJob`` ``job_name``: its slots
        run by ``schedule`` (a ``Schedule`` or its string form) with ``data``, none before
        ``start_at`` nor after ``end_at``, at most ``max_runs`` times. False when it exists
        (left alone) unless ``replace``, which puts these values in its place (a running slot
        finishes first; the next one follows the new schedule). ``connection``: inside the
        caller's transaction (it exists only if that commits), as ``schedule()``."""
        job = self._schedule_job(job_name)
        task = self._new_row(
            job,
            instance_id,
            schedule,
            data,
            await self._tasks.db_now(),
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
        )
        if connection is not None:
            caller = self._caller(connection)
            written = await self._tasks.upsert_on(caller, task, replace=replace)
            if not written and replace:
                raise TaskPickedError(
                    f"{job_name}/{instance_id} is running right now; replace it outside the "
                    "transaction, or with update_schedule() once it finished"
                )
            if written:
                await self._woken_after_commit(caller, task.execution_time, notify=False)
            return written
        written = await self._tasks.upsert(task, replace=replace)
        if not written and replace:  # running: its next slot follows the new values
            assert task.task_data is not None
            await self._replace_running(task)
            return True
        if written:
            await self._woken(task.execution_time, notify=False)  # the upsert notified
        return written

    async def _replace_running(self, task: NewTask) -> None:
        assert task.task_data is not None
        for _ in range(_ATTEMPTS):
            row = await self._tasks.get(task.task_name, task.task_instance)
            if row is None:
                if await self._tasks.upsert(task, replace=False):
                    await self._woken(task.execution_time, notify=False)
                    return
                continue
            spec = parse_spec(task.task_data, where=f"{task.task_name}/{task.task_instance}")
            if not row.picked:
                if await self._tasks.upsert(task, replace=True):
                    await self._woken(task.execution_time, notify=False)
                    return
                continue
            kept = _keep_runs(row, spec)
            if await self._schedule_rows.change(row, kept.encode(where=""), None):
                return
        raise TaskPickedError(f"{task.task_name}/{task.task_instance} kept changing; try again")

    async def create_schedules(
        self,
        job_name: str,
        schedules: Iterable[tuple[str, Schedule | str, Any]],
        *,
        connection: Any = None,
    ) -> int:
        """Add many schedules of one job in one statement: ``(instance_id, schedule, data)``
        tuples. Existing ones are left alone; returns how many were created. Every value is
        checked before anything is written. ``connection``: inside that transaction."""
        job = self._schedule_job(job_name)
        tasks = self._new_rows(job, schedules, await self._tasks.db_now())
        if not tasks:
            return 0
        earliest = min(t.execution_time for t in tasks if t.execution_time is not None)
        if connection is not None:
            caller = self._caller(connection)
            keys = await self._tasks.insert_missing_on(caller, tasks)
            if keys:
                await self._woken_after_commit(caller, earliest, notify=True)
            return len(keys)
        keys = await self._tasks.insert_missing(tasks)
        if keys:
            await self._woken(earliest, notify=True)
        return len(keys)

    def _new_rows(
        self,
        job: PersistentScheduleJob,
        schedules: Iterable[tuple[str, Schedule | str, Any]],
        now: datetime,
    ) -> list[NewTask]:
        """``_new_row`` of each of ``create_schedules``' tuples, in their order. A schedule's
        first row goes through ``_new_row`` (its check, parse and first slot, kept for the
        others); the next rows of a schedule without jitter (whose first slot is the same
        for every row) are the name's check, the data's JSON between the schedule's
        ``plain_head`` and ``PLAIN_TAIL`` (the bytes ``ScheduleSpec.encode`` writes) and that
        slot; a ``Schedule`` object first seen is looked up by its text (one per row, equal
        to an earlier one's). A row whose data fails is made again by ``_new_row``, whose
        error it raises (worded as ``create_schedule``'s)."""
        name, priority = job.name(), job.priority()
        parsed = _Parsed()
        plain: dict[Any, tuple[bytes, datetime | None] | None] = {}
        rows: list[NewTask] = []
        for instance_id, schedule, data in schedules:
            key: Any = schedule if isinstance(schedule, str) else id(schedule)
            known = plain.get(key, _UNSET)
            if known is _UNSET and isinstance(schedule, Schedule):
                # a Schedule made per row (Schedules.daily(user.hour)): an equal one's text
                known = plain.get(schedule.describe(), _UNSET)
                if known is not _UNSET:
                    plain[key] = known
                    parsed.kept.append(schedule)  # alive while cached: its id stays its own
            if known is _UNSET:  # the schedule's first row: checked the whole way
                row = self._new_row(job, instance_id, schedule, data, now, parsed=parsed)
                text, parsed_schedule = parsed.schedules[key]
                known = plain[key] = plain[text] = (
                    (ScheduleSpec.plain_head(text), row.execution_time)
                    if parsed_schedule.jitter is None
                    else None
                )
                rows.append(row)
                continue
            if known is None:  # jitter: each row's first slot is its own
                rows.append(self._new_row(job, instance_id, schedule, data, now, parsed=parsed))
                continue
            validate_name(instance_id, "instance id")
            try:
                body = _data_json(job, data, f"{name}/{instance_id}")
            except EkbatanError:
                self._new_row(job, instance_id, schedule, data, now, parsed=parsed)
                raise  # (not reached: _new_row raised it, worded as create_schedule does)
            head, first = known
            rows.append(NewTask(name, instance_id, first, head + body + PLAIN_TAIL, priority))
        return rows

    async def update_schedule(
        self,
        job_name: str,
        instance_id: str,
        *,
        schedule: Schedule | str = _UNSET,
        data: Any = _UNSET,
        start_at: datetime | None = _UNSET,
        end_at: datetime | None = _UNSET,
        max_runs: int | None = _UNSET,
    ) -> ScheduleInfo:
        """Change what is given of a schedule; the rest stays. It takes effect from the next
        slot: a running execution is not disturbed (it ran with the data it was claimed
        with), and a new schedule's first slot, sooner or later than the old next one, is
        the next one (the cluster is woken for it). TaskNotFoundError: no such schedule."""
        job = self._schedule_job(job_name)
        validate_name(instance_id, "instance id")
        where = f"{job_name}/{instance_id}"
        stored = _UNSET if data is _UNSET else self._stored_data(job, data, where)
        for _ in range(_ATTEMPTS):
            row = await self._tasks.get(job_name, instance_id)
            if row is None:
                raise TaskNotFoundError(
                    f"no schedule {where}: create it with create_schedule({job_name!r}, "
                    f"{instance_id!r}, schedule, data)"
                )
            now = await self._tasks.db_now()
            try:
                old: ScheduleSpec | None = parse_spec(row.task_data, where=where)
            except ScheduleRowInvalid:
                old = None  # an unreadable row: the update must give its schedule
            if old is None and schedule is _UNSET:
                raise ScheduleError(
                    f"the stored schedule row {where} cannot be read; give its schedule= "
                    "(and data=) to repair it, or delete it"
                )
            base = old or ScheduleSpec("-")

            def pick(value: Any, kept: Any) -> Any:
                return kept if value is _UNSET else value

            spec = ScheduleSpec.build(
                pick(schedule, base.schedule),
                pick(stored, base.data),
                where=where,
                start_at=pick(start_at, base.start_at),
                end_at=pick(end_at, base.end_at),
                max_runs=pick(max_runs, base.max_runs),
            )
            spec = ScheduleSpec(spec.schedule, spec.data, spec.start_at, spec.end_at,
                                spec.max_runs, base.runs, base.paused,
                                counted_slot=base.counted_slot)  # fmt: skip
            timing = (
                old is None
                or any(v is not _UNSET for v in (schedule, start_at, end_at))
                or row.execution_time >= PARKED_TIME
            )
            at: datetime | None = None
            if spec.paused is not None:
                at = PAUSED_TIME if not row.picked else None
            elif timing:
                at = first_slot(spec, spec.parsed(job_name, instance_id), now)
                if at is None:
                    raise ScheduleError(
                        f"end_at of {where} comes before its next slot: it would never run "
                        "again; give a later end_at, or delete the schedule"
                    )
            if await self._schedule_rows.change(row, spec.encode(where=where), at):
                if at is not None and not row.picked and at < PAUSED_TIME:
                    await self._woken(at, notify=True)
                changed = await self._tasks.get(job_name, instance_id)
                return schedule_info(changed if changed is not None else row)
        raise TaskPickedError(f"{where} kept changing while it was updated; try again")

    async def delete_schedule(self, job_name: str, instance_id: str) -> bool:
        """Delete a schedule (False: there was none). A running slot finishes; nothing is
        written after it."""
        self._schedule_job(job_name)
        validate_name(instance_id, "instance id")
        return await self._schedule_rows.delete(job_name, instance_id)

    async def get_schedule(self, job_name: str, instance_id: str) -> ScheduleInfo | None:
        """One schedule (None: there is none)."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        row = await self._tasks.get(job_name, instance_id)
        return schedule_info(row) if row is not None else None

    async def list_schedules(
        self,
        job_name: str,
        *,
        limit: int = 100,
        offset: int = 0,
        state: str | None = None,
        search: str | None = None,
    ) -> list[ScheduleInfo]:
        """A page of a job's schedules, by next due time; ``state``: only those in that one
        of ``SCHEDULE_STATES``; ``search``: only those whose id contains it, ignoring case
        (up to ``MAX_SEARCH`` characters; ``%`` and ``_`` match themselves; empty: all)."""
        validate_name(job_name, "job name")
        _page(limit, offset)
        if state is not None and state not in SCHEDULE_STATES:
            raise ConfigurationError(
                f"state must be one of {', '.join(SCHEDULE_STATES)}, got {state!r}"
            )
        _search(search)
        rows = await self._schedule_rows.page(
            job_name, state=state, limit=limit, offset=offset, search=search or None
        )
        return [schedule_info(row) for row in rows]

    async def pause_schedule(
        self,
        job_name: str,
        instance_id: str,
        reason: str | None = None,
        *,
        paused_by: str | None = None,
    ) -> None:
        """Pause one schedule: no slot of it runs until it is resumed (a running one
        finishes). The job's other schedules keep running."""
        await self._set_paused(
            job_name,
            instance_id,
            {"by": paused_by, "at": datetime.now(UTC).isoformat(), "reason": reason},
        )

    async def resume_schedule(self, job_name: str, instance_id: str) -> bool:
        """Resume one schedule at its next slot from now (False: it was not paused)."""
        return await self._set_paused(job_name, instance_id, None)

    async def _set_paused(
        self, job_name: str, instance_id: str, paused: dict[str, Any] | None
    ) -> bool:
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        where = f"{job_name}/{instance_id}"
        for _ in range(_ATTEMPTS):
            row = await self._tasks.get(job_name, instance_id)
            if row is None:
                raise TaskNotFoundError(f"no schedule {where}")
            spec = parse_spec(row.task_data, where=where)
            if (spec.paused is None) == (paused is None):
                return False
            spec = ScheduleSpec(spec.schedule, spec.data, spec.start_at, spec.end_at,
                                spec.max_runs, spec.runs, paused,
                                counted_slot=spec.counted_slot)  # fmt: skip
            at: datetime | None = None
            if not row.picked:
                if paused is not None:
                    at = PAUSED_TIME
                else:
                    now = await self._tasks.db_now()
                    at = first_slot(spec, spec.parsed(job_name, instance_id), now) or now
            if await self._schedule_rows.change(row, spec.encode(where=where), at):
                if paused is None and at is not None:
                    await self._woken(at, notify=True)
                return True
        raise TaskPickedError(f"{where} kept changing; try again")

    async def schedule_counts(self) -> dict[str, dict[str, int]]:
        """How many schedules each ``PersistentScheduleJob`` registered here has, by state
        (one grouped statement; what ``/jobs`` and the metrics show)."""
        names = sorted(n for n, j in self._jobs.items() if isinstance(j, PersistentScheduleJob))
        return await self._schedule_rows.counts(names)


@dataclass
class _Parsed:
    """What ``_new_row`` learnt of each schedule, for the other rows of one call."""

    schedules: dict[Any, tuple[str, Schedule]] = field(default_factory=dict)
    kept: list[Any] = field(default_factory=list)
    firsts: dict[str, datetime | None] = field(default_factory=dict)


class _Unregistered(PersistentScheduleJob):
    """A ``PersistentScheduleJob`` known by its name only (``unregistered_schedules``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def execute(self, ctx: Any) -> None:
        raise NotImplementedError("only a stand-in for writing schedules")


def _data_json(job: PersistentScheduleJob, data: Any, where: str) -> bytes:
    """The JSON of ``data`` as ``ScheduleSpec.encode`` writes it within a row (``null`` for
    None): a typed job's model's JSON form (validated), or untyped data as given."""
    if job.data_model is not None:
        encoded = encode_task_data(job.data_model, data, where=where)
    else:
        plain = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        encoded = encode_data(plain, where=where)
    return b"null" if encoded is None else encoded


def _keep_runs(row: TaskRow, spec: ScheduleSpec) -> ScheduleSpec:
    """``spec`` with the run count of the stored row (a replace keeps how often it ran)."""
    try:
        stored = parse_spec(row.task_data, where="")
        runs, counted_slot = stored.runs, stored.counted_slot
    except ScheduleRowInvalid:
        runs, counted_slot = 0, None
    return ScheduleSpec(spec.schedule, spec.data, spec.start_at, spec.end_at, spec.max_runs,
                        runs, spec.paused, counted_slot=counted_slot)  # fmt: skip


def _search(search: str | None) -> None:
    if search is None:
        return
    if not isinstance(search, str):
        raise ConfigurationError(f"search must be text, got {type(search).__name__}")
    if len(search) > MAX_SEARCH:
        raise ConfigurationError(
            f"search must be at most {MAX_SEARCH} characters (an id is at most "
            f"{MAX_NAME_LENGTH}), got {len(search)}; search for a shorter part of the id"
        )
    if not is_storable_text(search):
        raise ConfigurationError(
            "search must be text a database can compare: no NUL character (\\u0000) and no "
            "lone surrogate"
        )


def _page(limit: int, offset: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_PAGE:
        raise ConfigurationError(f"limit must be from 1 to {_MAX_PAGE}, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigurationError(f"offset must be a whole number >= 0, got {offset!r}")
