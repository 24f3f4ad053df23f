"""``TaskStore``: reads and writes ``scheduled_tasks``: the statements every dialect shares
(SQLAlchemy Core), the interface each dialect implements (its own module adds the hot path),
and the lease protocol.

The lease protocol, which every dialect implements:

* A row is *owned* by the instance whose claim set ``picked=true`` and bumped ``version``;
  the owner remembers that version (``Owned``).
* Every write by the owner (heartbeat, finish) is guarded by ``version = <ours>``. Zero rows
  updated means the row was revived or changed elsewhere: the owner has lost it and must not
  record anything.
* Every "is it due / is it dead" comparison uses the database clock (``now()`` in SQL).
* Reviving a dead execution bumps ``version`` and keeps ``execution_time`` (the slot keeps
  its identity), so the stale owner's later writes match zero rows.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, func, or_, select, tuple_, update
from sqlalchemy.sql import Executable

from ..domain.durations import format_iso_duration
from ..domain.rows import (
    ExecutionRecord,
    Finish,
    FinishKind,
    NewTask,
    Own,
    Owned,
    PollingStrategy,
    PollResult,
    Revival,
    TaskKey,
    TaskRow,
)
from .database import Database, Lease, aware, chunks
from .external import Caller

__all__ = ["HistoryTableMissing", "HistoryUnwritable", "TaskStore"]

_UNRESOLVED_BATCH = 1000
"""Overdue rows read per page when looking for unresolved ones (and deleted per statement)."""
_NAMES_CHUNK = 1000
"""Task names per statement where a portable statement lists names."""


class HistoryUnwritable(Exception):
    """``finish`` failed because of the history it was to write with the results (a value or
    a permission the database refused); nothing was written. Send the results without it."""


class HistoryTableMissing(HistoryUnwritable):
    """The history table went away while ``finish`` wrote the history with the results."""


class TaskStore(abc.ABC):
    """``scheduled_tasks`` for one dialect; ``db`` sends the statements. The statements every
    dialect shares are here, in SQLAlchemy Core (reads, reschedules, forced runs, the
    housekeeper's cleanups, and the writes inside the caller's transaction); a dialect's
    subclass adds the hot path (the abstract methods)."""

    supports_skip_locked: bool = False
    supports_notify: bool = False

    async def galera(self) -> bool:
        """Whether the database is a node of a MariaDB Galera cluster (``wsrep_on``): row
        locks and ``GET_LOCK`` hold on one node only there."""
        return False

    """True where ``listen`` can push "something became due" to every instance."""
    writes_history_with_finish: bool = False
    """True where ``finish`` can insert the execution history in the same statement."""
    supports_claim_ahead: bool = False
    """True where ``poll`` takes ``ahead`` (``claim_ahead``)."""

    keys_per_statement: int = _UNRESOLVED_BATCH
    """Primary keys a statement lists at most (``(task_name, task_instance) IN ...``)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.tables.tasks
        self.on_statement: Callable[[str, str], None] | None = None
        """Called with a statement's name and text before each statement sent to the driver
        directly, past SQLAlchemy (the scheduler sets it when an observer wants
        ``statement_sent``); None: nothing is called."""

    @property
    def dialect_name(self) -> str:
        return self.db.dialect_name

    def to_row(self, row: Row[Any] | Any) -> TaskRow:
        m = row._mapping
        execution_time = aware(m["execution_time"])
        assert execution_time is not None
        return TaskRow(
            task_name=m["task_name"],
            task_instance=m["task_instance"],
            task_data=bytes(m["task_data"]) if m["task_data"] is not None else None,
            execution_time=execution_time,
            picked=bool(m["picked"]),
            picked_by=m["picked_by"],
            last_success=aware(m["last_success"]),
            last_failure=aware(m["last_failure"]),
            consecutive_failures=m["consecutive_failures"],
            last_heartbeat=aware(m["last_heartbeat"]),
            version=int(m["version"]),
            priority=m["priority"],
        )

    # -- shared, portable statements ----------------------------------------------------

    async def db_now(self) -> datetime:
        """The database's clock; the statement also proves that the table exists."""
        probe = select(self.table.c.version).limit(1).scalar_subquery()
        now, _ = await self.db.clock(probe)
        assert isinstance(now, datetime)
        return now

    async def get(self, task_name: str, task_instance: str) -> TaskRow | None:
        t = self.table
        stmt = select(t).where(t.c.task_name == task_name, t.c.task_instance == task_instance)
        rows = await self.db.rows(stmt)
        return self.to_row(rows[0]) if rows else None

    async def list_tasks(
        self,
        task_name: str | None = None,
        *,
        picked: bool | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[TaskRow]:
        """Rows ordered by execution time (``LIMIT``/``OFFSET``, portable everywhere)."""
        t = self.table
        stmt = select(t).order_by(t.c.execution_time, t.c.task_name, t.c.task_instance)
        if task_name is not None:
            stmt = stmt.where(t.c.task_name == task_name)
        if picked is not None:
            stmt = stmt.where(t.c.picked == picked)
        stmt = stmt.limit(limit).offset(offset)
        return [self.to_row(r) for r in await self.db.rows(stmt)]

    async def reschedule(
        self,
        task_name: str,
        task_instance: str,
        execution_time: datetime | None,
        *,
        task_data: bytes | None = None,
        replace_data: bool = False,
        expected_version: int | None = None,
    ) -> bool:
        """Move an unpicked row to ``execution_time`` (None: the database's now), bumping
        ``version``. Counters are kept. False when the row is absent, picked, or (with
        ``expected_version``) changed since it was read: nothing was written."""
        stmt = self._reschedule(task_name, task_instance, execution_time, task_data, replace_data)
        if expected_version is not None:
            stmt = stmt.where(self.table.c.version == expected_version)
        return await self.db.rowcount(stmt) == 1

    def _reschedule(
        self,
        task_name: str,
        task_instance: str,
        execution_time: datetime | None,
        task_data: bytes | None,
        replace_data: bool,
    ) -> Any:
        t = self.table
        values: dict[str, Any] = {
            "execution_time": (
                execution_time if execution_time is not None else self.db.now_expr()
            ),
            "version": t.c.version + 1,
        }
        if replace_data:
            values["task_data"] = task_data
        return (
            update(t)
            .where(
                t.c.task_name == task_name,
                t.c.task_instance == task_instance,
                t.c.picked.is_(False),
            )
            .values(values)
        )

    async def delete_unpicked(self, task_name: str, task_instance: str) -> bool:
        """Delete a row unless it is running. False when absent or picked."""
        t = self.table
        stmt = delete(t).where(
            t.c.task_name == task_name,
            t.c.task_instance == task_instance,
            t.c.picked.is_(False),
        )
        return await self.db.rowcount(stmt) == 1

    async def claim_now(self, task_name: str, task_instance: str, picked_by: str) -> TaskRow | None:
        """Claim one unpicked row at once, moving its slot to now (a forced run). Same claim
        as a poll's (``version + 1``, heartbeat now); None when absent or already picked."""
        t = self.table
        where = (t.c.task_name == task_name, t.c.task_instance == task_instance)
        now = self.db.now_expr()
        claim = (
            update(t)
            .where(*where, t.c.picked.is_(False))
            .values(
                picked=True,
                picked_by=picked_by,
                last_heartbeat=now,
                execution_time=now,
                version=t.c.version + 1,
            )
        )
        async with self.db.connect(self.db.tx_engine, begin=True) as conn:
            if (await conn.execute(claim)).rowcount != 1:
                return None
            row = (await conn.execute(select(t).where(*where))).one()
        return self.to_row(row)

    async def recurring_rows(self, names: Sequence[str], instance: str) -> list[TaskRow]:
        """The rows ``(name, instance)`` of ``names``, read ``_NAMES_CHUNK`` names at a time (a
        statement never carries a bound parameter per name of a 100,000-job application)."""
        t = self.table
        unique = list(dict.fromkeys(names))
        found: list[TaskRow] = []
        for chunk in chunks(unique, _NAMES_CHUNK):
            stmt = select(t).where(t.c.task_instance == instance, t.c.task_name.in_(chunk))
            found += [self.to_row(r) for r in await self.db.rows(stmt)]
        return found

    async def delete_unresolved(self, known_names: Sequence[str], older_than: timedelta) -> int:
        """Delete unpicked rows of task names this instance does not know, overdue by more
        than ``older_than`` (measured on the database clock from ``execution_time``).

        The overdue unpicked rows are read in pages (``execution_time_idx``, in time order),
        the known names are left out here (however many there are: no ``NOT IN`` with a bound
        parameter per name), and the others are deleted by primary key with the same guards: a
        scanning ``DELETE`` would wait for every row another transaction holds locked (InnoDB
        locks what it scans), and the housekeeper with it."""
        t = self.table
        known = set(known_names)
        cutoff = (await self.db_now()) - older_than
        guards = (t.c.picked.is_(False), t.c.execution_time < cutoff)
        key = tuple_(t.c.task_name, t.c.task_instance)
        deleted = 0
        after: tuple[datetime, str, str] | None = None
        while True:
            page = select(t.c.execution_time, t.c.task_name, t.c.task_instance).where(*guards)
            if after is not None:
                page = page.where(
                    tuple_(t.c.execution_time, t.c.task_name, t.c.task_instance) > after
                )
            order = (t.c.execution_time, t.c.task_name, t.c.task_instance)
            found = await self.db.rows(page.order_by(*order).limit(_UNRESOLVED_BATCH))
            if not found:
                return deleted
            last = found[-1]
            after = (last[0], last[1], last[2])
            keys = [(r[1], r[2]) for r in found if r[1] not in known]
            for chunk in chunks(keys, self.keys_per_statement):
                deleted += await self.db.rowcount(delete(t).where(key.in_(chunk), *guards))
            if len(found) < _UNRESOLVED_BATCH:
                return deleted

    async def mark_retry(
        self, owned: Owned, task_data: bytes, expected: Sequence[bytes | None] = ()
    ) -> bool:
        """Store a failed recurring slot's pending retry (or a buffered slot) in its row,
        still ours (guarded by the claimed version). ``expected``: only over one of these
        ``task_data`` (a schedule row: what its run's count wrote, or what it was claimed
        with; an edit made meanwhile, ``update_schedule`` or a pause, is not overwritten).
        False: the row was revived elsewhere, or edited, meanwhile."""
        stmt = self._mark(owned, task_data)
        if expected:
            t = self.table
            stmt = stmt.where(or_(*(t.c.task_data == d for d in expected if d is not None)))
        return await self.db.rowcount(stmt) == 1

    async def mark_on(self, caller: Caller, owned: Owned, task_data: bytes) -> bool:
        """``mark_retry`` inside the caller's transaction (``ctx.transaction()``)."""
        return await caller.rowcount(self._mark(owned, task_data)) == 1

    def _mark(self, owned: Owned, task_data: bytes) -> Any:
        t = self.table
        return (
            update(t)
            .where(
                t.c.task_name == owned.task_name,
                t.c.task_instance == owned.task_instance,
                t.c.version == owned.version,
            )
            .values(task_data=task_data)
        )

    # -- inside the caller's transaction ----------------------------------------------------

    def completion(self, finish: Finish) -> Executable:
        """The version-guarded write that records one result (what ``finish`` does for a
        batch), as one portable statement."""
        t = self.table
        owned = finish.owned
        where = (
            t.c.task_name == owned.task_name,
            t.c.task_instance == owned.task_instance,
            t.c.version == owned.version,
        )
        if finish.kind is FinishKind.DELETED:
            return delete(t).where(*where)
        now = self.db.now_expr()
        values: dict[str, Any] = {
            "picked": False,
            "picked_by": None,
            "last_heartbeat": None,
            "version": t.c.version + 1,
        }
        if finish.next_time is not None:
            values["execution_time"] = finish.next_time
        if finish.kind is FinishKind.SUCCEEDED:
            values.update(last_success=now, consecutive_failures=0)
        elif finish.kind is FinishKind.FAILED:
            failures = func.coalesce(t.c.consecutive_failures, 0) + 1
            values.update(last_failure=now, consecutive_failures=failures)
        return update(t).where(*where).values(values)

    async def finish_on(self, caller: Caller, finish: Finish) -> bool:
        """Record one result inside the caller's transaction (``ctx.transaction()``). False:
        the guarded write matched no row (the execution was superseded); nothing written."""
        return await caller.rowcount(self.completion(finish)) == 1

    async def reschedule_on(
        self,
        caller: Caller,
        task_name: str,
        task_instance: str,
        execution_time: datetime | None,
        *,
        task_data: bytes | None = None,
        replace_data: bool = False,
    ) -> bool:
        """``reschedule`` inside the caller's transaction."""
        return (
            await caller.rowcount(
                self._reschedule(task_name, task_instance, execution_time, task_data, replace_data)
            )
            == 1
        )

    async def release_orphans(
        self,
        picked_by: str,
        held: Collection[TaskKey],
        older_than: timedelta,
        still_safe: Callable[[], bool] = lambda: True,
    ) -> list[TaskRow]:
        """Unpick the rows picked by ``picked_by`` that it does not hold (``held``): claims
        whose answer it never saw (the statement timed out on the client, and executed on the
        server). Only rows whose heartbeat (set by the claim) is older than ``older_than``
        (so no claim that is still being answered), each guarded by the version it was found
        at, and only while ``still_safe()``; ``version + 1``, ``execution_time`` kept."""
        t = self.table
        cutoff = (await self.db_now()) - older_than
        found = await self.db.rows(
            select(t).where(
                t.c.picked.is_(True), t.c.picked_by == picked_by, t.c.last_heartbeat < cutoff
            )
        )
        released = []
        for row in (self.to_row(r) for r in found):
            if row.key in held or not still_safe():
                continue
            stmt = (
                update(t)
                .where(
                    t.c.task_name == row.task_name,
                    t.c.task_instance == row.task_instance,
                    t.c.version == row.version,
                    t.c.picked.is_(True),
                    t.c.picked_by == picked_by,
                )
                .values(picked=False, picked_by=None, last_heartbeat=None, version=t.c.version + 1)
            )
            if await self.db.rowcount(stmt) == 1:
                released.append(row)
        return released

    # -- each dialect's writes inside the caller's transaction ---------------------------

    @abc.abstractmethod
    async def upsert_on(self, caller: Caller, task: NewTask, *, replace: bool) -> bool:
        """``upsert`` inside the caller's transaction (it commits or rolls back with it)."""

    @abc.abstractmethod
    async def insert_missing_on(self, caller: Caller, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """``insert_missing`` inside the caller's transaction; the keys it inserted."""

    async def notify_on(self, caller: Caller, execution_time: datetime | None) -> None:
        """``notify`` inside the caller's transaction (sent when it commits)."""
        return None

    # -- the hot path: each dialect's own statements ------------------------------------

    @abc.abstractmethod
    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """Insert rows that do not exist yet, race-safely (version 1, unpicked); the keys
        actually inserted, sorted. A task whose ``execution_time`` is None is due at the database's
        now. Existing rows are not touched."""

    @abc.abstractmethod
    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """Insert ``task``; when it exists, replace time/data/priority (``version + 1``) only
        if ``replace`` and the row is not picked. True when something was written."""

    @abc.abstractmethod
    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: PollingStrategy,
        *,
        skip_paused: bool = False,
        lease: Lease | None = None,
        ahead: timedelta = timedelta(0),
    ) -> PollResult:
        """Claim up to ``limit`` due rows (``picked=false AND execution_time <= now()``,
        ``priority DESC, execution_time ASC``) of ``names`` for ``picked_by``; with
        ``skip_paused``, not the task names in the pause table (it must exist).

        A claim sets ``picked=true, picked_by, last_heartbeat=now(), version=version+1`` and is
        exclusive: a row is claimed by at most one caller (fetch: guarded by the version the
        candidate had when read; lock-and-fetch: by the row lock). Also returns the database's
        now and the earliest future ``execution_time`` of an unpicked row of ``names``; a
        dialect may return an earlier one when a due row was left unclaimed (a peer held its
        lock), and the scheduler then polls again soon; or None when the batch came back full
        (``more_due``: the poller polls again at once without reading it).

        ``ahead`` (``claim_ahead``, where ``supports_claim_ahead``): rows due up to that long
        from now count as due, and the next due time is the earliest after that.

        Each dialect implements it itself (the hot path: no call in between); it calls
        ``check_lead`` first when given a lead.
        """

    def check_lead(self, ahead: timedelta) -> None:
        """Refuse a lead where the dialect cannot claim ahead (``supports_claim_ahead``)."""
        if ahead and not self.supports_claim_ahead:
            raise ValueError(
                f"{self.dialect_name} cannot claim rows ahead of their time "
                f"(ahead={format_iso_duration(ahead)}); "
                "pass ahead=timedelta(0) (set claim_ahead to 0)"
            )

    @abc.abstractmethod
    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[ExecutionRecord] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        """Record results; each write guarded by the owned version (``Finish.owned``). Returns
        the keys recorded; a key missing from the answer matched zero rows: the row was revived
        (or finished) elsewhere and nothing was written for it.

        ``history`` (only where ``writes_history_with_finish``): records inserted into the
        history table by the same statement, ``superseded`` where no write matched. ``retry``:
        an earlier attempt of the same batch failed and may have committed (its answer lost):
        records already in the table are not written again (each dialect implements it
        itself: the hot path)."""

    @abc.abstractmethod
    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        """Set ``last_heartbeat=now()`` on owned rows, each guarded by its version and
        ``picked``; the keys updated (a key missing: the row is no longer ours)."""

    async def revive_dead(
        self,
        names: Sequence[str],
        dead_after: timedelta,
        *,
        own: Own | None = None,
        held: Collection[TaskKey] = (),
    ) -> Revival:
        """Unpick rows of ``names`` whose heartbeat is older than ``dead_after`` (or missing),
        each guarded by the version it was found dead at, bumping ``version`` and keeping
        ``execution_time``; and say when the next picked row would be dead.

        ``own`` and ``held`` are the checking instance's: a row among ``held`` (the rows it
        runs) or picked by ``own.name`` with a heartbeat since ``own.since`` (claimed by this
        incarnation) is never revived: its owner knows it is alive, whatever its heartbeat
        says (an outage longer than the dead window stopped the heartbeats, not the
        execution). A row of its name beaten last before ``own.since`` is a previous
        incarnation's (a restarted container keeps its host name and pid), revived as any."""
        return await self._revive_dead(names, dead_after, own, held)

    @abc.abstractmethod
    async def _revive_dead(
        self,
        names: Sequence[str],
        dead_after: timedelta,
        own: Own | None,
        held: Collection[TaskKey],
    ) -> Revival:
        """``revive_dead`` of this dialect."""

    # -- optional push notifications ------------------------------------------------------

    async def notify(self, execution_time: datetime | None) -> None:
        """Tell every listening instance that a row is due at ``execution_time`` (None: now);
        a no-op where the dialect has no notifications (instances learn of it when they poll)."""
        return None

    async def listen(self, on_due: Callable[[datetime | None], None]) -> None:
        """Call ``on_due`` for every notification until the connection is lost (then raise);
        only dialects with ``supports_notify`` implement it."""
        raise NotImplementedError(f"{self.dialect_name} has no notifications")

    # -- for benchmarks -------------------------------------------------------------------

    def statements(self) -> dict[str, str]:
        """The hot path's statement texts (``:name`` parameters), by name: what
        ``bench/db_limit.py`` hands to the database's own load client. Empty where the
        dialect builds its statements per call."""
        return {}
