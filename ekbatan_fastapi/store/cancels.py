"""``CancelStore``: requests to stop a running execution (``ekbatan_cancel_requests``, migration
V0006). A request names the claim it stops (the row's ``version`` when it was asked), who asked
and why; the instance that runs that claim reads the requests of what it runs once per
heartbeat round (only while it runs something), cancels the execution and deletes the request.
A request whose claim has ended meanwhile matches nothing and is deleted by the owner's next
read of that task instance, or replaced by the next request for it."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, tuple_

from ..domain.rows import TaskKey
from ..domain.text import storable
from .database import Database, known_time
from .presence import TablesPresence

__all__ = ["CancelRequest", "CancelStore"]

_RECHECK_MISSING = 60.0
"""Seconds between looks for the table while it is missing (migration V0006 not applied)."""


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A request to stop the execution of ``task_name/task_instance`` claimed at ``version``."""

    task_name: str
    task_instance: str
    version: int
    requested_by: str | None
    requested_at: datetime
    reason: str | None

    @property
    def key(self) -> TaskKey:
        return (self.task_name, self.task_instance)

    def describe(self) -> str:
        """``cancelled by <who>: <why>`` as the history and the logs say it."""
        by = self.requested_by or "an operator"
        return f"cancelled by {by}" + (f": {self.reason}" if self.reason else "")


class CancelStore:
    """Reads and writes ``ekbatan_cancel_requests`` beside the jobs table."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.tables.cancels
        self.presence = TablesPresence(db, [self.table], _RECHECK_MISSING)

    async def look(self, *, force: bool = False) -> bool:
        """Whether the table exists (once found, taken to exist; while missing, looked for
        again at most every minute)."""
        return await self.presence.look(force=force)

    async def request(
        self,
        task_name: str,
        task_instance: str,
        version: int,
        requested_by: str | None,
        reason: str | None,
    ) -> None:
        """Ask the owner of claim ``version`` to stop it (replaces an older request)."""
        t = self.table
        values = {
            "task_name": task_name,
            "task_instance": task_instance,
            "version": version,
            "requested_by": storable(requested_by, 200) if requested_by else None,
            "requested_at": self.db.now_expr(),
            "reason": storable(reason, 1000) if reason else None,
        }
        update = {k: v for k, v in values.items() if k not in ("task_name", "task_instance")}
        await self.db.rowcount(self.db.upsert(t, values, update))

    async def pending(self, names: Collection[str]) -> list[CancelRequest]:
        """The requests for tasks of ``names`` (one read of a table that is empty but for
        the moments someone asked)."""
        if not names:
            return []
        t = self.table
        rows = await self.db.rows(select(t).where(t.c.task_name.in_(sorted(names))))
        return [
            CancelRequest(
                r.task_name,
                r.task_instance,
                int(r.version),
                r.requested_by,
                known_time(r.requested_at),
                r.reason,
            )
            for r in rows
        ]

    async def remove(self, keys: Collection[TaskKey]) -> None:
        """Delete the requests of ``keys`` (acted on, or stale)."""
        if not keys:
            return
        t = self.table
        wanted = tuple_(t.c.task_name, t.c.task_instance).in_(sorted(keys))
        await self.db.rowcount(delete(t).where(wanted))
