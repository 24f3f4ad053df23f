"""``PortableTasks``: the ``scheduled_tasks`` statements every dialect shares, in SQLAlchemy
Core: reads, reschedules, forced runs, the housekeeper's cleanups, and the writes inside the
caller's transaction. ``TaskStore`` (``tasks.py``) adds the interface each dialect implements
and the lease protocol those statements keep (every owner's write guarded by its version)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, func, select, tuple_, update
from sqlalchemy.sql import Executable

from ..domain.rows import Finish, FinishKind, TaskKey, TaskRow
from .database import Database, aware, chunks
from .external import Caller

__all__ = ["PortableTasks"]

_UNRESOLVED_BATCH = 1000
"""Overdue rows read per page when looking for unresolved ones (and deleted per statement)."""
_NAMES_CHUNK = 1000
"""Task names per statement where a portable statement lists names."""


class PortableTasks:
    """The portable statements on ``db``'s ``scheduled_tasks``."""

    keys_per_statement: int = _UNRESOLVED_BATCH
    """Primary keys a statement lists at most (``(task_name, task_instance) IN ...``)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.tables.tasks

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
