"""``Caller``: the application's own ``AsyncConnection`` or ``AsyncSession``, on which the store
runs statements inside the application's transaction (``ctx.transaction(session)``,
``client.schedule(..., connection=conn)``): they commit or roll back with it.

It must be on the jobs database: a session bound to another database is refused, naming both
(host, port and database; never a password). A dialect may ask for the caller's connection to
be prepared before our first statement on it (``prepare_callers``; MySQL/MariaDB: values
written as its SQL mode reads them, ``store/mysql/literals.py``).
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.sql import Executable

from ..domain.errors import ConfigurationError

__all__ = ["WHOLE_TEXT", "Caller", "describe_url", "prepare_callers", "same_database"]

Prepare = Callable[[AsyncConnection | AsyncSession], Awaitable[None]]
_PREPARE: weakref.WeakKeyDictionary[Any, Prepare] = weakref.WeakKeyDictionary()
"""Per pool of a jobs engine: what a caller's connection needs before our statements."""


WHOLE_TEXT: dict[str, Any] = {"no_parameters": True}
"""``exec_driver_sql``'s option for a statement with its values written in: the driver gets
the text alone (its ``%`` interpolation is not run)."""


def prepare_callers(engine: AsyncEngine, prepare: Prepare) -> None:
    """Run ``prepare`` on an application's connection or session before the first of our
    statements on it, for the callers of the jobs engine ``engine`` (and of every engine
    sharing its pool)."""
    _PREPARE[engine.sync_engine.pool] = prepare


def describe_url(url: URL) -> str:
    """``backend://host:port/database``: where a URL points, without user or password."""
    host = url.host or url.query.get("host") or "localhost"
    if not isinstance(host, str):  # a multi-host URL: ?host=h1:5432&host=h2:5432
        host = ",".join(host)
    port = f":{url.port}" if url.port else ""
    return f"{url.get_backend_name()}://{host}{port}/{url.database or ''}"


def _where(url: URL) -> tuple[str, str, int | None, str | None]:
    host = url.host or url.query.get("host") or "localhost"
    return (url.get_backend_name(), str(host), url.port, url.database)


def same_database(a: URL, b: URL) -> bool:
    """Both URLs reach the same database (backend, host, port and database name)."""
    return _where(a) == _where(b)


def _sync_engine(target: AsyncConnection | AsyncSession) -> Engine:
    if isinstance(target, AsyncConnection):
        return target.sync_engine
    bind = target.sync_session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    return engine


class Caller:
    """The application's connection or session, checked to be on the jobs database."""

    def __init__(
        self,
        target: Any,
        jobs_engine: AsyncEngine,
        *,
        what: str,
        translate: Callable[[BaseException], BaseException],
    ) -> None:
        if not isinstance(target, AsyncConnection | AsyncSession):
            raise ConfigurationError(
                f"{what} takes a SQLAlchemy AsyncConnection or AsyncSession, got "
                f"{type(target).__name__}"
            )
        self.target = target
        self._translate = translate
        self._prepare = _PREPARE.get(jobs_engine.sync_engine.pool)
        theirs = _sync_engine(target).url
        ours = jobs_engine.url
        if not same_database(theirs, ours):
            raise ConfigurationError(
                f"{what} needs a connection or session on the jobs database "
                f"({describe_url(ours)}), but it is bound to {describe_url(theirs)}: the "
                "slot's row and your effects must commit in one transaction of one database"
            )

    @property
    def is_session(self) -> bool:
        return isinstance(self.target, AsyncSession)

    def in_transaction(self) -> bool:
        return self.target.in_transaction()

    async def begin(self) -> None:
        """Begin a transaction unless one is active (it is then the one used)."""
        if not self.target.in_transaction():
            await self.target.begin()

    async def _prepared(self) -> None:
        if self._prepare is not None:
            prepare, self._prepare = self._prepare, None
            await prepare(self.target)

    async def execute(self, stmt: Executable, params: Any = None) -> Any:
        await self._prepared()
        try:
            if params is None:
                return await self.target.execute(stmt)
            return await self.target.execute(stmt, params)
        except DBAPIError as error:
            translated = self._translate(error)
            if translated is error:
                raise
            raise translated from error

    async def connection(self) -> AsyncConnection:
        """The connection our statements run on (a session's, in its transaction), prepared
        for them."""
        await self._prepared()
        target = self.target
        return target if isinstance(target, AsyncConnection) else await target.connection()

    async def driver(self) -> Any:
        """The driver's own connection under ``connection()`` (what it escapes values for)."""
        return (await (await self.connection()).get_raw_connection()).driver_connection

    async def exec_text(self, statement: str) -> Any:
        """A statement written out whole (no parameters: the driver interpolates nothing)."""
        conn = await self.connection()
        try:
            return await conn.exec_driver_sql(statement, execution_options=WHOLE_TEXT)
        except DBAPIError as error:
            translated = self._translate(error)
            if translated is error:
                raise
            raise translated from error

    async def rowcount(self, stmt: Executable, params: Any = None) -> int:
        return int((await self.execute(stmt, params)).rowcount)

    async def flush(self) -> None:
        """Send the session's pending ORM changes (before our statements, so that they are
        in the transaction when it commits)."""
        if isinstance(self.target, AsyncSession):
            await self.target.flush()

    async def commit(self) -> None:
        await self.target.commit()

    async def rollback(self) -> None:
        await self.target.rollback()

    def after_commit(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once the transaction commits, where SQLAlchemy can tell (an
        ``AsyncSession``'s ``after_commit``); False where it cannot (a plain connection: its
        ``commit`` event fires before the commit)."""
        if not isinstance(self.target, AsyncSession):
            return False

        def committed(_session: object) -> None:
            callback()

        event.listen(self.target.sync_session, "after_commit", committed, once=True)
        return True
