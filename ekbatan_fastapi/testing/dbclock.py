"""The database's ``now()`` under a ``TimeMachine``: the time it was told, for every statement
of the store, the engine and the client, unchanged.

* **PostgreSQL**: the statements call ``now()`` unqualified. A function ``now()`` in the schema
  ``ekbatan_testing_clock`` returns the time held in that schema's one-row table, and every
  connection of the time machine's pool puts that schema on its ``search_path`` ahead of
  ``pg_catalog`` (after the schemas it already had: tables are still created and found where
  they were). Other connections to the database keep the real clock.
* **MySQL/MariaDB**: the statements use ``UTC_TIMESTAMP(6)``, which follows the session's
  ``timestamp`` variable; before a statement on a connection that has not seen the current
  time yet, ``SET timestamp = ...`` is sent on it.
"""

from __future__ import annotations

import abc
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ..domain.errors import ConfigurationError

__all__ = ["CLOCK_SCHEMA", "DatabaseClock", "database_clock"]

CLOCK_SCHEMA = "ekbatan_testing_clock"


class DatabaseClock(abc.ABC):
    """Makes one engine's database time the time machine's."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @abc.abstractmethod
    def attach(self) -> None:
        """Hook the engine's connections (before the first one is made)."""

    @abc.abstractmethod
    async def install(self, when: datetime) -> None:
        """Create what the clock needs in the database, at ``when``."""

    @abc.abstractmethod
    async def set(self, when: datetime) -> None:
        """Every statement from now on sees ``when`` as the database's now."""

    @abc.abstractmethod
    async def remove(self) -> None:
        """Leave the database as it was (the engine is disposed afterwards)."""


class PostgresClock(DatabaseClock):
    def attach(self) -> None:
        path = f"current_setting('search_path') || ', {CLOCK_SCHEMA}, pg_catalog'"

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.run_async(
                lambda conn: conn.execute(f"SELECT set_config('search_path', {path}, false)")
            )

        event.listen(self.engine.sync_engine, "connect", on_connect)

    async def install(self, when: datetime) -> None:
        s = CLOCK_SCHEMA
        async with self.engine.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {s}"))
            await conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {s}.frozen (id int PRIMARY KEY CHECK (id = 1), "
                    "at timestamptz NOT NULL)"
                )
            )
            await conn.execute(
                text(
                    f"INSERT INTO {s}.frozen VALUES (1, :at) "
                    "ON CONFLICT (id) DO UPDATE SET at = EXCLUDED.at"
                ),
                {"at": when},
            )
            await conn.execute(
                text(
                    f"CREATE OR REPLACE FUNCTION {s}.now() RETURNS timestamptz LANGUAGE sql "
                    f"STABLE AS $$ SELECT at FROM {s}.frozen WHERE id = 1 $$"
                )
            )
        async with self.engine.connect() as conn:
            seen = (await conn.execute(text("SELECT now()"))).scalar_one()
            path = (await conn.execute(text("SHOW search_path"))).scalar_one()
        if seen != when:
            raise ConfigurationError(
                f"the time machine's now() did not take over on this database (search_path "
                f"{path!r} names pg_catalog before {CLOCK_SCHEMA}): give the test database "
                "the default search_path"
            )

    async def set(self, when: datetime) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(f"UPDATE {CLOCK_SCHEMA}.frozen SET at = :at WHERE id = 1"), {"at": when}
            )

    async def remove(self) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA IF EXISTS {CLOCK_SCHEMA} CASCADE"))


_SEEN = "ekbatan_testing_clock"
"""Key in a connection's ``info``: the generation of the time it was told."""


class MySQLClock(DatabaseClock):
    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.generation = 0
        self.value = "DEFAULT"

    def attach(self) -> None:
        def before(conn: Any, cursor: Any, *_: Any) -> None:
            if conn.info.get(_SEEN) != self.generation:
                cursor.execute(f"SET timestamp = {self.value}")
                conn.info[_SEEN] = self.generation

        event.listen(self.engine.sync_engine, "before_cursor_execute", before)

    async def install(self, when: datetime) -> None:
        await self.set(when)

    async def remove(self) -> None:
        """Connections told a time are the machine's own (disposed with its pool)."""
        self.value = "DEFAULT"
        self.generation += 1

    async def set(self, when: datetime) -> None:
        delta = when.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
        seconds = delta.days * 86400 + delta.seconds
        self.value = f"{seconds}.{delta.microseconds:06d}"  # exact, unlike a float
        self.generation += 1


def database_clock(dialect: str, engine: AsyncEngine) -> DatabaseClock:
    """The clock for a store dialect (``postgresql``, ``mysql``, ``mariadb``, ``mysql5``)."""
    if dialect == "postgresql":
        return PostgresClock(engine)
    if dialect in ("mysql", "mariadb", "mysql5"):
        return MySQLClock(engine)
    raise ConfigurationError(
        f"the time machine sets the clock of PostgreSQL and MySQL/MariaDB, not of {dialect!r}"
    )
