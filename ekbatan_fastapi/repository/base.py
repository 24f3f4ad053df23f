"""The task repository: the only code that writes SQL.

The lease protocol, which every dialect implements:

* A row is *owned* by the instance whose claim set ``picked=true`` and bumped ``version``;
  the owner remembers that version (``Owned``).
* Every write by the owner (heartbeat, finish) is guarded by ``version = <ours>``. Zero rows
  updated means the row was revived or changed elsewhere: the owner has lost it and must not
  record anything.
* Every "is it due / is it dead" comparison uses the database clock (``now()`` in SQL).
* Reviving a dead execution bumps ``version`` and keeps ``execution_time`` (the slot keeps
  its identity), so the stale owner's later writes match zero rows.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

from ..errors import DatabaseTimeout, SchemaMissingError
from ..operations.tables import PAUSED
from ..schema import scheduled_tasks_table
from .model import Finish, HistoryEntry, NewTask, Owned, PollResult, TaskKey, TaskRow

__all__ = [
    "HistoryTableMissing",
    "HistoryUnwritable",
    "Lease",
    "PollingStrategy",
    "TaskRepository",
]


class HistoryUnwritable(Exception):
    """``finish`` failed because of the history it was to write with the results (a value or
    a permission the database refused); nothing was written. Send the results without it."""


class HistoryTableMissing(HistoryUnwritable):
    """The history table went away while ``finish`` wrote the history with the results."""


_LEASE_IDLE = 1.0
"""Seconds a lease keeps its idle connection before giving it back to the pool."""


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
        """The driver's own connection (asyncpg's), for the statements that skip SQLAlchemy."""
        conn = await self.connection()
        if self._driver is None:
            self._driver = (await conn.get_raw_connection()).driver_connection
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
        """Give the connection back now (a loop that ends)."""
        conn = self._detach()
        if conn is not None:
            await self._close(conn, invalidate=False)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


class PollingStrategy:
    """How due rows are claimed."""

    FETCH = "fetch"
    """Select due rows, then claim them with a version-guarded update (db-scheduler's default)."""
    LOCK_AND_FETCH = "lock-and-fetch"
    """Claim in one statement with ``FOR UPDATE SKIP LOCKED``."""

    ALL = (FETCH, LOCK_AND_FETCH)


class TaskRepository(abc.ABC):
    """Reads and writes ``scheduled_tasks``; one subclass per dialect for what differs."""

    dialect_name: str = "generic"
    supports_skip_locked: bool = False
    supports_notify: bool = False
    """True where ``listen`` can push "something became due" to every instance."""
    writes_history_with_finish: bool = False
    """True where ``finish`` can insert the execution history in the same statement."""

    statement_timeout: float | None = 30.0
    """Seconds a statement (with its connection checkout) may take; None: unbounded. A
    connection that died without a reset (a partition, a failover that moved the address)
    never answers: without this bound the loop waiting on it would wait forever. On timeout
    the connection is discarded and ``DatabaseTimeout`` raised; the loop retries on a new one.
    Set by ``b.statement_timeout(...)``."""

    def __init__(self, engine: AsyncEngine, table_name: str) -> None:
        self.table_name = table_name
        self.table = scheduled_tasks_table(table_name)
        schema = self.table.schema
        self.pause_table_name = f"{schema}.{PAUSED}" if schema else PAUSED
        self.pauses_enabled = False
        """Set once the pause table is known to exist: polls then skip paused task names."""
        # Each statement commits by itself: one round trip, no BEGIN/COMMIT.
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.tx_engine = engine
        """For the rare statements that need a transaction of their own."""

    # -- helpers -------------------------------------------------------------------------

    @abc.abstractmethod
    def is_missing_table(self, error: DBAPIError) -> bool:
        """True when the database says the table does not exist."""

    def missing_table_error(self) -> SchemaMissingError:
        return SchemaMissingError(
            f"table {self.table_name!r} does not exist in the jobs database: apply "
            f"migrations/{self.dialect_name}/V0001__create_scheduled_tasks.sql, "
            "or call `await ekbatan_fastapi.create_schema(engine)` once at deployment"
        )

    def lease(self) -> Lease:
        """A connection holder for one busy loop (see ``Lease``)."""
        return Lease(self.engine)

    def _timeout_error(self) -> DatabaseTimeout:
        return DatabaseTimeout(
            f"no answer from the database within {self.statement_timeout:g}s "
            "(statement_timeout); the connection was discarded"
        )

    @contextlib.asynccontextmanager
    async def _leased(self, lease: Lease) -> AsyncIterator[Lease]:
        """Run statements on ``lease``'s connection, bounded by ``statement_timeout``; on any
        error the connection is discarded (a failed statement may have left it unusable)."""
        try:
            async with asyncio.timeout(self.statement_timeout):
                yield lease
        except TimeoutError:
            await lease.discard()
            raise self._timeout_error() from None
        except BaseException:
            await lease.discard()
            raise

    @contextlib.asynccontextmanager
    async def _connect(
        self, engine: AsyncEngine | None = None, *, begin: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        """A pooled connection (in a transaction when ``begin``) whose whole use is bounded
        by ``statement_timeout``; on timeout the connection is invalidated, never reused."""
        async with contextlib.AsyncExitStack() as stack:
            conn: AsyncConnection | None = None
            try:
                async with asyncio.timeout(self.statement_timeout):
                    conn = await stack.enter_async_context((engine or self.engine).connect())
                    if begin:
                        await stack.enter_async_context(conn.begin())
                    yield conn
            except TimeoutError:
                if conn is not None:
                    await discard_connection(conn)
                raise self._timeout_error() from None
            except asyncio.CancelledError:
                # Interrupted mid-statement (a stopping loop): the driver may still wait for
                # the answer or for its cancel request, so the connection is not reusable.
                if conn is not None:
                    await discard_connection(conn)
                raise

    async def _rows(self, stmt: Executable, params: Any = None) -> list[Any]:
        try:
            async with self._connect() as conn:
                result = await conn.execute(stmt, params)
                return list(result.fetchall()) if result.returns_rows else []
        except DBAPIError as error:
            if self.is_missing_table(error):
                raise self.missing_table_error() from error
            raise

    async def _rowcount(self, stmt: Executable, params: Any = None) -> int:
        try:
            async with self._connect() as conn:
                result = await conn.execute(stmt, params)
                return int(result.rowcount)
        except DBAPIError as error:
            if self.is_missing_table(error):
                raise self.missing_table_error() from error
            raise

    @staticmethod
    def aware(value: datetime | None) -> datetime | None:
        """Timestamps come back aware from PostgreSQL; naive ones are UTC by our contract."""
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)

    def to_row(self, row: Row[Any] | Any) -> TaskRow:
        m = row._mapping
        execution_time = self.aware(m["execution_time"])
        assert execution_time is not None
        return TaskRow(
            task_name=m["task_name"],
            task_instance=m["task_instance"],
            task_data=bytes(m["task_data"]) if m["task_data"] is not None else None,
            execution_time=execution_time,
            picked=bool(m["picked"]),
            picked_by=m["picked_by"],
            last_success=self.aware(m["last_success"]),
            last_failure=self.aware(m["last_failure"]),
            consecutive_failures=m["consecutive_failures"],
            last_heartbeat=self.aware(m["last_heartbeat"]),
            version=int(m["version"]),
            priority=m["priority"],
        )

    # -- shared, portable statements ----------------------------------------------------

    def now_expr(self) -> ColumnElement[datetime]:
        """The database's current time in UTC, as SQL."""
        return func.now()

    async def db_now(self) -> datetime:
        """The database's clock; the statement also proves that the table exists."""
        probe = select(self.table.c.version).limit(1).scalar_subquery()
        rows = await self._rows(select(self.now_expr(), probe))
        value = self.aware(rows[0][0])
        assert value is not None
        return value

    async def get(self, task_name: str, task_instance: str) -> TaskRow | None:
        t = self.table
        stmt = select(t).where(t.c.task_name == task_name, t.c.task_instance == task_instance)
        rows = await self._rows(stmt)
        return self.to_row(rows[0]) if rows else None

    async def list_tasks(
        self,
        task_name: str | None = None,
        *,
        picked: bool | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[TaskRow]:
        """Rows ordered by execution time (``LIMIT``/``OFFSET``, portable everywhere)."""
        t = self.table
        stmt = select(t).order_by(t.c.execution_time, t.c.task_name, t.c.task_instance)
        if task_name is not None:
            stmt = stmt.where(t.c.task_name == task_name)
        if picked is not None:
            stmt = stmt.where(t.c.picked == picked)
        stmt = stmt.limit(limit).offset(offset)
        return [self.to_row(r) for r in await self._rows(stmt)]

    async def reschedule(
        self,
        task_name: str,
        task_instance: str,
        execution_time: datetime | None,
        *,
        task_data: bytes | None = None,
        replace_data: bool = False,
        expected_version: int | None = None,
    ) -> bool:
        """Move an unpicked row to ``execution_time`` (None: the database's now).

        Counters are kept. False when the row is absent, picked, or (with
        ``expected_version``) changed since it was read: nothing was written.
        """
        t = self.table
        values: dict[str, Any] = {
            "execution_time": execution_time if execution_time is not None else self.now_expr(),
            "version": t.c.version + 1,
        }
        if replace_data:
            values["task_data"] = task_data
        stmt = (
            update(t)
            .where(
                t.c.task_name == task_name,
                t.c.task_instance == task_instance,
                t.c.picked.is_(False),
            )
            .values(values)
        )
        if expected_version is not None:
            stmt = stmt.where(t.c.version == expected_version)
        return await self._rowcount(stmt) == 1

    async def delete_unpicked(self, task_name: str, task_instance: str) -> bool:
        """Delete a row unless it is running. False when absent or picked."""
        t = self.table
        stmt = delete(t).where(
            t.c.task_name == task_name,
            t.c.task_instance == task_instance,
            t.c.picked.is_(False),
        )
        return await self._rowcount(stmt) == 1

    async def claim_now(self, task_name: str, task_instance: str, picked_by: str) -> TaskRow | None:
        """Claim one unpicked row at once, moving its slot to now (a forced run). Same claim
        as a poll's (``version + 1``, heartbeat now); None when absent or already picked."""
        t = self.table
        where = (t.c.task_name == task_name, t.c.task_instance == task_instance)
        now = self.now_expr()
        claim = (
            update(t)
            .where(*where, t.c.picked.is_(False))
            .values(
                picked=True,
                picked_by=picked_by,
                last_heartbeat=now,
                execution_time=now,
                version=t.c.version + 1,
            )
        )
        try:
            async with self._connect(self.tx_engine, begin=True) as conn:
                if (await conn.execute(claim)).rowcount != 1:
                    return None
                row = (await conn.execute(select(t).where(*where))).one()
        except DBAPIError as error:
            if self.is_missing_table(error):
                raise self.missing_table_error() from error
            raise
        return self.to_row(row)

    async def recurring_rows(self, names: Sequence[str], instance: str) -> list[TaskRow]:
        t = self.table
        stmt = select(t).where(t.c.task_instance == instance, t.c.task_name.in_(list(names)))
        return [self.to_row(r) for r in await self._rows(stmt)]

    async def delete_unresolved(self, known_names: Sequence[str], older_than: timedelta) -> int:
        """Delete unpicked rows of task names this instance does not know, overdue by more
        than ``older_than`` (measured on the database clock from ``execution_time``)."""
        t = self.table
        cutoff = (await self.db_now()) - older_than
        stmt = delete(t).where(
            t.c.task_name.not_in(list(known_names)),
            t.c.picked.is_(False),
            t.c.execution_time < cutoff,
        )
        return await self._rowcount(stmt)

    # -- dialect-specific statements ----------------------------------------------------

    @abc.abstractmethod
    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """Insert rows that do not exist yet, race-safely; the keys actually inserted.

        A task whose ``execution_time`` is None is due at the database's now.
        """

    @abc.abstractmethod
    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """Insert ``task``; when it exists, replace time/data/priority only if ``replace`` and
        the row is not picked. True when something was written."""

    @abc.abstractmethod
    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: str,
        *,
        lease: Lease | None = None,
    ) -> PollResult:
        """Claim up to ``limit`` due rows (``picked=false AND execution_time <= now()``,
        ``priority DESC, execution_time ASC``) of ``names`` for ``picked_by``.

        A claim sets ``picked=true, picked_by, last_heartbeat=now(), version=version+1`` and is
        exclusive: a row is claimed by at most one caller. Also returns the database's now and
        the earliest future ``execution_time`` of an unpicked row of ``names``; a dialect may
        return an earlier one when a due row was left unclaimed (a peer held its lock), and the
        scheduler then polls again soon.
        """

    @abc.abstractmethod
    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[HistoryEntry] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        """Record results; each write guarded by the owned version. Returns the keys recorded;
        a key missing from the answer was lost to a revival and nothing was written for it.

        ``history`` (only where ``writes_history_with_finish``): records inserted into the
        history table by the same statement, ``superseded`` where no write matched. ``retry``:
        an earlier attempt of the same batch failed and may have committed (its answer lost):
        records already in the table are not written again."""

    @abc.abstractmethod
    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        """Set ``last_heartbeat=now()`` on owned rows (version-guarded); the keys updated."""

    @abc.abstractmethod
    async def revive_dead(self, names: Sequence[str], dead_after: timedelta) -> list[TaskRow]:
        """Unpick rows of ``names`` whose heartbeat is older than ``dead_after`` (or missing),
        bumping ``version`` and keeping ``execution_time``. Returns the rows as they were
        before revival (``picked_by`` names the instance presumed dead)."""

    async def revive_and_watch(
        self, names: Sequence[str], dead_after: timedelta
    ) -> tuple[list[TaskRow], datetime | None]:
        """``revive_dead``, and when the next picked row of ``names`` would be dead if its
        heartbeats stopped now (None: no picked row, or the dialect cannot tell), by the
        database clock."""
        return await self.revive_dead(names, dead_after), None

    # -- optional push notifications ------------------------------------------------------

    async def notify(self, execution_time: datetime | None) -> None:
        """Tell every listening instance that a row is due at ``execution_time`` (None: now).

        A no-op where the dialect has no notifications: instances then learn of new work
        when they poll.
        """
        return None

    async def listen(self, on_due: Callable[[datetime | None], None]) -> None:
        """Call ``on_due`` for every notification until the connection is lost (then raise).

        Only dialects with ``supports_notify`` implement it.
        """
        raise NotImplementedError(f"{self.dialect_name} has no notifications")
