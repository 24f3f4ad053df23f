"""The poll's statements on MySQL/MariaDB, built on first use and kept: one set per pause
filter and lead (``claim_ahead``), and per number of names where a poll reads each name's
rows through our index (``statements.PER_NAME_MAX``)."""

from __future__ import annotations

from sqlalchemy import TextClause

from . import statements as q
from .database import MySQLDatabase

__all__ = ["PollStatements"]


class PollStatements:
    """The poll statements of one ``scheduled_tasks`` table (``t``) and pause table (``p``),
    both quoted."""

    def __init__(self, db: MySQLDatabase, t: str, p: str) -> None:
        self._db, self._t, self._p = db, t, p
        self._scan: dict[tuple[bool, int], tuple[TextClause, TextClause, TextClause]] = {}
        self._per_name: dict[tuple[bool, int, int], tuple[TextClause, TextClause]] = {}

    def scan(self, skip_paused: bool, ahead_ms: int) -> tuple[TextClause, TextClause, TextClause]:
        """(candidates, lock_due, clock) reading the due rows in time order."""
        key = (skip_paused, ahead_ms)
        found = self._scan.get(key)
        if found is None:
            p, due, sql = self._p if skip_paused else None, q.due_by(ahead_ms), self._db.sql
            found = (
                sql(q.candidates(self._t, p, due)),
                sql(q.lock_due(self._t, p, due)),
                sql(q.clock(self._t, p)),
            )
            self._scan[key] = found
        return found

    def per_name(
        self, skip_paused: bool, count: int, ahead_ms: int
    ) -> tuple[TextClause, TextClause]:
        """(candidates, lock_due) reading ``count`` names' rows through our index."""
        key = (skip_paused, count, ahead_ms)
        found = self._per_name.get(key)
        if found is None:
            p, due, sql = self._p if skip_paused else None, q.due_by(ahead_ms), self._db.sql
            found = (
                sql(q.candidates_per_name(self._t, p, count, due)),
                sql(q.lock_due_per_name(self._t, p, count, due)),
            )
            self._per_name[key] = found
        return found
