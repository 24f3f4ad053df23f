"""MySQL before 8 (and MariaDB before 10.6): the MySQL task store without ``SKIP LOCKED``.

A module of its own by concept, not size: it is a dialect of its own (``mysql5``, registered
apart and reached only through ``b.dialect("mysql5")``), whose one difference is how it waits
for rows another transaction holds (bounded lock waits, a batch retried row by row). Its
statements are in ``statements.py`` with the others; when MySQL 5.7 support ends, this module
and its registration are what goes."""

from __future__ import annotations

from sqlalchemy import TextClause
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ...domain.rows import TaskRow
from . import statements as q
from .database import ER_LOCK_WAIT_TIMEOUT, errno
from .tasks import MySQLTaskStore

__all__ = ["MySQL5TaskStore"]


class MySQL5TaskStore(MySQLTaskStore):
    """MySQL before 8 (and MariaDB before 10.6): no ``SKIP LOCKED``, so the optimistic
    ``fetch`` strategy only. Reachable only through ``b.dialect("mysql5")``."""

    supports_skip_locked = False

    async def _revive_candidates(
        self, candidates: list[tuple[str, str, int]], dead_us: int
    ) -> list[TaskRow]:
        """Without ``SKIP LOCKED`` a row another transaction holds (a stopped process between
        its ``ctx.transaction()`` completion and its commit) would hold up the whole check
        for ``innodb_lock_wait_timeout`` (50 s by default), so the lock waits are bounded and
        a batch that times out is retried row by row, leaving the held rows for later."""
        try:
            return await self._bounded(candidates, dead_us)
        except DBAPIError as error:
            if errno(error) != ER_LOCK_WAIT_TIMEOUT:
                raise
        revived: list[TaskRow] = []
        for candidate in candidates:
            try:
                revived += await self._bounded([candidate], dead_us)
            except DBAPIError as error:
                if errno(error) != ER_LOCK_WAIT_TIMEOUT:
                    raise
        return revived

    async def _bounded(self, candidates: list[tuple[str, str, int]], dead_us: int) -> list[TaskRow]:
        async def run(conn: AsyncConnection) -> list[TaskRow]:
            await conn.execute(self._short_lock_wait)
            try:
                rows = await self._lock_and_release(conn, candidates, dead_us)
            except DBAPIError:
                # A lock wait that timed out undoes only its statement: the session goes back
                # to the pool, with its own bound again (or not at all).
                try:
                    await conn.execute(self._restore_lock_wait)
                except Exception:
                    await conn.invalidate()
                raise
            # (a cancellation leaves the bound alone: its connection is discarded)
            await conn.execute(self._restore_lock_wait)
            return rows

        return await self.db.transaction(run, read_committed=True)

    @property
    def _short_lock_wait(self) -> TextClause:
        return self.db.sql(q.SHORT_LOCK_WAIT)

    @property
    def _restore_lock_wait(self) -> TextClause:
        return self.db.sql(q.RESTORE_LOCK_WAIT)
