"""One jobs database: its engine, the bound on every statement, and the translation of its
errors (a missing table becomes ``SchemaMissingError``, in one place for every statement).

A dialect subclasses ``Database`` for what differs in how statements are sent: how the driver
says "no such table", the clock expression, and whether a write commits by itself
(PostgreSQL, on an ``AUTOCOMMIT`` engine) or in an explicit transaction (MySQL/MariaDB).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Table, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

from ..domain.errors import DatabaseTimeout, DatabaseUnavailable, SchemaMissingError
from .external import describe_url
from .lease import Lease, discard_connection, distrust_pool
from .tables import Tables, quote_table

__all__ = [
    "DEFAULT_STATEMENT_TIMEOUT",
    "Database",
    "Diagnosis",
    "aware",
    "error_words",
    "is_autocommit",
]

DEFAULT_STATEMENT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Diagnosis:
    """What a database error means, in the words ``status()`` and ``/jobs`` show."""

    condition: str
    """``unreachable`` (no connection), ``timeout`` (no answer in time), ``read-only`` (a
    standby or a fenced primary answered), ``pooler`` (a transaction-pooling PgBouncer refused
    a prepared statement), ``schema-missing``, ``lock-wait``, or ``error`` (the database
    refused the statement for another reason)."""
    reachable: bool
    """The database answered (the error is its answer), or not."""
    message: str
    """The meaning and the fix first, then the driver's words."""


def error_words(error: BaseException) -> str:
    inner = getattr(error, "orig", None) or error
    return (
        f"{type(inner).__name__}: {str(inner).strip()}"
        if str(inner).strip()
        else (type(inner).__name__)
    )


T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most ``size``: the rows, keys or names one statement takes."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def aware(value: datetime | None) -> datetime | None:
    """Timestamps come back aware from PostgreSQL; naive ones are UTC by our contract."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def known_time(value: datetime | None) -> datetime:
    """``aware`` of a value the statement always returns (a clock, a claimed row's time)."""
    result = aware(value)
    assert result is not None
    return result


def is_autocommit(engine: AsyncEngine) -> bool:
    """The engine's connections commit every statement by themselves."""
    configured = engine.get_execution_options().get("isolation_level")
    on_connect = getattr(engine.dialect, "_on_connect_isolation_level", None)
    return "AUTOCOMMIT" in (configured, on_connect)


class Database(abc.ABC):
    """The engine, ``statement_timeout`` and error translation shared by the task and the
    operations statements of one dialect."""

    dialect_name: str = "generic"
    migrations_folder: str = "generic"
    """The folder of ``migrations/`` this dialect's DDL lives in."""

    def __init__(
        self,
        engine: AsyncEngine,
        tables: Tables,
        *,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
    ) -> None:
        self.tables = tables
        self.engine = self.configure(engine)
        """The engine single statements run on."""
        self.tx_engine = (
            engine.execution_options(isolation_level="READ COMMITTED")
            if is_autocommit(engine)
            else engine
        )
        """For the statements that need a transaction of their own (real BEGIN ... COMMIT,
        also when the application handed over an ``AUTOCOMMIT`` engine)."""
        self.where = describe_url(engine.url)
        """``backend://host:port/database``: named in connection errors (never a password)."""
        self.statement_timeout = statement_timeout
        """Seconds a statement (with its connection checkout) may take; None: unbounded. A
        connection that died without a reset (a partition, a failover that moved the address)
        never answers: without this bound the loop waiting on it would wait forever. On
        timeout the connection is discarded and ``DatabaseTimeout`` raised; the loop retries
        on a new one."""

    def configure(self, engine: AsyncEngine) -> AsyncEngine:
        """The engine single statements run on (PostgreSQL: ``AUTOCOMMIT``)."""
        return engine

    # -- identifiers and values -------------------------------------------------------------

    def quoted(self, table: Table) -> str:
        """A table's name as this dialect writes it in SQL text."""
        return quote_table(table, self.engine.dialect)

    def now_expr(self) -> ColumnElement[datetime]:
        """The database's current time in UTC, as SQL."""
        return func.now()

    def due_by_expr(self, ahead: timedelta) -> ColumnElement[datetime]:
        """The time up to which a poll claims rows: now, plus ``ahead`` (``claim_ahead``)."""
        now = self.now_expr()
        return now + ahead if ahead else now

    @abc.abstractmethod
    def upsert(self, table: Table, values: dict[str, Any], update: dict[str, Any]) -> Executable:
        """Insert ``values`` into ``table``; on a primary-key conflict set ``update`` instead."""

    @abc.abstractmethod
    def upsert_many(self, table: Table, columns: Sequence[str]) -> Executable:
        """An upsert of ``table`` to send as an executemany, one parameter set per row of
        ``columns``: a row whose primary key exists replaces the other columns of the existing
        one. Compiled once, whatever the number of rows (the driver's bulk path sends them)."""

    @abc.abstractmethod
    def commit_guard(self, seconds: float) -> list[Executable]:
        """Statements that make the server end the current transaction if its client goes
        silent for ``seconds`` before committing (a process stopped while it holds a row
        lock), so the lock cannot outlive the dead window."""

    def commit_guard_reset(self) -> list[Executable]:
        """Statements that undo ``commit_guard`` after the commit (where it outlives the
        transaction)."""
        return []

    # -- errors -----------------------------------------------------------------------------

    @abc.abstractmethod
    def is_missing_table(self, error: BaseException) -> bool:
        """True when the driver's error says a table does not exist."""

    def missing_table(self, error: BaseException | None = None) -> SchemaMissingError:
        """The error to raise for a missing table: which one, and how to create it."""
        table = self.tables.tasks
        text = str(error or "")
        for candidate in self.tables.ours:
            if candidate.name in text:
                table = candidate
        name = f"{table.schema}.{table.name}" if table.schema else table.name
        return SchemaMissingError(
            f"table {name!r} does not exist in the jobs database at {self.where}: run "
            "`ekbatan-jobs migrate` once against it (with the application's settings or "
            "--url; `--dry-run` shows what it applies: the SQL installed with the package, "
            f"ekbatan_fastapi/migrations/{self.migrations_folder}/"
            f"{self.tables.migration_of(table.name)}.sql), or call "
            "`await ekbatan_fastapi.create_schema(engine)` once at deployment"
        )

    def translate(self, error: BaseException) -> BaseException:
        """The library's exception for a driver error (a missing table), else ``error``."""
        if self.is_missing_table(error):
            return self.missing_table(error)
        return error

    def timeout_error(self, *, connecting: bool = False) -> DatabaseTimeout:
        if connecting:
            return DatabaseTimeout(
                f"no connection to the database at {self.where} within "
                f"{self.statement_timeout:g}s (statement_timeout, spent connecting)"
            )
        return DatabaseTimeout(
            f"no answer from the database at {self.where} within {self.statement_timeout:g}s "
            "(statement_timeout); the connection was discarded"
        )

    def unavailable(self, error: BaseException) -> BaseException:
        """``DatabaseUnavailable`` naming the host for an error that means the database
        cannot be reached (the driver's error chained); else ``error`` itself."""
        if isinstance(error, DatabaseUnavailable):
            return error
        diagnosis = self.diagnose(error)
        if diagnosis.condition != "unreachable" or diagnosis.reachable:
            return error
        wrapped = DatabaseUnavailable(diagnosis.message)
        wrapped.__cause__ = error
        return wrapped

    def diagnose(self, error: BaseException) -> Diagnosis:
        """What ``error`` (raised by one of our statements) means; dialects add their codes
        (``diagnose_driver``)."""
        if isinstance(error, SchemaMissingError):
            return Diagnosis("schema-missing", True, str(error))
        if isinstance(error, DatabaseTimeout):
            return Diagnosis("timeout", False, str(error))
        if isinstance(error, DatabaseUnavailable):
            return Diagnosis("unreachable", False, str(error))
        found = self.diagnose_driver(error)
        if found is not None:
            return found
        inner = getattr(error, "orig", None) or error
        if isinstance(inner, OSError | TimeoutError) or getattr(
            error, "connection_invalidated", False
        ):
            return self._unreachable(error)
        if isinstance(error, DBAPIError):
            return Diagnosis(
                "error", True, f"the database refused a statement: {error_words(error)}"
            )
        return self._unreachable(error)

    def _unreachable(self, error: BaseException) -> Diagnosis:
        return Diagnosis(
            "unreachable", False, f"database unreachable at {self.where}: {error_words(error)}"
        )

    def diagnose_driver(self, error: BaseException) -> Diagnosis | None:
        """The dialect's reading of a driver error (its codes), or None."""
        return None

    def must_discard(self, error: BaseException) -> bool:
        """A connection that raised ``error`` must not be reused (a dialect's rule: e.g. a
        connection to a server that turned read-only, while a writable one may be reached)."""
        return False

    # -- connections ------------------------------------------------------------------------

    def lease(self) -> Lease:
        """A connection holder for one busy loop (see ``Lease``)."""
        return Lease(self.engine)

    @contextlib.asynccontextmanager
    async def leased(self, lease: Lease) -> AsyncIterator[Lease]:
        """Run statements on ``lease``'s connection, bounded by ``statement_timeout``; on any
        error the connection is discarded (a failed statement may have left it unusable)."""
        bound = asyncio.timeout(self.statement_timeout)
        try:
            async with bound:
                yield lease
        except TimeoutError:
            await lease.discard()
            if not bound.expired():
                raise  # the driver's own timeout (a connect timeout), not ours
            distrust_pool(self.engine)
            raise self.timeout_error() from None
        except BaseException:
            await lease.discard()
            raise

    @contextlib.asynccontextmanager
    async def connect(
        self, engine: AsyncEngine | None = None, *, begin: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        """A pooled connection (in a transaction when ``begin``) whose whole use is bounded
        by ``statement_timeout``; on timeout the connection is invalidated, never reused.
        Driver errors come out translated (``translate``)."""
        async with contextlib.AsyncExitStack() as stack:
            conn: AsyncConnection | None = None
            bound = asyncio.timeout(self.statement_timeout)
            try:
                async with bound:
                    conn = await stack.enter_async_context((engine or self.engine).connect())
                    if begin:
                        await stack.enter_async_context(conn.begin())
                    yield conn
            except TimeoutError as error:
                if conn is not None:
                    await discard_connection(conn)
                if not bound.expired():  # the driver's own timeout (a connect timeout)
                    wrapped = self.unavailable(error)
                    if wrapped is error:
                        raise
                    raise wrapped from error
                if conn is not None:
                    distrust_pool(engine or self.engine)
                raise self.timeout_error(connecting=conn is None) from None
            except asyncio.CancelledError:
                # Interrupted mid-statement (a stopping loop): the driver may still wait for
                # the answer or for its cancel request, so the connection is not reusable.
                if conn is not None:
                    await discard_connection(conn)
                raise
            except DBAPIError as error:
                if conn is not None and self.must_discard(error):
                    await discard_connection(conn)
                translated = self.unavailable(self.translate(error))
                if translated is error:
                    raise
                raise translated from error
            except OSError as error:  # a refused connection, an unknown host: raw from asyncpg
                if conn is not None:
                    await discard_connection(conn)
                translated = self.unavailable(error)
                if translated is error:
                    raise
                raise translated from error

    async def rows(self, stmt: Executable, params: Any = None) -> list[Any]:
        """Run one statement and return its rows (none for a statement without)."""
        async with self.connect() as conn:
            result = await conn.execute(stmt, params)
            return list(result.fetchall()) if result.returns_rows else []

    async def rowcount(self, stmt: Executable, params: Any = None) -> int:
        """Run one writing statement (committed) and return how many rows it matched."""
        async with self.connect() as conn:
            result = await conn.execute(stmt, params)
            return int(result.rowcount)

    async def clock(self, *extra: Any) -> list[Any]:
        """One row: the database's now (aware, UTC) and ``extra`` columns read with it."""
        row = (await self.rows(select(self.now_expr(), *extra)))[0]
        return [aware(row[0]), *row[1:]]
