"""``OperationsStore``: our own tables (execution history, paused tasks, live instances).

The statements are portable SQLAlchemy Core; the one that differs by dialect (the upsert of a
pause or an instance row) comes from the dialect's ``Database``. Whether the tables exist is
looked up once and remembered (again at most every 30 s while they are missing), so the
scheduler, ``/jobs`` and the client do not inspect the catalog on every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from ..domain.rows import ExecutionRecord, InstanceInfo, PauseInfo
from .database import Database, known_time
from .external import Caller
from .presence import TablesPresence

__all__ = ["OperationsStore"]

_RECHECK_MISSING = 30.0


class OperationsStore:
    """History, pauses and instances, through the jobs database's engine and clock."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.tables = db.tables
        self.presence = TablesPresence(db, db.tables.operations, _RECHECK_MISSING)

    # -- do the tables exist? ------------------------------------------------------------

    @property
    def present(self) -> bool:
        """The tables were found (as of the last look)."""
        return self.presence.present

    async def look(self, *, force: bool = False) -> bool:
        """True when all three tables exist (they come with migration V0002). Found once, they
        are taken to exist until ``forget`` (a statement found one gone); while missing, the
        catalog is read again at most every 30 s (``force``: now)."""
        return await self.presence.look(force=force)

    def forget(self) -> None:
        """A statement found a table gone: look again (not before 30 s)."""
        self.presence.forget()

    # -- history ------------------------------------------------------------------------

    async def insert_history(self, records: Sequence[ExecutionRecord]) -> None:
        """Insert many records in one executemany (where the task store does not write them
        with the completion)."""
        if not records:
            return
        await self.db.rowcount(insert(self.tables.history), self._history_rows(records))

    async def insert_history_on(self, caller: Caller, records: Sequence[ExecutionRecord]) -> None:
        """Insert records inside the caller's transaction (``ctx.transaction()``: the history
        commits with the effects and the completion)."""
        if records:
            await caller.execute(insert(self.tables.history), self._history_rows(records))

    @staticmethod
    def _history_rows(records: Sequence[ExecutionRecord]) -> list[dict[str, Any]]:
        return [
            {
                "task_name": r.task_name,
                "task_instance": r.task_instance,
                "execution_time": r.execution_time,
                "picked_by": r.picked_by,
                "started_at": r.started_at,
                "finished_at": r.finished_at,
                "outcome": r.outcome,
                "error_class": r.error_class,
                "error_message": r.error_message,
            }
            for r in records
        ]

    def history_query(
        self, task_name: str | None, *, limit: int = 50, before_id: int | None = None
    ) -> Select[Any]:
        """The page ``history`` reads, newest first. Every task's: the primary key walked
        backwards from ``before_id``. One task's: ``limit`` entries of
        ``ekbatan_history_task_idx`` (task name, id) walked backwards, however big the table.

        The name is matched as the range ``name <= task_name <= name`` and the page ordered by
        (task name, id), not ``task_name = name ... ORDER BY id``: with the equality, both
        PostgreSQL and MySQL may plan a backward walk of the primary key filtered by name
        (ordered already, cheap for a task that runs often), which for a rare task (a daily job
        beside a busy one, a job gone since last week) reads most of the table, and which a
        generic plan picks for every name. Only the task index yields this order."""
        h = self.tables.history
        if task_name is None:
            stmt = select(h).order_by(h.c.id.desc()).limit(limit)
            return stmt if before_id is None else stmt.where(h.c.id < before_id)
        stmt = (
            select(h)
            .where(h.c.task_name >= task_name, h.c.task_name <= task_name)
            .order_by(h.c.task_name.desc(), h.c.id.desc())
            .limit(limit)
        )
        return stmt if before_id is None else stmt.where(h.c.id < before_id)

    async def history(
        self, task_name: str | None, *, limit: int = 50, before_id: int | None = None
    ) -> list[ExecutionRecord]:
        """Newest first; page with ``before_id`` (the last id of the previous page)."""
        stmt = self.history_query(task_name, limit=limit, before_id=before_id)
        return [
            ExecutionRecord(
                id=r.id,
                task_name=r.task_name,
                task_instance=r.task_instance,
                execution_time=known_time(r.execution_time),
                picked_by=r.picked_by,
                started_at=known_time(r.started_at),
                finished_at=known_time(r.finished_at),
                outcome=r.outcome,
                error_class=r.error_class,
                error_message=r.error_message,
            )
            for r in await self.db.rows(stmt)
        ]

    async def history_cutoff(self, older_than: timedelta) -> datetime:
        """The database's now minus ``older_than``: records finished before it are expired."""
        return known_time((await self.db.clock())[0]) - older_than

    async def prune_history_batch(
        self, cutoff: datetime, after: datetime | None, limit: int
    ) -> tuple[int, datetime | None]:
        """Delete one batch of at most about ``limit`` records finished before ``cutoff`` (and
        after ``after``, the edge of the previous batch), oldest first; returns how many went
        and this batch's edge (None: nothing expired is left).

        Two short statements, each its own transaction: an index-only read of the batch's
        edge (the ``limit``-th expired ``finished_at`` past ``after``) on
        ``ekbatan_history_finished_idx``, then a range delete up to it on the same index. Both
        descend the index to ``after`` rather than walking from its start, so the entries of
        rows deleted by earlier batches (dead until vacuum or purge) are never read again. Rows
        finished at the very edge go in this batch (ties: it may hold a few more than
        ``limit``)."""
        h = self.tables.history
        finished = h.c.finished_at
        window = [finished < cutoff]
        if after is not None:
            window.append(finished > after)
        edge_query = select(finished).where(*window).order_by(finished).offset(limit - 1).limit(1)
        found = await self.db.rows(edge_query)
        if found:
            edge: datetime | None = known_time(found[0][0])
            upto = finished <= edge
        else:
            edge, upto = None, finished < cutoff
        bounds = [upto] if after is None else [finished > after, upto]
        deleted = await self.db.rowcount(delete(h).where(*bounds))
        return deleted, edge

    # -- rows no instance runs -------------------------------------------------------------

    async def overdue_unknown(
        self, known: Sequence[str], older_than: timedelta, *, limit: int = 10_000
    ) -> list[tuple[str, int, datetime]]:
        """``(task name, rows, oldest due time)`` of the task names outside ``known`` with
        unpicked rows overdue by more than ``older_than`` on the database clock: rows that no
        live instance claimed in that window. One grouped read (at most ``limit`` names)."""
        t = self.tables.tasks
        cutoff = (await self.db.clock())[0] - older_than
        stmt = (
            select(t.c.task_name, func.count(), func.min(t.c.execution_time))
            .where(t.c.picked.is_(False), t.c.execution_time < cutoff)
            .group_by(t.c.task_name)
            .order_by(t.c.task_name)
            .limit(limit)
        )
        names = set(known)
        return [
            (r[0], int(r[1]), known_time(r[2]))
            for r in await self.db.rows(stmt)
            if r[0] not in names
        ]

    # -- pause --------------------------------------------------------------------------

    async def pause(self, task_name: str, paused_by: str | None, reason: str | None) -> None:
        """Pause ``task_name`` now (or update who and why)."""
        update = {"paused_by": paused_by, "paused_at": self.db.now_expr(), "reason": reason}
        values = {"task_name": task_name, **update}
        await self.db.rowcount(self.db.upsert(self.tables.paused, values, update))

    async def restore_pause(self, pause: PauseInfo) -> bool:
        """Put a pause back as it was (who, when, why); False when the task was paused again
        meanwhile (that pause stands)."""
        values = {
            "task_name": pause.task_name,
            "paused_by": pause.paused_by,
            "paused_at": pause.paused_at,
            "reason": pause.reason,
        }
        try:
            await self.db.rowcount(insert(self.tables.paused).values(values))
        except IntegrityError:
            return False
        return True

    async def resume(self, task_name: str) -> bool:
        p = self.tables.paused
        return await self.db.rowcount(delete(p).where(p.c.task_name == task_name)) > 0

    async def paused(self) -> dict[str, PauseInfo]:
        rows = await self.db.rows(select(self.tables.paused))
        return {
            r.task_name: PauseInfo(r.task_name, r.paused_by, known_time(r.paused_at), r.reason)
            for r in rows
        }

    # -- instances ----------------------------------------------------------------------

    async def report_instance(
        self, name: str, host: str, pid: int, started_at: datetime, version: str
    ) -> None:
        """Create or refresh this instance's row (``last_seen`` = the database's now)."""
        now = self.db.now_expr()
        values = {
            "name": name,
            "host": host,
            "pid": pid,
            "started_at": started_at,
            "last_seen": now,
            "library_version": version,
        }
        update = {"host": host, "pid": pid, "last_seen": now, "library_version": version}
        await self.db.rowcount(self.db.upsert(self.tables.instances, values, update))

    async def remove_instance(self, name: str) -> None:
        i = self.tables.instances
        await self.db.rowcount(delete(i).where(i.c.name == name))

    async def instances(self, dead_after: timedelta) -> list[InstanceInfo]:
        """Every instance row; ``alive``: seen within ``dead_after`` by the database clock."""
        i = self.tables.instances
        rows = await self.db.rows(select(i).order_by(i.c.name))
        db_now = (await self.db.clock())[0]
        result = []
        for r in rows:
            last_seen = known_time(r.last_seen)
            result.append(
                InstanceInfo(
                    name=r.name,
                    host=r.host,
                    pid=r.pid,
                    started_at=known_time(r.started_at),
                    last_seen=last_seen,
                    library_version=r.library_version,
                    alive=db_now - last_seen <= dead_after,
                )
            )
        return result

    async def prune_instances(self, older_than: timedelta) -> int:
        cutoff = (await self.db.clock())[0] - older_than
        i = self.tables.instances
        return await self.db.rowcount(delete(i).where(i.c.last_seen < cutoff))
