"""Whether tables of ours that come with a later migration exist yet.

The history (V0002), the job definitions (V0003) and the trace contexts (V0005) may be missing
from a database migrated by an older release: their features then stay off instead of
failing every statement, and the catalog is read again now and then to see whether the
migration has come.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, inspect

from .database import Database

__all__ = ["TablesPresence"]


class TablesPresence:
    """Found once, the tables are taken to exist until ``forget`` (a statement found one
    gone); while missing, the catalog is read again at most every ``recheck`` seconds."""

    def __init__(self, db: Database, tables: Sequence[Table], recheck: float) -> None:
        self.db = db
        self.tables = list(tables)
        self.recheck = recheck
        self.present = False
        """The tables were found (as of the last look)."""
        self._checked_at = -recheck
        # Lookers while a look is in flight wait for its answer: without it they saw the
        # window just opened and answered "missing" for tables that exist (a fresh
        # scheduler's history off, client.history() raising SchemaMissingError).
        self._looking = asyncio.Lock()

    async def look(self, *, force: bool = False) -> bool:
        """True when every table exists (``force``: read the catalog now)."""
        if self.present:
            return True
        async with self._looking:
            if self.present:
                return True
            now = time.monotonic()
            if not force and now - self._checked_at < self.recheck:
                return False
            self._checked_at = now
            tables = self.tables

            def check(sync_conn: Any) -> bool:
                inspector = inspect(sync_conn)
                return all(inspector.has_table(t.name, schema=t.schema) for t in tables)

            async with self.db.connect() as conn:
                self.present = bool(await conn.run_sync(check))
            return self.present

    def forget(self) -> None:
        """A statement found a table gone: look again, not before ``recheck`` seconds."""
        self.present = False
        self._checked_at = time.monotonic()
