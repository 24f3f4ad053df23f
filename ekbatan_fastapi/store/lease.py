"""Connections held by busy loops, and closing a connection that must not be reused."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["Lease", "discard_connection", "distrust_pool"]

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
