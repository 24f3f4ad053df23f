"""The poll's statements on MySQL/MariaDB, built on first use and kept: one set per pause
filter and lead (``claim_ahead``), per number of names where a poll reads each name's rows
through our index (``statements.PER_NAME_MAX``), and per names table where the names are read
from one (``names.py``)."""

from __future__ import annotations

import functools

from sqlalchemy import TextClause

from . import statements as q
from .database import MySQLDatabase

__all__ = ["PollStatements"]


class PollStatements:
    """The poll statements of one ``scheduled_tasks`` table (``t``) and pause table (``p``),
    both quoted; each built once per instance and arguments (``functools.cache``)."""

    def __init__(self, db: MySQLDatabase, t: str, p: str) -> None:
        self._db, self._t, self._p = db, t, p
        self.scan = functools.cache(self._scan)
        self.per_name = functools.cache(self._per_name)
        self.by_table = functools.cache(self._by_table)
        self.dead_by_table = functools.cache(self._dead_by_table)

    def _scan(self, skip_paused: bool, ahead_ms: int) -> tuple[TextClause, TextClause, TextClause]:
        """(candidates, lock_due, clock) reading the due rows in time order."""
        p, due, sql = self._p if skip_paused else None, q.due_by(ahead_ms), self._db.sql
        return (
            sql(q.candidates(self._t, p, due)),
            sql(q.lock_due(self._t, p, due)),
            sql(q.clock(self._t, p)),
        )

    def _per_name(
        self, skip_paused: bool, count: int, ahead_ms: int
    ) -> tuple[TextClause, TextClause]:
        """(candidates, lock_due) reading ``count`` names' rows through our index."""
        p, due, sql = self._p if skip_paused else None, q.due_by(ahead_ms), self._db.sql
        return (
            sql(q.candidates_per_name(self._t, p, count, due)),
            sql(q.lock_due_per_name(self._t, p, count, due)),
        )

    def _by_table(
        self, skip_paused: bool, ahead_ms: int, k: str, k2: str
    ) -> tuple[TextClause, TextClause, TextClause]:
        """As ``scan``, the names read from the temporary table ``k`` (and its twin ``k2``:
        each statement opens each table once, as MySQL requires)."""
        p, due, sql = self._p if skip_paused else None, q.due_by(ahead_ms), self._db.sql
        return (
            sql(q.candidates(self._t, p, due, k, k2)),
            sql(q.lock_due(self._t, p, due, k)),
            sql(q.clock(self._t, p, k)),
        )

    def _dead_by_table(self, k: str, k2: str) -> TextClause:
        """The dead-execution check's candidates, the names read from ``k`` and ``k2``."""
        return self._db.sql(q.dead_candidates(self._t, k, k2))
