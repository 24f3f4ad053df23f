"""SQL for the operations tables: history, pauses, live instances (portable SQLAlchemy Core)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, delete, insert, inspect, select
from sqlalchemy.dialects import mysql, postgresql

from ..repository.model import HistoryEntry
from .models import ExecutionRecord, InstanceInfo, PauseInfo
from .tables import OperationsTables

if TYPE_CHECKING:
    from ..repository.base import TaskRepository

__all__ = ["OperationsRepository"]


class OperationsRepository:
    """Reads and writes our own tables through the task repository's engine and clock."""

    def __init__(self, tasks: TaskRepository) -> None:
        self.tasks = tasks
        self.tables = OperationsTables(MetaData(), tasks.table.schema)
        self._postgres = tasks.dialect_name == "postgresql"

    async def exists(self) -> bool:
        """True when all three tables exist (they come with migration V0002)."""
        names = [t.name for t in self.tables.all]
        schema = self.tables.history.schema

        def check(sync_conn: Any) -> bool:
            inspector = inspect(sync_conn)
            return all(inspector.has_table(name, schema=schema) for name in names)

        async with self.tasks._connect() as conn:
            return bool(await conn.run_sync(check))

    def _upsert(self, table: Any, values: dict[str, Any], update: dict[str, Any]) -> Any:
        if self._postgres:
            stmt = postgresql.insert(table).values(values)
            key = [c.name for c in table.primary_key.columns]
            return stmt.on_conflict_do_update(index_elements=key, set_=update)
        return mysql.insert(table).values(values).on_duplicate_key_update(update)

    # -- history ------------------------------------------------------------------------

    async def insert_history(self, records: Sequence[HistoryEntry], picked_by: str) -> None:
        """Insert many records in one executemany (where ``TaskRepository.
        writes_history_with_finish`` is False; elsewhere the completion writes them)."""
        if not records:
            return
        rows = [
            {
                "task_name": r.task_name,
                "task_instance": r.task_instance,
                "execution_time": r.execution_time,
                "picked_by": picked_by,
                "started_at": r.started_at,
                "finished_at": r.finished_at,
                "outcome": r.outcome,
                "error_class": r.error_class,
                "error_message": r.error_message,
            }
            for r in records
        ]
        await self.tasks._rowcount(insert(self.tables.history), rows)

    async def history(
        self, task_name: str | None, *, limit: int = 50, before_id: int | None = None
    ) -> list[ExecutionRecord]:
        """Newest first; page with ``before_id`` (the last id of the previous page)."""
        h = self.tables.history
        stmt = select(h).order_by(h.c.id.desc()).limit(limit)
        if task_name is not None:
            stmt = stmt.where(h.c.task_name == task_name)
        if before_id is not None:
            stmt = stmt.where(h.c.id < before_id)
        aware = self.tasks.aware
        return [
            ExecutionRecord(
                id=r.id,
                task_name=r.task_name,
                task_instance=r.task_instance,
                execution_time=aware(r.execution_time),  # type: ignore[arg-type]
                picked_by=r.picked_by,
                started_at=aware(r.started_at),  # type: ignore[arg-type]
                finished_at=aware(r.finished_at),  # type: ignore[arg-type]
                outcome=r.outcome,
                error_class=r.error_class,
                error_message=r.error_message,
            )
            for r in await self.tasks._rows(stmt)
        ]

    async def prune_history(self, older_than: timedelta) -> int:
        cutoff = (await self.tasks.db_now()) - older_than
        h = self.tables.history
        return await self.tasks._rowcount(delete(h).where(h.c.finished_at < cutoff))

    # -- pause --------------------------------------------------------------------------

    async def pause(self, task_name: str, paused_by: str | None, reason: str | None) -> None:
        now = self.tasks.now_expr()
        update = {"paused_by": paused_by, "paused_at": now, "reason": reason}
        values = {"task_name": task_name, **update}
        await self.tasks._rowcount(self._upsert(self.tables.paused, values, update))

    async def resume(self, task_name: str) -> bool:
        p = self.tables.paused
        return await self.tasks._rowcount(delete(p).where(p.c.task_name == task_name)) > 0

    async def paused(self) -> dict[str, PauseInfo]:
        rows = await self.tasks._rows(select(self.tables.paused))
        return {
            r.task_name: PauseInfo(
                r.task_name,
                r.paused_by,
                self.tasks.aware(r.paused_at),  # type: ignore[arg-type]
                r.reason,
            )
            for r in rows
        }

    # -- instances ----------------------------------------------------------------------

    async def report_instance(
        self, name: str, host: str, pid: int, started_at: datetime, version: str
    ) -> None:
        """Create or refresh this instance's row (``last_seen`` = the database's now)."""
        now = self.tasks.now_expr()
        values = {
            "name": name,
            "host": host,
            "pid": pid,
            "started_at": started_at,
            "last_seen": now,
            "library_version": version,
        }
        update = {"host": host, "pid": pid, "last_seen": now, "library_version": version}
        await self.tasks._rowcount(self._upsert(self.tables.instances, values, update))

    async def remove_instance(self, name: str) -> None:
        i = self.tables.instances
        await self.tasks._rowcount(delete(i).where(i.c.name == name))

    async def instances(self, dead_after: timedelta) -> list[InstanceInfo]:
        i = self.tables.instances
        db_now = await self.tasks.db_now()
        rows = await self.tasks._rows(select(i).order_by(i.c.name))
        result = []
        for r in rows:
            last_seen = self.tasks.aware(r.last_seen)
            assert last_seen is not None
            result.append(
                InstanceInfo(
                    name=r.name,
                    host=r.host,
                    pid=r.pid,
                    started_at=self.tasks.aware(r.started_at),  # type: ignore[arg-type]
                    last_seen=last_seen,
                    library_version=r.library_version,
                    alive=db_now - last_seen <= dead_after,
                )
            )
        return result

    async def prune_instances(self, older_than: timedelta) -> int:
        cutoff = (await self.tasks.db_now()) - older_than
        i = self.tables.instances
        return await self.tasks._rowcount(delete(i).where(i.c.last_seen < cutoff))
