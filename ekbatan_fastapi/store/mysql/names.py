"""Many job names on MySQL/MariaDB: a session temporary table of names, filled once per
connection.

A poll, its clock and the dead-execution check ask for the rows of this instance's job names.
Up to ``NAMES_TABLE_MIN`` names they go in the statement's text (``IN (...)``, escaped once:
``tasks.Inlined``). Beyond it the server would parse and convert a list of that size at every
statement (1.5 MB of text and ~140 ms per statement with 100,000 names; docs/BENCHMARKS.md,
"Names"), so the names go once into a temporary table of the connection, and the statements
read ``task_name IN (SELECT task_name FROM <table>)``: about 1 ms at any count.

A temporary table lives as long as its session and is seen by no other: each pooled
connection fills its own at first use (0.9 s for 100,000 names, 14 ms for 1,000), and a new
connection (after an outage, a recycle) fills it again. ``conn.info`` (SQLAlchemy's state of
the pooled DBAPI connection, cleared when it is replaced) says which connections hold it.
The table's name is a digest of the scheduled-tasks table and the names, so two schedulers on
one engine with different jobs never read each other's. Not used on an engine without a pool
(``NullPool``: every checkout is a new connection, which would fill the table at every
statement).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import NullPool

from ...domain.logs import library_logger
from ..database import chunks
from . import statements as q
from .database import ER_NO_SUCH_TABLE, MySQLDatabase, errno

__all__ = ["NAMES_TABLE_MIN", "NamesTable", "NamesTables"]

T = TypeVar("T")
log = library_logger(__name__)

NAMES_TABLE_MIN = 500
"""From this many job names on, the names go in a temporary table (below it the list in the
text costs the server a few ms or less, and a new connection has nothing to fill)."""
_FILL_ROWS = 1000
"""Names per ``INSERT`` filling the table."""
_REFUSED = (1044, 1142, 1787)
"""Access denied to the database / to the table (no ``CREATE TEMPORARY TABLES`` privilege);
a ``CREATE TEMPORARY TABLE`` that GTID consistency forbids here (MySQL 5.7, or 8 with
statement-based binary logging, in a session with ``autocommit=0``)."""
_GENERATIONS: dict[str, int] = {}
"""Per names table: raised when a statement found it gone, so that every connection (of every
store with these names) fills it again."""


def driver_message(error: BaseException) -> str:
    """The server's own message (SQLAlchemy's text of an error also holds the SQL, which
    names the names table whatever the error is about)."""
    return str(getattr(error, "orig", None) or error)


class NamesTable:
    """One instance's job names in two temporary tables with the same rows, on each connection
    that runs its statements (``ensure``). Two, because MySQL cannot open one temporary table
    twice in a statement (``Can't reopen table``; MariaDB can), and the fetch strategy's
    candidates and the dead-execution check read the names twice: each statement reads
    ``ref`` once and ``twin`` once at most."""

    def __init__(
        self, db: MySQLDatabase, names: Sequence[str], refused: Callable[[], None]
    ) -> None:
        self.names = tuple(names)
        self._db = db
        self._refused = refused
        tasks = db.tables.tasks
        t = db.quoted(tasks)
        digest = hashlib.sha256("\x00".join([t, *sorted(set(self.names))]).encode())
        self.name = q.NAMES_TABLE_PREFIX + digest.hexdigest()[:20]
        # in the tasks table's schema when it names one (else the session's database)
        schema = db.quoted_schema(tasks.schema) + "." if tasks.schema else ""
        self.ref = schema + self.name
        self.twin = schema + self.name + "_b"
        self._create = q.create_names_table(self.ref, t)
        self._key = "ekbatan_names_table:" + self.ref

    @property
    def refs(self) -> tuple[str, str]:
        return self.ref, self.twin

    async def ensure(self, conn: AsyncConnection, driver: Any = None) -> None:
        """Create and fill the tables on ``conn`` unless it holds them already; committed
        before the caller's transaction begins (``driver``: its asyncmy connection)."""
        info = conn.info
        generation = _GENERATIONS.get(self.ref, 0)
        if info.get(self._key, -1) == generation:
            return
        if driver is None:
            driver = (await conn.get_raw_connection()).driver_connection
        stale = self._key in info  # an older generation, or a fill that failed half-way
        info[self._key] = None
        async with driver.cursor() as cursor:
            exists = {ref: stale and await self._emptied(cursor, ref) for ref in self.refs}
            if not exists[self.ref]:
                await self._create_one(cursor, self._create)
            if not exists[self.twin]:
                await self._create_one(cursor, q.copy_names_table(self.twin, self.ref))
            for part in chunks(list(self.names), _FILL_ROWS):
                values = cursor.mogrify(", ".join(["(%s)"] * len(part)), part)
                # no parameters: the text goes as it is (no ``%`` interpolation)
                await cursor.execute(q.fill_names(self.ref, values))
            await cursor.execute(q.fill_names_from(self.twin, self.ref))
        await driver.commit()
        info[self._key] = generation

    async def _emptied(self, cursor: Any, ref: str) -> bool:
        """Empty a table this session held; False when it is gone (no ``DROP ... IF EXISTS``:
        it warns when the table is gone)."""
        try:
            await cursor.execute(q.empty_names_table(ref))
            return True
        except Exception as error:
            if not self.is_gone(error):
                raise
            return False

    async def _create_one(self, cursor: Any, statement: str) -> None:
        try:
            await cursor.execute(statement)
        except Exception as error:
            if errno(error) in _REFUSED:
                self._refused_by(error)
            if self._db.is_missing_table(error):  # no scheduled_tasks: the schema's error
                raise self._db.missing_table(error) from error
            raise

    def _refused_by(self, error: BaseException) -> None:
        log.warning(
            "the database refused a temporary table for this instance's %d job names (%s): "
            "from now on every poll sends all the names in its text, which the server parses "
            "each time (until the instance restarts). Fix: GRANT CREATE TEMPORARY TABLES ON "
            "<database>.* TO <this user> (on error 1787, GTID consistency: run MySQL 8 with "
            "binlog_format=ROW)",
            len(self.names),
            error,
        )
        self._refused()

    def is_gone(self, error: BaseException) -> bool:
        """A statement found one of these tables missing (the session was reset under us)."""
        return errno(error) == ER_NO_SUCH_TABLE and self.name in driver_message(error)

    async def retried(self, run: Callable[[], Awaitable[T]]) -> T:
        """``run``, once more if it found the table gone (each connection fills it again)."""
        try:
            return await run()
        except Exception as error:
            if not self.is_gone(error):
                raise
            _GENERATIONS[self.ref] = _GENERATIONS.get(self.ref, 0) + 1
            return await run()


class NamesTables:
    """The names table of each list of names a store is asked for (in practice one: the
    registry's), or None where the names stay in the text."""

    def __init__(self, db: MySQLDatabase) -> None:
        self._db = db
        self._tables: dict[tuple[str, ...], NamesTable] = {}
        self._last: tuple[Sequence[str], NamesTable] | None = None
        self.enabled = not isinstance(db.engine.sync_engine.pool, NullPool)

    def get(self, names: Sequence[str]) -> NamesTable | None:
        if not self.enabled or len(names) < NAMES_TABLE_MIN:
            return None
        last = self._last
        if last is not None and last[0] is names and len(last[1].names) == len(names):
            return last[1]  # the registry's own list, as at every poll: no hash of it
        table = self._lookup(tuple(names))
        self._last = (names, table)
        return table

    def _lookup(self, key: tuple[str, ...]) -> NamesTable:
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= 8:  # lists of names that come and go: keep the last few
                self._tables.pop(next(iter(self._tables)))
            table = self._tables[key] = NamesTable(self._db, key, self._refused)
        return table

    def _refused(self) -> None:
        """No temporary tables for this user: the names go in the text from now on (the
        statement that was refused fails; the next poll runs the text form)."""
        self.enabled = False
