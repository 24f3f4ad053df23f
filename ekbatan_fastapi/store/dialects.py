"""The dialects the store speaks, and ``Store``: one database's task and operations stores.

A dialect is a ``Dialect`` value: its ``Database`` (how statements are sent), its
``TaskStore`` (the hot path), the URL schemes that select it, the connect arguments of pools
built from a URL, and the pip extra that installs its driver. A new dialect is one
``register_dialect(Dialect(...))`` call and one folder under ``store/`` (see
docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..domain.errors import ConfigurationError
from .cancels import CancelStore
from .database import DEFAULT_STATEMENT_TIMEOUT, Database
from .jobs import JobsStore
from .mysql import connect as mysql_connect
from .mysql.database import MariaDBDatabase, MySQL5Database, MySQLDatabase
from .mysql.mysql5 import MySQL5TaskStore
from .mysql.tasks import MySQLTaskStore
from .operations import OperationsStore
from .options import PoolOptions, PoolSetup
from .postgresql import connect as postgresql_connect
from .postgresql.database import PostgresDatabase
from .postgresql.tasks import PostgresTaskStore
from .tables import DEFAULT_TABLE_NAME, Tables
from .tasks import TaskStore
from .traces import TraceStore

__all__ = ["DIALECTS", "Dialect", "Store", "dialect", "open_store", "register_dialect"]


@dataclass(frozen=True)
class Dialect:
    """Everything the library needs to know to speak one kind of database."""

    name: str
    database: type[Database]
    tasks: type[TaskStore]
    schemes: Mapping[str, str] = field(default_factory=dict)
    """URL scheme -> the async driver URL to use; none for a dialect reachable only through
    ``b.dialect(...)`` (a URL cannot tell a server's version)."""
    connect_args: Mapping[str, Any] = field(default_factory=dict)
    """Of the pools built from a URL: a bounded connect, never a hang."""
    extra: str | None = None
    """The pip extra that installs the driver."""
    pool_setup: Callable[[URL, dict[str, Any], PoolOptions], PoolSetup] | None = None
    """How a pool built from a URL connects (per-host timeouts, session bounds, a pooler);
    None: the URL and ``connect_args`` as they are."""
    poolers: tuple[str, ...] = ("none",)
    """The ``pooler`` values this dialect can work behind."""

    @property
    def migrations_folder(self) -> str:
        return self.database.migrations_folder


DIALECTS: dict[str, Dialect] = {}


def register_dialect(value: Dialect) -> None:
    """Make a dialect known (its URL schemes included). Nothing is imported here: the driver
    is imported when an engine is created."""
    DIALECTS[value.name] = value


def dialect(name: str | Dialect) -> Dialect:
    """The registered dialect ``name`` (a ``Dialect`` is returned as it is)."""
    if isinstance(name, Dialect):
        return name
    try:
        return DIALECTS[name]
    except (KeyError, TypeError):
        raise ConfigurationError(
            f"dialect {name!r} is not supported; use one of {', '.join(sorted(DIALECTS))}"
        ) from None


@dataclass(frozen=True)
class Store:
    """One jobs database: its ``Database`` and the stores of its tables."""

    dialect: Dialect
    db: Database
    tasks: TaskStore
    operations: OperationsStore
    jobs: JobsStore
    traces: TraceStore = field(default=None)  # type: ignore[assignment]
    """The trace contexts of scheduled one-time tasks (built from ``db`` when not given)."""
    cancels: CancelStore = field(default=None)  # type: ignore[assignment]
    """Requests to stop running executions (built from ``db`` when not given)."""

    def __post_init__(self) -> None:
        if self.traces is None:
            object.__setattr__(self, "traces", TraceStore(self.db))
        if self.cancels is None:
            object.__setattr__(self, "cancels", CancelStore(self.db))

    @property
    def tables(self) -> Tables:
        return self.db.tables


def open_store(
    engine: AsyncEngine,
    name: str | Dialect,
    table_name: str = DEFAULT_TABLE_NAME,
    *,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
) -> Store:
    """The stores of ``table_name`` (and our tables beside it) on ``engine``; opens nothing."""
    spec = dialect(name)
    db = spec.database(engine, Tables(table_name), statement_timeout=statement_timeout)
    return Store(spec, db, spec.tasks(db), OperationsStore(db), JobsStore(db))


register_dialect(
    Dialect(
        "postgresql",
        PostgresDatabase,
        PostgresTaskStore,
        schemes={
            "postgresql": "postgresql+asyncpg",
            "postgres": "postgresql+asyncpg",
            "postgresql+asyncpg": "postgresql+asyncpg",
        },
        pool_setup=postgresql_connect.pool_setup,
        poolers=("none", "pgbouncer-session", "pgbouncer-transaction"),
    )
)
# MySQL 8+ and MariaDB 10.6+ over asyncmy, an optional extra. "mysql5" (MySQL before 8, no
# SKIP LOCKED) has no URL scheme: a URL cannot tell the server version, so it is reachable only
# through the override customize_scheduler(lambda b: b.dialect("mysql5")).
_MYSQL_CONNECT_ARGS = {"connect_timeout": 5}
register_dialect(
    Dialect(
        "mysql",
        MySQLDatabase,
        MySQLTaskStore,
        schemes={"mysql": "mysql+asyncmy", "mysql+asyncmy": "mysql+asyncmy"},
        connect_args=_MYSQL_CONNECT_ARGS,
        extra="mysql",
        pool_setup=mysql_connect.pool_setup,
    )
)
register_dialect(
    Dialect(
        "mariadb",
        MariaDBDatabase,
        MySQLTaskStore,
        schemes={"mariadb": "mariadb+asyncmy", "mariadb+asyncmy": "mariadb+asyncmy"},
        connect_args=_MYSQL_CONNECT_ARGS,
        extra="mysql",
        pool_setup=mysql_connect.pool_setup,
    )
)
register_dialect(
    Dialect(
        "mysql5",
        MySQL5Database,
        MySQL5TaskStore,
        connect_args=_MYSQL_CONNECT_ARGS,
        extra="mysql",
        pool_setup=mysql_connect.pool_setup,
    )
)
