"""How statements reach PostgreSQL: an ``AUTOCOMMIT`` engine (each statement one round trip,
no BEGIN/COMMIT), SQLSTATE ``42P01`` for a missing table, ``ON CONFLICT`` upserts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable

from ...domain.errors import ConfigurationError
from ..database import Database

__all__ = ["PostgresDatabase"]

UNDEFINED_TABLE = "42P01"


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of an asyncpg error, raised directly or wrapped by SQLAlchemy."""
    for candidate in (error, getattr(error, "orig", None)):
        code = getattr(candidate, "sqlstate", None)
        if isinstance(code, str):
            return code
    return None


class PostgresDatabase(Database):
    dialect_name = "postgresql"
    migrations_folder = "postgresql"

    def configure(self, engine: AsyncEngine) -> AsyncEngine:
        driver = getattr(getattr(engine, "dialect", None), "driver", "asyncpg")
        if driver != "asyncpg":
            raise ConfigurationError(
                f"the PostgreSQL dialect needs the asyncpg driver, got {driver!r}: use a "
                "postgresql+asyncpg:// URL (or an engine created from one)"
            )
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    def is_missing_table(self, error: BaseException) -> bool:
        return sqlstate(error) == UNDEFINED_TABLE

    def commit_guard(self, seconds: float) -> list[Executable]:
        """``idle_in_transaction_session_timeout`` for this transaction only (``SET LOCAL``)."""
        milliseconds = max(1, int(seconds * 1000))
        return [text(f"SET LOCAL idle_in_transaction_session_timeout = {milliseconds}")]

    def upsert_many(self, table: Table, rows: list[dict[str, Any]]) -> Executable:
        key = [c.name for c in table.primary_key.columns]
        stmt = postgresql.insert(table).values(rows)
        columns = [c for c in rows[0] if c not in key]
        return stmt.on_conflict_do_update(
            index_elements=key, set_={c: stmt.excluded[c] for c in columns}
        )

    def upsert(self, table: Table, values: dict[str, Any], update: dict[str, Any]) -> Executable:
        """Insert ``values``; on a key conflict set ``update`` instead."""
        key: Sequence[str] = [c.name for c in table.primary_key.columns]
        return (
            postgresql.insert(table)
            .values(values)
            .on_conflict_do_update(index_elements=key, set_=update)
        )
