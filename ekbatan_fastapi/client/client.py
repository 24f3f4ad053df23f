"""The scheduler client: schedule, reschedule, cancel and read task instances; the history,
pauses and instances of the cluster.

It needs only the database: the CLI and ``/jobs`` use it with or without a scheduler running
in the same process. A local scheduler (``LocalScheduler``), when given, only adds wake-ups
(work scheduled here is claimed at once) and forced runs on this instance.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol

from ..domain.codec import encode_task_data
from ..domain.errors import (
    ConfigurationError,
    NotRunningError,
    RunNotClaimedError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job, OneTimeJob, schedule_of
from ..domain.persistent import PersistentScheduleJob
from ..domain.rows import (
    ExecutionRecord,
    Finish,
    FinishKind,
    InstanceInfo,
    JobDefinition,
    NewTask,
    Owned,
    PauseInfo,
    TaskRow,
)
from ..domain.schedules import Schedule, parse_schedule
from ..domain.tasks import ScheduledTask, paused_message, slot_after_missed
from ..domain.text import validate_name
from ..store.dialects import Store
from ..store.external import Caller
from ..store.tasks import TaskStore
from .backfill import BackfillResult, backfill
from .forced import forced_elsewhere
from .schedules import ScheduleVerbs
from .traced import Carrier, SchedulingTraces

__all__ = ["LocalScheduler", "SchedulerClient"]

_UNSET: Any = object()
_DEFAULT_DEAD_AFTER = timedelta(seconds=60)
_MAX_ID = 2**63 - 1
"""The largest history id (a BIGINT): ``history(before_id=...)`` is bounded so, as the route is."""


def _aware(at: datetime | None, what: str) -> datetime | None:
    if at is None:
        return None
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ConfigurationError(
            f"{what} must be a timezone-aware datetime, got {at!r}; "
            "use e.g. datetime.now(UTC) + timedelta(minutes=5)"
        )
    return at


class SchedulerClient(ScheduleVerbs):
    """Schedules one-time task instances and reads or changes rows of the table; creates,
    changes and deletes the schedules of a ``PersistentScheduleJob`` (``ScheduleVerbs``).

    ``jobs`` are the jobs known here (to check names and find schedules); ``dead_after`` is
    the cluster's dead window (``heartbeat_interval x missed_heartbeats_limit``), for
    ``instances()``; ``scheduler`` is a scheduler running in this process, if any;
    ``carrier`` gives the trace context to keep with each scheduled one-time task
    (``ekbatan_fastapi.otel``; written to ``ekbatan_trace_context`` in the same transaction).
    """

    def __init__(
        self,
        store: Store,
        jobs: Mapping[str, Job],
        scheduler: LocalScheduler | None = None,
        *,
        dead_after: timedelta = _DEFAULT_DEAD_AFTER,
        carrier: Carrier | None = None,
    ) -> None:
        self._store = store
        self._tasks = store.tasks
        self._ops = store.operations
        self._jobs = jobs
        self._scheduler = scheduler
        self._dead_after = dead_after
        self._traces = SchedulingTraces(store, carrier)

    # -- one-time tasks ------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The stores this client reads and writes through."""
        return self._store

    def _one_time_job(self, job_name: str) -> OneTimeJob:
        validate_name(job_name, "job name")
        job = self._jobs.get(job_name)
        if isinstance(job, PersistentScheduleJob):
            raise UnknownJobError(
                f"{job_name!r} is a PersistentScheduleJob: its rows are schedules; use "
                f"create_schedule({job_name!r}, instance_id, schedule, data)"
            )
        if isinstance(job, OneTimeJob):
            return job
        known = sorted(
            n
            for n, j in self._jobs.items()
            if isinstance(j, OneTimeJob) and not isinstance(j, PersistentScheduleJob)
        )
        if isinstance(job, DistributedJob):
            raise UnknownJobError(
                f"{job_name!r} is a recurring job: its single row is managed by the scheduler; "
                "use run_now() to run it early"
            )
        raise UnknownJobError(
            f"no one-time job named {job_name!r} is registered; registered one-time jobs: "
            f"{', '.join(known) or '(none)'}"
        )

    def _wake_local(self, at: datetime | None) -> None:
        if self._scheduler is not None:
            if at is None:
                self._scheduler.request_poll()
            else:
                self._scheduler.note_due(at)

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The jobs registered here."""
        return self._jobs

    async def wake_cluster(self) -> None:
        """Work is due now: wake the local poller and every listening instance."""
        await self._woken(None, notify=True)

    async def _woken(self, at: datetime | None, *, notify: bool) -> None:
        """Something is due at ``at`` (None: now): wake the local poller, and (``notify``)
        every listening instance."""
        self._wake_local(at)
        if notify and self._tasks.supports_notify:
            await self._tasks.notify(at)

    def _caller(self, connection: Any) -> Caller:
        db = self._store.db
        return Caller(connection, db.engine, what="connection=", translate=db.translate)

    async def _woken_after_commit(
        self, caller: Caller, at: datetime | None, *, notify: bool
    ) -> None:
        """Work written in the caller's transaction: nobody may claim it before the commit.
        PostgreSQL's NOTIFY (sent inside the transaction) is delivered at commit, to this
        instance's listener too. Without it the local poller is woken once the session
        commits (SQLAlchemy's ``after_commit``); a plain connection has no after-commit
        event, so the poller then finds the work at its due time or next poll."""
        if notify and self._tasks.supports_notify:
            await self._tasks.notify_on(caller, at)
            return
        if not caller.after_commit(lambda: self._wake_local(at)) and at is not None:
            self._wake_local(at)

    async def schedule(
        self,
        job_name: str,
        instance_id: str,
        at: datetime | None = None,
        data: Any = None,
        *,
        replace: bool = False,
        priority: int | None = None,
        connection: Any = None,
    ) -> bool:
        """Schedule instance ``instance_id`` of one-time job ``job_name`` at ``at`` (None: now).

        An existing instance is left alone (returns False) unless ``replace`` is true, which
        moves it and replaces its data; a running instance cannot be replaced.
        ``connection`` (an ``AsyncConnection`` or ``AsyncSession`` on the jobs database):
        write it inside that transaction; it runs only if and after the transaction commits.
        """
        job = self._one_time_job(job_name)
        validate_name(instance_id, "instance id")
        at = _aware(at, "at")
        where = f"{job_name}/{instance_id}"
        task = NewTask(
            job_name,
            instance_id,
            at,
            encode_task_data(job.data_model, data, where=where),
            job.priority() if priority is None else priority,
        )
        traced = await self._traces.contexts([(job_name, instance_id)])
        if connection is not None or traced:
            async with self._traces.transaction(connection, self._caller) as caller:
                written = await self._tasks.upsert_on(caller, task, replace=replace)
                await self._traces.save(
                    caller, traced, [(job_name, instance_id)] if written else []
                )
        else:
            written = await self._tasks.upsert(task, replace=replace)
        if not written and replace:
            raise TaskPickedError(f"{where} is running right now; it cannot be replaced")
        if written and connection is not None:
            # the upsert's own NOTIFY is delivered at commit (PostgreSQL)
            await self._woken_after_commit(caller, at, notify=False)
        elif written:
            await self._woken(at, notify=False)  # the upsert notified the cluster itself
        return written

    async def schedule_many(
        self,
        job_name: str,
        instances: Iterable[tuple[str, datetime | None, Any]],
        *,
        connection: Any = None,
    ) -> int:
        """Schedule many instances of one job in one statement: ``(instance_id, at, data)``
        tuples (``at`` None: now). Existing instances are left alone; returns how many were
        created. ``connection``: inside that transaction (see ``schedule``)."""
        job = self._one_time_job(job_name)
        tasks: list[NewTask] = []
        earliest: datetime | None = None
        due_now = False
        for instance_id, at, data in instances:
            validate_name(instance_id, "instance id")
            at = _aware(at, "at")
            if at is None:
                due_now = True
            elif earliest is None or at < earliest:
                earliest = at
            encoded = encode_task_data(job.data_model, data, where=f"{job_name}/{instance_id}")
            tasks.append(NewTask(job_name, instance_id, at, encoded, job.priority()))
        if not tasks:
            return 0
        when = None if due_now else earliest
        traced = await self._traces.contexts([(t.task_name, t.task_instance) for t in tasks])
        if connection is not None or traced:
            async with self._traces.transaction(connection, self._caller) as caller:
                keys = await self._tasks.insert_missing_on(caller, tasks)
                await self._traces.save(caller, traced, keys)
            if connection is not None:
                if keys:
                    await self._woken_after_commit(caller, when, notify=True)
                return len(keys)
        else:
            keys = await self._tasks.insert_missing(tasks)
        await self._woken(when, notify=bool(keys))
        return len(keys)

    async def reschedule(
        self,
        job_name: str,
        instance_id: str,
        at: datetime | None = None,
        data: Any = _UNSET,
        *,
        connection: Any = None,
    ) -> None:
        """Move an instance (recurring: ``instance_id='recurring'``) to ``at`` (None: now).
        ``connection``: inside that transaction (see ``schedule``)."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        at = _aware(at, "at")
        where = f"{job_name}/{instance_id}"
        replace_data = data is not _UNSET
        job = self._jobs.get(job_name)
        model = job.data_model if isinstance(job, OneTimeJob) else None
        task_data = encode_task_data(model, data, where=where) if replace_data else None
        if connection is not None:
            caller = self._caller(connection)
            ok = await self._tasks.reschedule_on(
                caller, job_name, instance_id, at, task_data=task_data, replace_data=replace_data
            )
            if not ok:
                await self._explain_failure(job_name, instance_id, "rescheduled")
            await self._woken_after_commit(caller, at, notify=True)
            return
        ok = await self._tasks.reschedule(
            job_name, instance_id, at, task_data=task_data, replace_data=replace_data
        )
        if not ok:
            await self._explain_failure(job_name, instance_id, "rescheduled")
        await self._woken(at, notify=True)

    async def cancel(self, job_name: str, instance_id: str) -> None:
        """Delete an instance that is not running."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        if not await self._tasks.delete_unpicked(job_name, instance_id):
            await self._explain_failure(job_name, instance_id, "cancelled")

    async def cancel_running(
        self,
        job_name: str,
        instance_id: str = RECURRING_INSTANCE,
        reason: str | None = None,
        *,
        requested_by: str | None = None,
    ) -> str:
        """Stop a running execution, wherever it runs: the instance that runs it cancels its
        asyncio task within one heartbeat interval (a plain ``def`` job cannot be interrupted:
        its ``ctx.cancel_requested`` turns true, and it is recorded as cancelled when it
        returns). The history records ``cancelled`` with who (``requested_by``, else this
        process's scheduler) and why; a recurring job goes on with its next slot, a one-time
        task is removed. Needs no scheduler in this process. Returns the instance that runs
        it. Raises ``NotRunningError`` (a ``TaskNotFoundError``) when it is not running."""
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        cancels = self._store.cancels
        if not await cancels.look(force=True):
            raise SchemaMissingError(
                "the table of requests to stop running executions is missing: run "
                "`ekbatan-jobs migrate` (it applies ekbatan_fastapi/migrations/"
                f"{self._store.db.migrations_folder}/V0006__ekbatan_cancel_requests.sql) or "
                "call `await ekbatan_fastapi.create_schema(engine)`"
            )
        row = await self._tasks.get(job_name, instance_id)
        where = f"{job_name}/{instance_id}"
        if row is None:
            hint = await _instance_hint(self._tasks, self._jobs, job_name, instance_id)
            raise NotRunningError(
                f"{where} is not running: no such task instance is scheduled{hint}"
            )
        if not row.picked or not row.picked_by:
            raise NotRunningError(
                f"{where} is not running right now (next due at "
                f"{row.execution_time.isoformat()}); there is nothing to stop (to delete a "
                "one-time task that waits, use cancel; to stop a recurring job's slots, pause)"
            )
        by = requested_by
        if by is None and self._scheduler is not None:
            by = self._scheduler.name
        await cancels.request(job_name, instance_id, row.version, by, reason)
        return row.picked_by

    async def _explain_failure(self, job_name: str, instance_id: str, verb: str) -> None:
        await explain_failure(self._tasks, self._jobs, job_name, instance_id, verb)

    # -- running now ---------------------------------------------------------------------

    async def run_now(
        self,
        job_name: str,
        instance_id: str = RECURRING_INSTANCE,
        *,
        force: bool = False,
        wait: float = 30.0,
        force_hint: str = "force=True",
    ) -> str | None:
        """Make an instance due now (database clock), keeping its failure counters.

        A paused task raises TaskPausedError unless ``force``. A forced run is claimed and
        started on this instance at once when a local scheduler has the job; otherwise the
        pause is lifted until some instance claims the row (at most ``wait`` seconds) and
        then put back as it was. The task stays paused either way. Returns who claimed a
        forced run (None for an ordinary one).
        """
        validate_name(job_name, "job name")
        validate_name(instance_id, "instance id")
        pause = (await self.paused()).get(job_name)
        if pause is None:
            await self.reschedule(job_name, instance_id, None)
            return None
        if not force:
            raise TaskPausedError(paused_message(job_name, pause, force_hint))
        local = self._scheduler
        if local is not None and job_name in local.jobs:
            with local.claiming():
                row = await self._tasks.claim_now(job_name, instance_id, local.name)
                if row is not None and local.is_shutting_down:
                    await self._give_back(row, local.name)
                if row is not None:
                    local.run_claimed(row)
            if row is None:
                await self._explain_failure(job_name, instance_id, "run")
                return None
            return local.name
        return await forced_elsewhere(self, job_name, instance_id, pause, wait)

    async def _give_back(self, row: TaskRow, scheduler: str) -> None:
        """The local scheduler began stopping while it claimed ``row`` for a forced run: it
        will run nothing more, so the row is unpicked now (else it would stay picked by a
        stopped instance until revived after the dead window) and the caller told so."""
        owned = Owned(row.task_name, row.task_instance, row.version)
        await self._tasks.finish([Finish(owned, FinishKind.RELEASED)])
        raise RunNotClaimedError(
            f"scheduler {scheduler} began stopping while it claimed the forced run of "
            f"{row.task_name}/{row.task_instance}: nothing ran, the row is given back (still "
            "paused, due now); force the run again on a running instance"
        )

    # -- operations: history, pause/resume, instances ------------------------------------

    async def _require_ops(self) -> None:
        if not await self._ops.look():
            raise SchemaMissingError(
                "the operations tables (execution history, paused tasks, instances) are "
                "missing: run `ekbatan-jobs migrate` (it applies ekbatan_fastapi/migrations/"
                f"{self._store.db.migrations_folder}/V0002__ekbatan_operations.sql) or call "
                "`await ekbatan_fastapi.create_schema(engine)`"
            )

    async def is_known(self, job_name: str) -> bool:
        """Registered here, in the table, paused, or in the history."""
        if job_name in self._jobs or await self._tasks.list_tasks(job_name, limit=1):
            return True
        if not await self._ops.look():
            return False
        if job_name in await self._ops.paused():
            return True
        return bool(await self._ops.history(job_name, limit=1))

    async def _known_task(self, job_name: str) -> None:
        validate_name(job_name, "job name")
        if not await self.is_known(job_name):
            raise TaskNotFoundError(
                f"unknown task {job_name!r}: no job of that name is registered here, and the "
                "table has no row, pause or history of it"
            )

    async def history(
        self, job_name: str | None = None, *, limit: int = 50, before_id: int | None = None
    ) -> list[ExecutionRecord]:
        """Executions, newest first; page with ``before_id`` = the last id of a page."""
        if job_name is not None:
            validate_name(job_name, "job name")
        if not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit must be from 1 to 1000, got {limit}")
        if before_id is not None and not (isinstance(before_id, int) and 1 <= before_id <= _MAX_ID):
            raise ConfigurationError(
                f"before_id must be a history id from 1 to {_MAX_ID} (the last id of the "
                f"previous page), got {before_id!r}"
            )
        await self._require_ops()
        return await self._ops.history(job_name, limit=limit, before_id=before_id)

    async def pause(
        self,
        job_name: str,
        reason: str | None = None,
        *,
        paused_by: str | None = None,
        instance_id: str | None = None,
    ) -> None:
        """Pause a task cluster-wide: no instance claims it until resumed (survives restarts).
        Executions already running finish normally. ``instance_id``: pause that one schedule
        of a ``PersistentScheduleJob`` only (``pause_schedule``)."""
        if instance_id is not None:
            by = paused_by or (self._scheduler.name if self._scheduler is not None else None)
            await self.pause_schedule(job_name, instance_id, reason, paused_by=by)
            return
        await self._known_task(job_name)
        await self._require_ops()
        by = paused_by
        if by is None and self._scheduler is not None:
            by = self._scheduler.name
        await self._ops.pause(job_name, by, reason)

    async def resume(
        self,
        job_name: str,
        *,
        skip_missed: bool = False,
        schedule: Schedule | None = None,
        instance_id: str | None = None,
    ) -> bool:
        """Resume a paused task; False if it was not paused. An overdue slot then runs once,
        unless ``skip_missed`` moves a recurring row to its next future slot: by the
        registered job's schedule, or ``schedule`` where the job is not registered here
        (the table does not store schedules). ``instance_id``: resume that one schedule of a
        ``PersistentScheduleJob`` (at its next slot from now; ``resume_schedule``)."""
        if instance_id is not None:
            return await self.resume_schedule(job_name, instance_id)
        await self._known_task(job_name)
        await self._require_ops()
        if skip_missed:  # move it while still paused
            await self.skip_missed(job_name, schedule)
        resumed = await self._ops.resume(job_name)
        if resumed:
            await self._woken(None, notify=True)
        return resumed

    async def skip_missed(self, job_name: str, schedule: Schedule | None = None) -> datetime | None:
        """Move an overdue recurring row to its next future slot (by the registered job's
        schedule, else ``schedule``); where it went, or None when it was not overdue."""
        validate_name(job_name, "job name")
        job = self._jobs.get(job_name)
        if isinstance(job, DistributedJob):
            schedule = schedule_of(job)
        row = await self._tasks.get(job_name, RECURRING_INSTANCE)
        if row is None:
            return None
        now = await self._tasks.db_now()
        task = ScheduledTask.from_row(row)
        if task.picked or task.execution_time > now:
            return None
        stored = (await self.job_definitions()).get(job_name) if schedule is None else None
        if stored is not None and stored.schedule is not None:
            schedule = parse_schedule(stored.schedule).bind(job_name)
        if schedule is None:
            raise ConfigurationError(
                f"{job_name} is overdue since {row.execution_time.isoformat()}; skipping to its "
                "next slot needs the job's schedule, which is neither registered here nor "
                "stored in ekbatan_jobs (migration V0003): pass the "
                "schedule (the CLI: --schedule 'FIXED_RATE|PT1H'), or resume from an "
                "application that registers the job"
            )
        following = slot_after_missed(schedule, task, now)
        if following is None or not await self._tasks.reschedule(
            job_name, RECURRING_INSTANCE, following, expected_version=row.version
        ):
            raise TaskPickedError(f"{job_name} changed meanwhile (it may be running); try again")
        return following

    async def backfill(
        self,
        job_name: str,
        start: datetime,
        end: datetime,
        *,
        force: bool = False,
        force_hint: str = "force=True",
    ) -> BackfillResult:
        """Run each slot of the recurring job's schedule in ``[start, end)`` once, with
        ``ctx.execution_time`` = the slot, as one-time rows of the job
        (``backfill:<slot>``) on whichever instance claims them; asking again for the same
        slots adds nothing. A paused job raises TaskPausedError unless ``force`` (the rows
        then wait until it is resumed)."""
        begin, until = _aware(start, "start"), _aware(end, "end")
        assert begin is not None and until is not None
        return await backfill(self, job_name, begin, until, force=force, force_hint=force_hint)

    async def paused(self) -> dict[str, PauseInfo]:
        """Every paused task (empty when the operations tables are missing)."""
        if not await self._ops.look():
            return {}
        return await self._ops.paused()

    async def instances(self) -> list[InstanceInfo]:
        """Scheduler instances as they last reported themselves; ``alive`` = seen within the
        dead window."""
        await self._require_ops()
        return await self._ops.instances(self._dead_after)

    # -- reading -------------------------------------------------------------------------

    async def get(self, job_name: str, instance_id: str) -> ScheduledTask | None:
        row = await self._tasks.get(job_name, instance_id)
        return ScheduledTask.from_row(row) if row else None

    async def list(
        self,
        job_name: str | None = None,
        *,
        picked: bool | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[ScheduledTask]:
        """Instances ordered by execution time; filter by job name and picked state."""
        rows = await self._tasks.list_tasks(job_name, picked=picked, limit=limit, offset=offset)
        return [ScheduledTask.from_row(r) for r in rows]

    async def job_definitions(self) -> dict[str, JobDefinition]:
        """Every job the cluster's instances registered (``ekbatan_jobs``, migration V0003):
        kind, schedule, timeout, concurrency limit, app version; empty without the table."""
        if not await self._store.jobs.look():
            return {}
        return await self._store.jobs.definitions()

    async def missed_streaks(self, names: Collection[str]) -> dict[tuple[str, str], int]:
        """Consecutive slots each recurring task instance of ``names`` missed since its last
        run (merged by ``CatchUp.latest``, skipped by its catch-up policy, due while a run
        was going), by (name, instance); only those with a streak going on. Empty without
        ``ekbatan_missed_streaks`` (migration V0007)."""
        return await self._store.jobs.streaks(names)

    async def backfill_counts(self) -> dict[str, int]:
        """Backfilled slots waiting or running, by job, cluster-wide."""
        return await self._store.jobs.backfills()

    async def running_counts(self) -> dict[str, int]:
        """Executions running now across the cluster, by job name."""
        return await self._store.jobs.running()

    async def timed_out_counts(self, since: timedelta = timedelta(days=1)) -> dict[str, int]:
        """Executions that ran past their timeout in the last ``since``, by job name (from
        the history; empty without it)."""
        if not await self._ops.look():
            return {}
        now = await self._tasks.db_now()
        return await self._store.jobs.timed_out_since(now - since)

    async def database_time(self) -> datetime:
        """The database's clock (the one every due and dead decision uses)."""
        return await self._tasks.db_now()


# -- what the client uses of a scheduler in the same process -----------------------------------


class LocalScheduler(Protocol):
    """What the client uses of a scheduler running in the same process."""

    @property
    def name(self) -> str: ...

    @property
    def jobs(self) -> Mapping[str, Job]: ...

    def request_poll(self) -> None: ...

    def note_due(self, when: datetime) -> None: ...

    @property
    def is_shutting_down(self) -> bool: ...

    def claiming(self) -> AbstractContextManager[None]: ...

    def run_claimed(self, row: TaskRow) -> None: ...


# -- why a change to one task instance was not made --------------------------------------------

_SHOWN = 3
"""Instances named as examples in the hint."""


async def explain_failure(
    tasks: TaskStore, jobs: Mapping[str, Job], job_name: str, instance_id: str, verb: str
) -> None:
    """Raise the error that says why ``job_name/instance_id`` was not ``verb``."""
    row = await tasks.get(job_name, instance_id)
    where = f"{job_name}/{instance_id}"
    if row is None:
        hint = await _instance_hint(tasks, jobs, job_name, instance_id)
        raise TaskNotFoundError(f"no task instance {where} is scheduled{hint}")
    if row.picked:
        raise TaskPickedError(
            f"{where} is running right now on {row.picked_by}; it cannot be {verb} until "
            "it finishes"
        )
    raise TaskPickedError(f"{where} changed concurrently and was not {verb}; try again")


async def _instance_hint(
    tasks: TaskStore, jobs: Mapping[str, Job], job_name: str, instance_id: str
) -> str:
    if instance_id != RECURRING_INSTANCE or isinstance(jobs.get(job_name), DistributedJob):
        return ""
    rows = await tasks.list_tasks(job_name, limit=_SHOWN + 1)
    if job_name not in jobs and not rows:
        return ""
    shown = ", ".join(repr(r.task_instance) for r in rows[:_SHOWN])
    more = ", ..." if len(rows) > _SHOWN else ""
    scheduled = f" (scheduled now: {shown}{more})" if rows else ""
    return (
        f": {job_name} is a one-time job whose instances have ids of their own{scheduled}; "
        "name one: ?instance=<id> over HTTP, --instance <id> in the CLI, instance_id in Python"
    )
