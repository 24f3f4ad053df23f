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
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Table, event, func, select
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

from ..domain.errors import (
    DatabaseLoginRefused,
    DatabaseTimeout,
    DatabaseUnavailable,
    SchemaMissingError,
)
from ..domain.text import mask_url
from .external import describe_url
from .tables import Tables, quote_table

__all__ = [
    "DEFAULT_STATEMENT_TIMEOUT",
    "Database",
    "Diagnosis",
    "Lease",
    "aware",
    "discard_connection",
    "distrust_pool",
    "error_words",
    "is_autocommit",
]

DEFAULT_STATEMENT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Diagnosis:
    """What a database error means, in the words ``status()`` and ``/jobs`` show."""

    condition: str
    """``unreachable`` (no connection), ``login-refused`` (the server refused the configured
    user's login, or has no such database), ``timeout`` (no answer in time), ``read-only`` (a
    standby or a fenced primary answered), ``pooler`` (a transaction-pooling PgBouncer refused
    a prepared statement), ``schema-missing``, ``lock-wait``, or ``error`` (the database
    refused the statement for another reason)."""
    reachable: bool
    """The database answered (the error is its answer), or not."""
    message: str
    """The meaning and the fix first, then the driver's words."""


def error_words(error: BaseException) -> str:
    """The driver's own words for ``error`` (its class and message), secrets masked."""
    inner = getattr(error, "orig", None) or error
    words = str(inner).strip()
    return mask_url(f"{type(inner).__name__}: {words}") if words else type(inner).__name__


_LOGIN_SQLSTATES = {"28P01": "login", "28000": "login", "3D000": "database"}
"""PostgreSQL's answers to a login: invalid_password, invalid_authorization_specification
(an unknown role, no pg_hba.conf entry), invalid_catalog_name (no such database)."""
_PROTOCOL_VIOLATION = "08P01"
"""What PgBouncer answers a wrong password with ("password authentication failed", "SASL
authentication failed"), where the server itself says 28P01."""
_LOGIN_ERRNOS = {1045: "login", 1698: "login", 1044: "grant", 1049: "database"}
"""MySQL/MariaDB's: ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR,
ER_DBACCESS_DENIED_ERROR, ER_BAD_DB_ERROR."""


def login_refusal(error: BaseException) -> tuple[str, str] | None:
    """``(kind, code)`` when ``error`` is a server's refusal of our login (``login``,
    ``grant``: the user may not use that database, ``database``: no such database), read from
    the driver's code (a PostgreSQL SQLSTATE, a MySQL/MariaDB error number), else None."""
    for candidate in (error, getattr(error, "orig", None)):
        if candidate is None or isinstance(candidate, OSError):
            continue
        args = getattr(candidate, "args", ())  # MySQL/MariaDB's number first: it says more
        if args and type(args[0]) is int and args[0] in _LOGIN_ERRNOS:
            return _LOGIN_ERRNOS[args[0]], f"error {args[0]}"
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str) and state in _LOGIN_SQLSTATES:
            return _LOGIN_SQLSTATES[state], f"SQLSTATE {state}"
        if state == _PROTOCOL_VIOLATION and "authentication failed" in str(candidate):
            return "login", f"SQLSTATE {state}"  # PgBouncer's answer to a wrong password
    return None


_URL_SETTING = (
    "the jobs database's URL (EKBATAN_DATABASE_URL or the jobs-config slot's url; the CLI's --url)"
)
_ADMITTED = {"postgresql": "pg_hba.conf", "mysql": "its user@host accounts"}


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
        self.write_conflicts = 0
        """Transactions run again after a write conflict (MySQL/MariaDB error 1213: an InnoDB
        deadlock, or a Galera certification conflict reported at COMMIT); read by the
        ``ekbatan_write_conflicts_total`` metric."""
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
        wrapped: DatabaseUnavailable
        if diagnosis.condition == "login-refused":
            wrapped = DatabaseLoginRefused(diagnosis.message)
        elif diagnosis.condition == "unreachable" and not diagnosis.reachable:
            wrapped = DatabaseUnavailable(diagnosis.message)
        else:
            return error
        wrapped.__cause__ = error
        return wrapped

    def diagnose(self, error: BaseException) -> Diagnosis:
        """What ``error`` (raised by one of our statements) means; dialects add their codes
        (``diagnose_driver``)."""
        if isinstance(error, SchemaMissingError):
            return Diagnosis("schema-missing", True, str(error))
        if isinstance(error, DatabaseTimeout):
            return Diagnosis("timeout", False, str(error))
        if isinstance(error, DatabaseLoginRefused):
            return Diagnosis("login-refused", True, str(error))
        if isinstance(error, DatabaseUnavailable):
            return Diagnosis("unreachable", False, str(error))
        refusal = login_refusal(error)
        if refusal is not None:
            return Diagnosis("login-refused", True, self._refused(*refusal))
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

    def _refused(self, kind: str, code: str) -> str:
        """What a refused login means and its fix, naming where but never the user (the
        driver's own words name the user: an unauthenticated ``/jobs`` shows this)."""
        database = self.engine.url.database or ""
        if kind == "database":
            return (
                f"there is no database {database!r} at {self.where} (the server answered "
                f"{code}): create it (CREATE DATABASE), or fix the database name in "
                f"{_URL_SETTING}"
            )
        if kind == "grant":
            return (
                f"the database at {self.where} refused the configured user access to database "
                f"{database!r} ({code}): grant it (GRANT ... ON {database}.* TO ...), or fix "
                f"the database name in {_URL_SETTING}"
            )
        rules = _ADMITTED.get(self.engine.dialect.name, "its access rules")
        return (
            f"the database at {self.where} refused the login of the configured user ({code}: "
            "a wrong password, a user it does not know, or a host it does not admit): check "
            f"the user and password in {_URL_SETTING} or the jobs-config slot's username and "
            f"password, and that the server admits that user from this host ({rules})"
        )

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
        except BaseException as error:
            failure = await self._failed_on(lease, error, bound.expired())
            if failure is error:
                raise
            raise failure from None

    async def fetch(self, lease: Lease, sql: str, args: list[Any]) -> list[Any]:
        """Run ``sql`` on ``lease``'s driver connection (asyncpg's ``fetch``), as ``leased``
        bounds and translates it: the hot statements' round trip, without a context manager
        (the connection held since the last statement is read directly)."""
        bound = asyncio.timeout(self.statement_timeout)
        try:
            async with bound:
                # ``lease.driver()`` written out (the first statement after each idle poll)
                if lease._timer is not None:
                    lease._timer.cancel()
                    lease._timer = None
                driver = lease._driver
                if driver is None:
                    if lease._conn is None:
                        lease._conn = await lease._engine.connect()
                    raw = await lease._conn.get_raw_connection()
                    driver = lease._driver = raw.driver_connection
                rows: list[Any] = await driver.fetch(sql, *args)
                return rows
        except BaseException as error:
            failure = await self._failed_on(lease, error, bound.expired())
            if failure is error:
                raise
            raise failure from None

    async def _failed_on(self, lease: Lease, error: BaseException, expired: bool) -> BaseException:
        """A statement on ``lease`` failed: its connection is discarded (it may be unusable).
        The error to raise: ``timeout_error`` when our bound ``expired`` (the pool distrusted:
        its other connections most likely lead to the same silent server), else ``error``
        (a driver's own timeout, a connect timeout, is not ours)."""
        await lease.discard()
        if expired and isinstance(error, TimeoutError):
            distrust_pool(self.engine)
            return self.timeout_error()
        return error

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
            except (TimeoutError, asyncio.CancelledError, DBAPIError, OSError) as error:
                if conn is not None and self._spoils(error):
                    await discard_connection(conn)
                if isinstance(error, TimeoutError) and bound.expired():
                    if conn is not None:
                        distrust_pool(engine or self.engine)
                    raise self.timeout_error(connecting=conn is None) from None
                translated = self._translated(error)
                if translated is error:
                    raise
                raise translated from error

    def _spoils(self, error: BaseException) -> bool:
        """Whether the connection a failure happened on must be discarded: after a timeout or
        a cancellation (interrupted mid-statement, the driver may still wait for the answer
        or for its cancel request), a network error, or a driver error that leaves it
        unusable (``must_discard``)."""
        return not isinstance(error, DBAPIError) or self.must_discard(error)

    def _translated(self, error: BaseException) -> BaseException:
        """The error to raise for a failure of ``connect``'s block: a driver error translated
        (``translate``), and what means the database cannot be reached (a refused
        connection, an unknown host: raw from asyncpg; the driver's own connect timeout) as
        ``unavailable`` says; a cancellation as it is."""
        if isinstance(error, asyncio.CancelledError):
            return error
        if isinstance(error, DBAPIError):
            return self.unavailable(self.translate(error))
        return self.unavailable(error)

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


# -- Leases: connections held by busy loops ---------------------------------------------------

_LEASE_IDLE = 1.0
"""Seconds a lease keeps its idle connection before giving it back to the pool."""


_DISTRUSTED: weakref.WeakKeyDictionary[Any, list[float]] = weakref.WeakKeyDictionary()
"""Per pool: the time before which its connections are not trusted (see ``distrust_pool``)."""


def _abort(dbapi_connection: Any) -> None:
    driver = getattr(dbapi_connection, "driver_connection", None)
    close = getattr(driver, "terminate", None) or getattr(driver, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _born(_dbapi_connection: Any, record: Any) -> None:
    record.info["ekbatan_born"] = time.monotonic()


def _make_checkout_check(mark: list[float]) -> Any:
    def check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get("ekbatan_born", 0.0) < mark[0]:
            _abort(dbapi_connection)  # at once: the polite close would wait for a silent server
            raise DisconnectionError("opened before the pool's server went silent")

    return check


def distrust_pool(engine: AsyncEngine) -> None:
    """A statement on one of ``engine``'s connections got no answer within its bound: the
    server (or the path to it) went silent, and every idle connection of the pool opened
    before now most likely leads to the same place. Each is replaced by a new connection at
    its next checkout instead of spending a statement timeout of its own (5 idle connections
    to a frozen primary were 5 timeouts in a row, before the first reconnect)."""
    pool = engine.sync_engine.pool
    mark = _DISTRUSTED.get(pool)
    if mark is None:
        mark = [0.0]
        _DISTRUSTED[pool] = mark
        event.listen(pool, "connect", _born)
        event.listen(pool, "checkout", _make_checkout_check(mark))
    mark[0] = time.monotonic()


async def discard_connection(conn: AsyncConnection) -> None:
    """Close a connection that must not be reused, at once.

    SQLAlchemy's invalidation closes an asyncpg connection politely (a Terminate message, up to
    2 s for the answer): on a connection that went silent that is 2 s lost, each time. The
    driver's ``terminate()`` (asyncpg) closes the socket without a word first.
    """
    with contextlib.suppress(Exception):
        raw = await conn.get_raw_connection()
        terminate = getattr(raw.driver_connection, "terminate", None)
        if callable(terminate):
            terminate()
    with contextlib.suppress(Exception):
        await conn.invalidate()


class Lease:
    """One pooled connection that a busy loop keeps across its statements.

    Checking a connection out of the pool and back costs more client CPU than a small
    statement (SQLAlchemy's checkout, the AUTOCOMMIT switch and the reset on return), so on
    PostgreSQL the poller and the completer each hold one while they have work: at most two
    connections of the pool, besides the LISTEN connection. A loop calls ``idle()`` before a
    short wait (the connection goes back to the pool after ``_LEASE_IDLE`` seconds without
    use) and ``release()`` before a long one, so an idle scheduler holds none. Any error or
    cancellation during a statement discards the connection (it is never reused).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def connection(self) -> AsyncConnection:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._conn is None:
            self._conn = await self._engine.connect()
        return self._conn

    async def driver(self) -> Any:
        """The driver's own connection (asyncpg's), for the statements that skip SQLAlchemy
        (``connection`` written out; ``Database.fetch`` writes this out in turn)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._driver is None:
            if self._conn is None:
                self._conn = await self._engine.connect()
            self._driver = (await self._conn.get_raw_connection()).driver_connection
        return self._driver

    def idle(self) -> None:
        """The loop is about to wait: give the connection back unless it is used again soon."""
        if self._conn is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_LEASE_IDLE, self._expire)

    def _detach(self) -> AsyncConnection | None:
        """Forget the connection (and a pending idle release); the caller closes it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn, self._driver = self._conn, None, None
        return conn

    def _expire(self) -> None:
        self._timer = None
        conn = self._detach()
        if conn is not None:
            task = asyncio.get_running_loop().create_task(self._close(conn, invalidate=False))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(conn: AsyncConnection, *, invalidate: bool) -> None:
        if invalidate:
            await discard_connection(conn)
        with contextlib.suppress(Exception):
            await conn.close()

    async def discard(self) -> None:
        """Drop the connection after an error: it is invalidated, never pooled again."""
        conn = self._detach()
        if conn is not None:
            await self._close(conn, invalidate=True)

    async def release(self) -> None:
        """Give the connection back now (a loop that ends, a poller with nothing due: once per
        idle poll, so ``_detach`` and ``_close`` are written out)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self._conn
        if conn is not None:
            self._conn = self._driver = None
            with contextlib.suppress(Exception):
                await conn.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
