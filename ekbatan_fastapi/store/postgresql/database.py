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
from ..database import Database, Diagnosis, error_words

__all__ = ["POOLER_HINT", "PostgresDatabase"]

UNDEFINED_TABLE = "42P01"
READ_ONLY_TRANSACTION = "25006"
_PREPARED_STATEMENT_CODES = ("42P05", "26000")
"""duplicate_prepared_statement, invalid_sql_statement_name: a statement name that another
client's transaction created (or dropped) on a shared server connection."""
_LOST_CONNECTION_CLASSES = ("08", "57")
"""connection_exception; operator_intervention (shutdown, crash, not accepting yet)."""

POOLER_HINT = (
    "this is what a transaction-pooling PgBouncer answers to a client that keeps prepared "
    "statements across transactions: set EKBATAN_JOBS__POOLER=pgbouncer-transaction "
    "(customize_scheduler(lambda b: b.pooler('pgbouncer-transaction')), or "
    "ekbatan-jobs --pooler pgbouncer-transaction)"
)
READ_ONLY_HINT = (
    "the database is read-only (SQLSTATE 25006): a standby, or a primary fenced during a "
    "failover; connections are replaced (with a multi-host URL and "
    "target_session_attrs=read-write they go to the writable host)"
)


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

    def upsert_many(self, table: Table, columns: Sequence[str]) -> Executable:
        """asyncpg sends the executemany as one prepared statement, pipelined."""
        key = [c.name for c in table.primary_key.columns]
        stmt = postgresql.insert(table)
        return stmt.on_conflict_do_update(
            index_elements=key, set_={c: stmt.excluded[c] for c in columns if c not in key}
        )

    def diagnose_driver(self, error: BaseException) -> Diagnosis | None:
        code = sqlstate(error)
        words = error_words(error)
        if code in _PREPARED_STATEMENT_CODES or "bind message supplies" in words:
            return Diagnosis("pooler", True, f"{POOLER_HINT}; the database said {words}")
        if code == READ_ONLY_TRANSACTION:
            return Diagnosis("read-only", True, f"{READ_ONLY_HINT}; {words}")
        if code is not None and code[:2] in _LOST_CONNECTION_CLASSES:
            return Diagnosis("unreachable", False, f"database unreachable at {self.where}: {words}")
        if code is not None:
            return Diagnosis("error", True, f"the database refused a statement: {words}")
        inner = getattr(error, "orig", None) or error
        if type(inner).__module__.startswith("asyncpg") and "Interface" in type(inner).__name__:
            return Diagnosis("unreachable", False, f"database unreachable at {self.where}: {words}")
        return None

    def must_discard(self, error: BaseException) -> bool:
        """A connection to a read-only server: another host of the URL may be writable now."""
        return sqlstate(error) == READ_ONLY_TRANSACTION

    def upsert(self, table: Table, values: dict[str, Any], update: dict[str, Any]) -> Executable:
        """Insert ``values``; on a key conflict set ``update`` instead."""
        key: Sequence[str] = [c.name for c in table.primary_key.columns]
        return (
            postgresql.insert(table)
            .values(values)
            .on_conflict_do_update(index_elements=key, set_=update)
        )
