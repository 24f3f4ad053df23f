"""How statements reach MySQL/MariaDB (asyncmy): explicit transactions, deadlock retries,
error 1146 for a missing table, ``ON DUPLICATE KEY UPDATE`` upserts, ``UTC_TIMESTAMP(6)``.

Transactions run on the engine as configured (no per-checkout ``AUTOCOMMIT`` switch: on MySQL
drivers that costs four extra round trips per statement), each at ``READ COMMITTED``: locks on
rows that do not match are released at once, no gap locks block inserts, and an ``UPDATE``
reads a row another transaction holds (a process stopped inside ``ctx.transaction()``, an
orphaned claim) semi-consistently instead of waiting for it.

Time: the columns are ``datetime(6)`` holding UTC, the database clock is ``UTC_TIMESTAMP(6)``,
and parameters are sent as naive UTC, so neither the session nor the server time zone matters.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import Table, TextClause, bindparam, literal_column, text
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql.base import MySQLIdentifierPreparer
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

from ...domain.logs import library_logger
from ..database import Database, Diagnosis, error_words, is_autocommit
from ..external import prepare_callers
from ..tables import UTCDateTime
from . import literals
from . import statements as q

__all__ = [
    "CONFLICT_RETRIES",
    "ER_DUP_ENTRY",
    "ER_LOCK_DEADLOCK",
    "ER_LOCK_WAIT_TIMEOUT",
    "MySQLDatabase",
    "after_conflict",
    "errno",
    "naive_utc",
]

log = library_logger(__name__)

T = TypeVar("T")

ER_DUP_ENTRY = 1062
ER_NO_SUCH_TABLE = 1146
ER_LOCK_DEADLOCK = 1213
ER_LOCK_WAIT_TIMEOUT = 1205
CONFLICT_RETRIES = 8
"""Attempts of a transaction that fails on a write conflict (error 1213)."""
_CONFLICT_PAUSE = 0.005
"""Seconds: before attempt n + 1, a random pause of up to n times this. Writers that conflicted
(on a multi-primary Galera cluster, claimers on different nodes that locked the same due rows
on their own node) try again at different moments instead of conflicting again."""
_READ_ONLY = (1290, 1792, 1836)
"""--read-only / super_read_only, a READ ONLY transaction, a read-only replica."""
_LOST = (2002, 2003, 2005, 2006, 2013, 2055)
"""Cannot connect, server gone away, lost connection."""


def errno(error: BaseException) -> int | None:
    """The server's error number of a driver error (wrapped by SQLAlchemy or not)."""
    for candidate in (getattr(error, "orig", None), error):
        args = getattr(candidate, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


async def after_conflict(db: Database, attempt: int) -> None:
    """A transaction failed on a write conflict (error 1213) and is run again: count it and
    pause a little. MySQL reports an InnoDB deadlock so; a Galera cluster reports so, at
    ``COMMIT``, a transaction that lost certification to a conflicting write committed on
    another node first (multi-primary)."""
    db.write_conflicts += 1
    log.debug(
        "write conflict on %s (error 1213, attempt %d of %d): run again",
        db.tables.tasks,
        attempt,
        CONFLICT_RETRIES,
    )
    await asyncio.sleep(random.uniform(0.0, _CONFLICT_PAUSE * attempt))


def naive_utc(value: datetime | None) -> datetime | None:
    """A parameter for a ``datetime(6)`` column: naive UTC (drivers drop an offset silently)."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


class MySQLDatabase(Database):
    dialect_name = "mysql"
    migrations_folder = "mysql"

    def configure(self, engine: AsyncEngine) -> AsyncEngine:
        # Every value as no SQL mode reads differently, on every connection (literals.py).
        literals.guard(engine)
        prepare_callers(engine, literals.protect_on)  # an application's own connection
        self._identifiers = MySQLIdentifierPreparer(cast(DefaultDialect, engine.dialect))
        self.read_committed: TextClause | None = text(q.READ_COMMITTED)
        """Sent first in each transaction (None: the engine's connections are set so)."""
        if is_autocommit(engine):
            # Each statement would commit alone and drop the row locks our claims rely on.
            self.read_committed = None
            return engine.execution_options(isolation_level="READ COMMITTED")
        return engine

    def quoted(self, table: Table) -> str:
        """A table's name in backticks where it needs quoting: an identifier in every SQL
        mode (the engine's own quoting turns to double quotes once it saw ``ANSI_QUOTES``,
        which a session without it reads as a string)."""
        return self._identifiers.format_table(table)

    def quoted_schema(self, schema: str) -> str:
        """A schema's name, quoted as ``quoted`` quotes tables."""
        return self._identifiers.quote_schema(schema)

    def sql(self, statement: str) -> TextClause:
        """``text()`` with the list parameters (``statements.EXPANDING``) expanding."""
        present = [name for name in q.EXPANDING if f":{name}" in statement]
        return text(statement).bindparams(*(bindparam(n, expanding=True) for n in present))

    def now_expr(self) -> ColumnElement[datetime]:
        """``UTC_TIMESTAMP(6)``: ``NOW()`` would follow the session time zone."""
        return literal_column(q.NOW, UTCDateTime())

    def due_by_expr(self, ahead: timedelta) -> ColumnElement[datetime]:
        """``UTC_TIMESTAMP(6) + INTERVAL n MICROSECOND``: a bound interval would be sent as a
        string, which MySQL adds as a number."""
        return literal_column(q.due_by(round(ahead.total_seconds() * 1000)), UTCDateTime())

    def is_missing_table(self, error: BaseException) -> bool:
        """One of our tables is missing (not a session's names table: ``names.py``)."""
        message = str(getattr(error, "orig", None) or error)  # not SQLAlchemy's SQL text
        return errno(error) == ER_NO_SUCH_TABLE and q.NAMES_TABLE_PREFIX not in message

    def commit_guard(self, seconds: float) -> list[Executable]:
        """``wait_timeout`` for this session: the server closes a connection that stays silent
        that long (with its transaction); restored after the commit."""
        return [text(f"SET SESSION wait_timeout = {max(1, int(seconds + 0.999))}")]

    def commit_guard_reset(self) -> list[Executable]:
        return [text("SET SESSION wait_timeout = DEFAULT")]

    def upsert_many(self, table: Table, columns: Sequence[str]) -> Executable:
        """asyncmy turns the executemany into multi-row ``INSERT``s (every value a bound
        parameter: an SQL expression among the values would make it send one row at a time)."""
        key = {c.name for c in table.primary_key.columns}
        stmt = mysql.insert(table)
        return stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in columns if c not in key})

    def diagnose_driver(self, error: BaseException) -> Diagnosis | None:
        code, words = errno(error), error_words(error)
        if code in _READ_ONLY:
            return Diagnosis(
                "read-only", True, f"the database is read-only (a replica, or fenced): {words}"
            )
        if code in _LOST:
            return Diagnosis("unreachable", False, f"database unreachable at {self.where}: {words}")
        if code == ER_LOCK_WAIT_TIMEOUT:
            return Diagnosis(
                "lock-wait",
                True,
                "a row lock was held past innodb_lock_wait_timeout (a slow or orphaned "
                f"transaction; see idle_transaction_timeout in docs/deployment.md): {words}",
            )
        if code == ER_LOCK_DEADLOCK:
            return Diagnosis(
                "error",
                True,
                "a write conflict (error 1213: a deadlock, or on a multi-primary Galera "
                "cluster a certification conflict at COMMIT), still there after "
                f"{CONFLICT_RETRIES} attempts; on Galera poll with polling_strategy 'fetch' "
                f"(the default there): {words}",
            )
        if code is not None and code < 2000:
            return Diagnosis("error", True, f"the database refused a statement: {words}")
        return None

    def must_discard(self, error: BaseException) -> bool:
        return errno(error) in _READ_ONLY

    def upsert(self, table: Table, values: dict[str, Any], update: dict[str, Any]) -> Executable:
        return mysql.insert(table).values(values).on_duplicate_key_update(update)

    async def transaction(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        *,
        read_committed: bool = True,
        attempts: int = CONFLICT_RETRIES,
    ) -> T:
        """Run ``work`` in one transaction and commit; a deadlock victim is run again (up to
        ``attempts`` in all; the last one's error is raised). Every transaction of ours runs
        at ``READ COMMITTED`` (see ``rowcount``, and the module's note on range scans)."""
        for attempt in range(1, attempts + 1):
            try:
                async with self.connect() as conn:
                    if read_committed and self.read_committed is not None:
                        await conn.execute(self.read_committed)
                    result = await work(conn)
                    await conn.commit()
                    return result
            except DBAPIError as error:
                if errno(error) != ER_LOCK_DEADLOCK or attempt >= attempts:
                    raise
            await after_conflict(self, attempt)  # a new connection for the next attempt
        raise AssertionError("unreachable")

    async def rowcount(self, stmt: Executable, params: Any = None) -> int:
        """A writing statement, committed explicitly (the engine is not AUTOCOMMIT), under
        ``READ COMMITTED``: an ``UPDATE`` then reads a row another transaction holds locked
        semi-consistently (its last committed version) instead of waiting for it, so a held
        row stalls only the statements that really write it."""

        async def run(conn: AsyncConnection) -> int:
            return int((await conn.execute(stmt, params)).rowcount)

        return await self.transaction(run)


class MariaDBDatabase(MySQLDatabase):
    """MariaDB: the MySQL migrations (the DDL is the same)."""

    dialect_name = "mariadb"


class MySQL5Database(MySQLDatabase):
    """MySQL before 8: the MySQL migrations (the DDL is the same)."""

    dialect_name = "mysql5"
