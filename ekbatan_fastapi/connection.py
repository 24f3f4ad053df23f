"""The jobs pool: a dedicated, small AsyncEngine, and the dialect read from its URL.

The dialect is decided from the URL alone, before any connection is opened, so an application
that starts while its database is unreachable still speaks the right SQL once it appears.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .errors import ConfigurationError
from .repository.base import TaskRepository
from .repository.mysql import MariaDBRepository, MySQL5Repository, MySQLRepository
from .repository.postgresql import PostgresRepository

__all__ = [
    "DEFAULT_POOL_SIZE",
    "SUPPORTED_URLS",
    "ConnectionProvider",
    "repository_class",
    "resolve_connection",
]

DEFAULT_POOL_SIZE = 5

# URL scheme -> (the async driver URL to use, dialect name)
_SCHEMES: dict[str, tuple[str, str]] = {
    "postgresql": ("postgresql+asyncpg", "postgresql"),
    "postgres": ("postgresql+asyncpg", "postgresql"),
    "postgresql+asyncpg": ("postgresql+asyncpg", "postgresql"),
}

_REPOSITORIES: dict[str, type[TaskRepository]] = {"postgresql": PostgresRepository}

# dialect -> connect_args of the pools built from a URL (a bounded connect, never a hang)
_CONNECT_ARGS: dict[str, dict[str, Any]] = {"postgresql": {"timeout": 5}}

# dialect -> the pip extra that installs its driver
_EXTRAS: dict[str, str] = {}

SUPPORTED_URLS: tuple[str, ...] = ("postgresql+asyncpg://",)


def register_dialect(
    dialect: str,
    repository: type[TaskRepository],
    schemes: dict[str, str],
    *,
    connect_args: dict[str, Any] | None = None,
    extra: str | None = None,
) -> None:
    """Make another dialect known: its repository, the URL schemes that select it (scheme ->
    async driver URL; none for a dialect reachable only through ``b.dialect(...)``), the
    connect arguments of pools built from a URL, and the pip extra that installs its driver.

    Nothing is imported here: the driver is imported when an engine is created.
    """
    global SUPPORTED_URLS
    _REPOSITORIES[dialect] = repository
    for scheme, driver in schemes.items():
        _SCHEMES[scheme] = (driver, dialect)
    if connect_args is not None:
        _CONNECT_ARGS[dialect] = connect_args
    if extra is not None:
        _EXTRAS[dialect] = extra
    SUPPORTED_URLS = tuple(dict.fromkeys(f"{d}://" for d, _ in _SCHEMES.values()))


def repository_class(dialect: str) -> type[TaskRepository]:
    try:
        return _REPOSITORIES[dialect]
    except KeyError:
        raise ConfigurationError(
            f"dialect {dialect!r} is not supported; use one of {', '.join(sorted(_REPOSITORIES))}"
        ) from None


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


class ConnectionProvider:
    """Where the scheduler's connections come from, and which dialect they speak."""

    def __init__(self, engine: AsyncEngine, dialect: str, *, owns_engine: bool) -> None:
        self.engine = engine
        self.dialect = dialect
        self.owns_engine = owns_engine

    @classmethod
    def from_url(
        cls, url: str | URL, *, pool_size: int = DEFAULT_POOL_SIZE, **engine_kwargs: Any
    ) -> ConnectionProvider:
        """A dedicated pool (default 5 connections) built from a database URL; no connection
        is opened here."""
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as error:
            shown = url if isinstance(url, str) and "@" not in url else "<the jobs URL>"
            raise ConfigurationError(
                f"cannot parse database URL {shown!r} ({error}); expected e.g. "
                "postgresql+asyncpg://user:password@host:5432/dbname"
            ) from None
        scheme = parsed.drivername
        if scheme not in _SCHEMES:
            raise ConfigurationError(
                f"unsupported database URL scheme {scheme!r} in {_safe(parsed)}; supported: "
                f"{', '.join(SUPPORTED_URLS)}"
            )
        driver, dialect = _SCHEMES[scheme]
        parsed = parsed.set(drivername=driver)
        if not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigurationError(f"pool_size must be a positive integer, got {pool_size!r}")
        options: dict[str, Any] = {"pool_size": pool_size, "max_overflow": 0, "pool_recycle": 1800}
        if dialect in _CONNECT_ARGS:
            options["connect_args"] = dict(_CONNECT_ARGS[dialect])
        options.update(engine_kwargs)
        try:
            engine = create_async_engine(parsed, **options)
        except ImportError as error:
            extra = _EXTRAS.get(dialect)
            hint = f'pip install "ekbatan-fastapi[{extra}]"' if extra else "install it"
            raise ConfigurationError(
                f"the database driver for {driver}:// is not installed ({error}); {hint}"
            ) from None
        return cls(engine, dialect, owns_engine=True)

    @classmethod
    def from_engine(cls, engine: AsyncEngine, dialect: str | None = None) -> ConnectionProvider:
        """Use an engine the application made (it stays the application's to dispose)."""
        if not isinstance(engine, AsyncEngine):
            raise ConfigurationError(
                f"expected an sqlalchemy AsyncEngine, got {type(engine).__name__}"
            )
        if dialect is None:
            scheme = engine.url.drivername
            if scheme not in _SCHEMES:
                raise ConfigurationError(
                    f"unsupported database URL scheme {scheme!r} in {_safe(engine.url)}; "
                    f"supported: {', '.join(SUPPORTED_URLS)}"
                )
            dialect = _SCHEMES[scheme][1]
        return cls(engine, dialect, owns_engine=False)

    async def dispose(self) -> None:
        if self.owns_engine:
            await self.engine.dispose()

    def __repr__(self) -> str:
        return f"ConnectionProvider({_safe(self.engine.url)}, dialect={self.dialect!r})"


def resolve_connection(value: str | URL | AsyncEngine | ConnectionProvider) -> ConnectionProvider:
    """Accept a URL, an AsyncEngine or a ConnectionProvider."""
    if isinstance(value, ConnectionProvider):
        return value
    if isinstance(value, AsyncEngine):
        return ConnectionProvider.from_engine(value)
    if isinstance(value, str | URL):
        return ConnectionProvider.from_url(value)
    raise ConfigurationError(
        "connection_provider takes a database URL, an AsyncEngine or a ConnectionProvider, "
        f"got {type(value).__name__}"
    )


# MySQL 8+ and MariaDB 10.6+ over asyncmy, an optional extra. "mysql5" (MySQL before 8, no
# SKIP LOCKED) has no URL scheme: a URL cannot tell the server version, so it is reachable only
# through the override customize_scheduler(lambda b: b.dialect("mysql5")).
_MYSQL_CONNECT_ARGS = {"connect_timeout": 5}
register_dialect(
    "mysql",
    MySQLRepository,
    {"mysql": "mysql+asyncmy", "mysql+asyncmy": "mysql+asyncmy"},
    connect_args=_MYSQL_CONNECT_ARGS,
    extra="mysql",
)
register_dialect(
    "mariadb",
    MariaDBRepository,
    {"mariadb": "mariadb+asyncmy", "mariadb+asyncmy": "mariadb+asyncmy"},
    connect_args=_MYSQL_CONNECT_ARGS,
    extra="mysql",
)
register_dialect("mysql5", MySQL5Repository, {}, connect_args=_MYSQL_CONNECT_ARGS, extra="mysql")
