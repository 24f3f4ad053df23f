"""``TraceStore``: the trace context a one-time task was scheduled in (``ekbatan_trace_context``,
migration V0005), so that its executions can link to the trace that scheduled it
(``ekbatan_fastapi.otel``). db-scheduler's table and its ``task_data`` are never touched.

A row is written in the transaction that schedules the task, read when an execution of it
starts, deleted once the task is done, and pruned (hourly, by the housekeeper) where its task
row is gone (cancelled, given up, or run by an instance without tracing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, exists, select, tuple_

from .database import Database, chunks
from .external import Caller
from .presence import TablesPresence

__all__ = ["TraceContext", "TraceStore"]

_RECHECK_MISSING = 3600.0
"""Seconds between looks for the table while it is missing (migration V0005 not applied)."""
_TRACESTATE_LIMIT = 512
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context (``traceparent``, optional ``tracestate``) of one task instance."""

    task_name: str
    task_instance: str
    traceparent: str
    tracestate: str | None = None


class TraceStore:
    """Reads and writes ``ekbatan_trace_context`` beside the jobs table."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.tables.traces
        self.presence = TablesPresence(db, [self.table], _RECHECK_MISSING)

    async def look(self) -> bool:
        """Whether the table exists; once found it is taken to exist, while missing the
        catalog is read again at most hourly (nothing is traced into a missing table)."""
        return await self.presence.look()

    async def save_on(self, caller: Caller, contexts: Sequence[TraceContext]) -> None:
        """Write (or replace) the contexts inside the caller's transaction: they commit or
        roll back with the task rows written there. The task rows were written first in that
        transaction, so their locks keep two schedules of one instance apart."""
        if not contexts:
            return
        t = self.table
        keys = [(c.task_name, c.task_instance) for c in contexts]
        for chunk in chunks(keys, _CHUNK):
            await caller.execute(
                delete(t).where(tuple_(t.c.task_name, t.c.task_instance).in_(chunk))
            )
        rows = [
            {
                "task_name": c.task_name,
                "task_instance": c.task_instance,
                "traceparent": c.traceparent,
                "tracestate": c.tracestate
                if c.tracestate and len(c.tracestate) <= _TRACESTATE_LIMIT
                else None,
            }
            for c in contexts
        ]
        await caller.execute(t.insert().values(created_at=self.db.now_expr()), rows)

    async def load(self, task_name: str, task_instance: str) -> TraceContext | None:
        """The context ``task_name/task_instance`` was scheduled in (None: none stored)."""
        t = self.table
        rows = await self.db.rows(
            select(t.c.traceparent, t.c.tracestate).where(
                t.c.task_name == task_name, t.c.task_instance == task_instance
            )
        )
        if not rows:
            return None
        return TraceContext(task_name, task_instance, rows[0][0], rows[0][1])

    async def delete(self, task_name: str, task_instance: str) -> None:
        """Forget the context of a task instance that is done."""
        t = self.table
        await self.db.rowcount(
            delete(t).where(t.c.task_name == task_name, t.c.task_instance == task_instance)
        )

    async def prune(self) -> int:
        """Delete the contexts whose task row is gone; how many (0 without the table)."""
        if not await self.look():
            return 0
        t, tasks = self.table, self.db.tables.tasks
        orphaned = ~exists().where(
            tasks.c.task_name == t.c.task_name, tasks.c.task_instance == t.c.task_instance
        )
        return await self.db.rowcount(delete(t).where(orphaned))
