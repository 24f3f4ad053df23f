"""How the library builds its own pool from a URL: the deployment's connection pooler and the
session bounds it sets on its connections (``PoolOptions``), and what a dialect makes of them
(``PoolSetup``: the URL, the driver's connect arguments, a hook on the new engine)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..domain.errors import ConfigurationError

__all__ = [
    "DEFAULT_IDLE_TRANSACTION_TIMEOUT",
    "POOLERS",
    "TRANSACTION_POOLING",
    "PoolOptions",
    "PoolSetup",
    "validate_pooler",
]

TRANSACTION_POOLING = "pgbouncer-transaction"
POOLERS = ("none", "pgbouncer-session", TRANSACTION_POOLING)
"""``none``: a direct connection (or a proxy that keeps one server connection per client, as
PgBouncer's session mode does: nothing to change). ``pgbouncer-transaction``: server
connections are shared between clients from one transaction to the next."""

DEFAULT_IDLE_TRANSACTION_TIMEOUT = 10.0
"""Seconds (MySQL/MariaDB): the library's sessions wait at most this long for a row lock, and
on MariaDB a transaction of theirs left idle this long (orphaned by a partition) is ended by
the server, so its row locks cannot stall the cluster."""


def validate_pooler(value: Any) -> str:
    """The pooler setting, checked: ``none`` (also for None), ``pgbouncer-session`` or
    ``pgbouncer-transaction``."""
    if value is None:
        return "none"
    if isinstance(value, str) and value.strip().lower() in POOLERS:
        return value.strip().lower()
    hint = (
        "; PgBouncer's statement mode cannot run the library's transactions: use transaction mode"
        if isinstance(value, str) and "statement" in value.lower()
        else ""
    )
    raise ConfigurationError(f"pooler {value!r} is unknown; use one of {', '.join(POOLERS)}{hint}")


@dataclass(frozen=True)
class PoolOptions:
    """What the deployment asks of the library's own pool."""

    pooler: str = "none"
    idle_transaction_timeout: float | None = DEFAULT_IDLE_TRANSACTION_TIMEOUT
    """Seconds; None: leave the server's session settings alone (MySQL/MariaDB)."""

    @property
    def transaction_pooling(self) -> bool:
        return self.pooler == TRANSACTION_POOLING


@dataclass
class PoolSetup:
    """A dialect's answer: the URL to give SQLAlchemy, the driver's connect arguments, and
    a hook run on the new engine (pool events)."""

    url: URL
    connect_args: dict[str, Any] = field(default_factory=dict)
    on_engine: Callable[[AsyncEngine], None] | None = None
