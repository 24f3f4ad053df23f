"""The jobs pool: a dedicated, small AsyncEngine, and the dialect read from its URL.

The dialect is decided from the URL alone, before any connection is opened, so an application
that starts while its database is unreachable still speaks the right SQL once it appears.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..domain.errors import ConfigurationError
from ..domain.logs import library_logger
from ..domain.text import mask_unparsed_url, mask_url
from .dialects import DIALECTS, Dialect
from .options import PoolOptions, validate_pooler

__all__ = [
    "DEFAULT_POOL_SIZE",
    "ConnectionProvider",
    "check_pooler",
    "dialect_of",
    "parse_url",
    "resolve_connection",
    "supported_urls",
]

DEFAULT_POOL_SIZE = 5
DEFAULT_DISPOSE_TIMEOUT = 5.0
"""Seconds ``ConnectionProvider.dispose`` waits for the pool's polite close."""

log = library_logger("ekbatan_fastapi.store")


def supported_urls() -> tuple[str, ...]:
    """The async driver URLs of the registered dialects (``postgresql+asyncpg://``, ...)."""
    drivers = (driver for d in DIALECTS.values() for driver in d.schemes.values())
    return tuple(dict.fromkeys(f"{driver}://" for driver in drivers))


def _by_scheme(scheme: str, url: URL) -> tuple[str, Dialect]:
    """The async driver URL and the dialect a URL scheme selects."""
    for candidate in DIALECTS.values():
        if scheme in candidate.schemes:
            return candidate.schemes[scheme], candidate
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r} in {_safe(url)}; supported: "
        f"{', '.join(supported_urls())}"
    )


def dialect_of(url: str | URL) -> Dialect:
    """The dialect a URL selects (nothing is opened or imported)."""
    parsed = parse_url(url)
    return _by_scheme(parsed.drivername, parsed)[1]


def parse_url(url: str | URL) -> URL:
    """``url`` as a SQLAlchemy URL; a ConfigurationError (the URL masked) when it is none."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError, TypeError) as error:
        shown = mask_unparsed_url(url) if isinstance(url, str) else "<the jobs URL>"
        raise ConfigurationError(
            f"cannot parse database URL {shown!r} ({mask_url(str(error))}); expected e.g. "
            "postgresql+asyncpg://user:password@host:5432/dbname"
        ) from None


def _safe(url: URL) -> str:
    return mask_url(url)


class ConnectionProvider:
    """Where the scheduler's connections come from, and which dialect they speak."""

    def __init__(
        self,
        engine: AsyncEngine,
        dialect: str,
        *,
        owns_engine: bool,
        options: PoolOptions | None = None,
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.owns_engine = owns_engine
        self.options = options
        """How the pool was built (None: an engine the application made)."""
        self._open: set[Any] = set()
        """The pool's driver connections not closed yet (ours only): what a dispose that
        timed out closes at once."""
        if owns_engine:
            pool_events = engine.sync_engine.pool
            event.listen(pool_events, "connect", self._opened)
            event.listen(pool_events, "close", self._closed)
            event.listen(pool_events, "close_detached", self._closed_detached)

    def _opened(self, dbapi_connection: Any, _record: Any) -> None:
        self._open.add(dbapi_connection)

    def _closed(self, dbapi_connection: Any, _record: Any) -> None:
        self._open.discard(dbapi_connection)

    def _closed_detached(self, dbapi_connection: Any) -> None:
        self._open.discard(dbapi_connection)

    @classmethod
    def from_url(
        cls,
        url: str | URL,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        pooler: str | None = None,
        idle_transaction_timeout: float | None = PoolOptions.idle_transaction_timeout,
        **engine_kwargs: Any,
    ) -> ConnectionProvider:
        """A dedicated pool (default 5 connections) built from a database URL; no connection
        is opened here.

        ``pooler``: what sits between the library and the database (``"pgbouncer-transaction"``:
        no prepared statement outlives its statement). ``idle_transaction_timeout`` (seconds,
        MySQL/MariaDB): the session bounds of docs/deployment.md; None leaves them alone."""
        parsed = parse_url(url)
        driver, dialect = _by_scheme(parsed.drivername, parsed)
        parsed = parsed.set(drivername=driver)
        if not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigurationError(f"pool_size must be a positive integer, got {pool_size!r}")
        pool = PoolOptions(validate_pooler(pooler), idle_transaction_timeout)
        check_pooler(dialect, pool.pooler)
        connect_args = {**dialect.connect_args, **engine_kwargs.pop("connect_args", {})}
        setup = None
        if dialect.pool_setup is not None:
            setup = dialect.pool_setup(parsed, connect_args, pool)
            parsed, connect_args = setup.url, setup.connect_args
        options: dict[str, Any] = {"pool_size": pool_size, "max_overflow": 0, "pool_recycle": 1800}
        if connect_args:
            options["connect_args"] = connect_args
        options.update(engine_kwargs)
        try:
            engine = create_async_engine(parsed, **options)
        except ImportError as error:
            extra = dialect.extra
            hint = f'pip install "ekbatan-fastapi[{extra}]"' if extra else "install it"
            raise ConfigurationError(
                f"the database driver for {driver}:// is not installed ({error}); {hint}"
            ) from None
        except (ArgumentError, ValueError, TypeError) as error:  # e.g. a port that is no number
            raise ConfigurationError(
                f"cannot use database URL {_safe(parsed)} ({mask_url(str(error))}); expected e.g. "
                "postgresql+asyncpg://user:password@host:5432/dbname"
            ) from None
        if setup is not None and setup.on_engine is not None:
            setup.on_engine(engine)
        return cls(engine, dialect.name, owns_engine=True, options=pool)

    @classmethod
    def from_engine(cls, engine: AsyncEngine, dialect: str | None = None) -> ConnectionProvider:
        """Use an engine the application made (it stays the application's to dispose)."""
        if not isinstance(engine, AsyncEngine):
            raise ConfigurationError(
                f"expected an sqlalchemy AsyncEngine, got {type(engine).__name__}"
            )
        if dialect is None:
            dialect = _by_scheme(engine.url.drivername, engine.url)[1].name
        return cls(engine, dialect, owns_engine=False)

    async def dispose(self, timeout: float | None = DEFAULT_DISPOSE_TIMEOUT) -> None:
        """Close our pool (an application's engine stays open). Closing a connection politely
        waits for the server's answer; a server that went silent (a frozen primary, a cut
        network) would hold that up forever, so after ``timeout`` seconds the connections
        left are closed at once, without a word to the server."""
        if not self.owns_engine:
            return
        try:
            async with asyncio.timeout(timeout):
                await self.engine.dispose()
        except TimeoutError:
            left = list(self._open)
            self._open.clear()
            for connection in left:
                with contextlib.suppress(Exception):  # a broken socket: nothing to report
                    connection.terminate()  # outside a greenlet: closes the socket at once
            log.warning(
                "the jobs pool did not close within %gs (the database does not answer): "
                "%d connection(s) closed without waiting",
                timeout,
                len(left),
            )

    def __repr__(self) -> str:
        return f"ConnectionProvider({_safe(self.engine.url)}, dialect={self.dialect!r})"


def check_pooler(dialect: Dialect, pooler: str) -> None:
    """A ConfigurationError when ``dialect`` cannot work behind ``pooler``."""
    if pooler not in dialect.poolers:
        raise ConfigurationError(
            f"pooler {pooler!r} is for PostgreSQL (PgBouncer); the {dialect.name} dialect "
            f"supports {', '.join(dialect.poolers)}"
        )


def resolve_connection(
    value: str | URL | AsyncEngine | ConnectionProvider,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    pooler: str | None = None,
    idle_transaction_timeout: float | None = PoolOptions.idle_transaction_timeout,
) -> ConnectionProvider:
    """Accept a URL (the pool is built with the given options), an AsyncEngine or a
    ConnectionProvider (used as they are)."""
    if isinstance(value, ConnectionProvider):
        return value
    if isinstance(value, AsyncEngine):
        return ConnectionProvider.from_engine(value)
    if isinstance(value, str | URL):
        return ConnectionProvider.from_url(
            value,
            pool_size=pool_size,
            pooler=pooler,
            idle_transaction_timeout=idle_transaction_timeout,
        )
    raise ConfigurationError(
        "connection_provider takes a database URL, an AsyncEngine or a ConnectionProvider, "
        f"got {type(value).__name__}"
    )
