"""Cluster-wide locks by name: PostgreSQL's transaction-scoped advisory locks
(``pg_try_advisory_xact_lock``, keyed by a stable 64-bit hash of the name) and MySQL/MariaDB's
named locks (``GET_LOCK`` / ``RELEASE_LOCK``, bound to the connection and released in
``finally``).

A lock belongs to one database, as PostgreSQL's advisory locks do: MySQL/MariaDB's lock names
are the server's, so the name carries the connection's database, and two applications on one
server (each in its own database) never hold each other's locks.

``try_cluster_lock`` is the advisory-lock approach to HA scheduled work, for code that is not a
job; the scheduler uses the same locks to count a job's running executions against its
``max_concurrency`` without two instances counting at once.

On a MariaDB Galera cluster (``wsrep_on``) ``GET_LOCK`` is held on one node only: two callers
connected to two nodes both get the same lock (measured on a 3-node galera-4 cluster). Both
uses refuse to run there (``GaleraLocksUnsupported``) rather than let two holders believe they
are alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..domain.errors import ConfigurationError

__all__ = [
    "GaleraLocksUnsupported",
    "is_galera",
    "lock_key",
    "lock_name",
    "lock_scope",
    "take_locks",
    "try_cluster_lock",
    "try_lock_per_node",
]

_MYSQL_NAME_LIMIT = 64
_TRY = {
    "postgresql": "SELECT pg_try_advisory_xact_lock(:key)",
    "mysql": "SELECT GET_LOCK(:name, 0)",
}
_WAIT = {
    "postgresql": "SELECT pg_advisory_xact_lock(:key)",
    "mysql": "SELECT GET_LOCK(:name, :seconds)",
}
_RELEASE = "SELECT RELEASE_LOCK(:name)"
_WSREP = "SHOW VARIABLES LIKE 'wsrep_on'"
"""Empty on MySQL, ``OFF`` on a MariaDB server outside a Galera cluster."""

_GALERA: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Per engine (its sync engine): whether its server is a Galera node (asked once)."""


class GaleraLocksUnsupported(ConfigurationError):
    """A feature built on ``GET_LOCK`` was used on a MariaDB Galera cluster, where that lock
    is held per node, not cluster-wide."""


async def is_galera(conn: AsyncConnection) -> bool:
    """Whether ``conn``'s server is a node of a MariaDB Galera cluster (``wsrep_on = ON``);
    asked once per engine. Never on PostgreSQL."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return False
    engine = conn.sync_engine.engine
    known = _GALERA.get(engine)
    if known is None:
        row = (await conn.execute(text(_WSREP))).first()
        known = row is not None and str(row[1]).upper() == "ON"
        _GALERA[engine] = known
    return known


async def refuse_on_galera(conn: AsyncConnection, what: str, fix: str) -> None:
    """``GaleraLocksUnsupported`` when ``conn`` is on a Galera node: ``what`` relies on
    ``GET_LOCK``."""
    if await is_galera(conn):
        raise GaleraLocksUnsupported(
            f"{what} needs a cluster-wide lock, and on a MariaDB Galera cluster (wsrep_on = ON) "
            "MariaDB's GET_LOCK holds on one node only: schedulers connected to two nodes would "
            f"both hold it. {fix}"
        )


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for ``name`` (PostgreSQL's advisory lock space)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_name(name: str, database: str | None = None) -> str:
    """``name`` as a MySQL/MariaDB lock name in ``database`` (the server's lock names are not
    per database; at most 64 characters: longer ones hashed)."""
    scoped = name if database is None else f"{database}/{name}"
    full = f"ekbatan:{scoped}"
    if len(full) <= _MYSQL_NAME_LIMIT:
        return full
    return "ekbatan:" + hashlib.blake2b(scoped.encode("utf-8"), digest_size=16).hexdigest()


def lock_scope(conn: AsyncConnection) -> str | None:
    """The database a MySQL/MariaDB lock name carries: the one the connection's URL names
    (None: the server's default, unscoped)."""
    return conn.engine.url.database or None


def _family(conn: AsyncConnection) -> str:
    backend = conn.dialect.name
    if backend == "postgresql":
        return "postgresql"
    if backend in ("mysql", "mariadb"):
        return "mysql"
    raise ConfigurationError(f"cluster locks need PostgreSQL or MySQL/MariaDB, got {backend!r}")


async def take_locks(conn: AsyncConnection, names: Sequence[str], *, seconds: float) -> list[str]:
    """Take the named locks (in sorted order, so that two takers never deadlock), waiting
    up to ``seconds`` for each. PostgreSQL's end with the transaction; the MySQL names
    returned must be released with ``release_locks``. Raises ``TimeoutError`` when one could
    not be taken in time (MySQL; PostgreSQL is bounded by the statement timeout)."""
    family = _family(conn)
    database = lock_scope(conn)
    taken: list[str] = []
    for name in sorted(set(names)):
        if family == "postgresql":
            await conn.execute(text(_WAIT["postgresql"]), {"key": lock_key(name)})
            continue
        mysql_name = lock_name(name, database)
        got = (
            await conn.execute(text(_WAIT["mysql"]), {"name": mysql_name, "seconds": seconds})
        ).scalar_one()
        if got != 1:
            await release_locks(conn, taken)
            raise TimeoutError(f"the cluster lock {name!r} was held for over {seconds:g}s")
        taken.append(mysql_name)
    if taken:  # asked after the locks, which keeps a race between takers as tight as before
        try:
            await refuse_on_galera(
                conn,
                "max_concurrency",
                "Remove max_concurrency from the jobs (or their settings' overrides), or keep "
                "them on PostgreSQL or a MariaDB server outside Galera.",
            )
        except GaleraLocksUnsupported:
            await release_locks(conn, taken)
            raise
    return taken


async def release_locks(conn: AsyncConnection, names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            await conn.execute(text(_RELEASE), {"name": name})


def try_cluster_lock(
    target: AsyncEngine | AsyncConnection, name: str
) -> contextlib.AbstractAsyncContextManager[bool]:
    """Try to take the cluster-wide lock ``name`` without waiting; yields whether this caller
    holds it for the block. Exactly one of several racing callers gets it.

    With an ``AsyncEngine`` a connection is opened and, on PostgreSQL, a transaction holds
    the lock (``pg_try_advisory_xact_lock``) until the block ends. With your own
    ``AsyncConnection``: on PostgreSQL the lock lives until *your* transaction ends (one is
    begun if none is active, and committed at the end of the block); on MySQL/MariaDB
    ``GET_LOCK`` is released at the end of the block (``RELEASE_LOCK``, in ``finally``).
    The lock is the database's: callers connected to another database on the same server
    take another lock. On a MariaDB Galera node it raises ``GaleraLocksUnsupported``
    (``GET_LOCK`` holds on one node only there).
    """
    return _try_lock(target, name, galera=False)


def try_lock_per_node(
    target: AsyncEngine | AsyncConnection, name: str
) -> contextlib.AbstractAsyncContextManager[bool]:
    """``try_cluster_lock`` for work that is safe when two Galera nodes both hold the lock
    (idempotent housekeeping led by one instance anyway): on a Galera node it takes that
    node's ``GET_LOCK`` instead of refusing."""
    return _try_lock(target, name, galera=True)


@contextlib.asynccontextmanager
async def _try_lock(
    target: AsyncEngine | AsyncConnection, name: str, *, galera: bool
) -> AsyncIterator[bool]:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"try_cluster_lock needs a non-empty lock name, got {name!r}")
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(target, AsyncEngine):
            conn = await stack.enter_async_context(target.connect())
        elif isinstance(target, AsyncConnection):
            conn = target
        else:
            raise ConfigurationError(
                "try_cluster_lock takes an AsyncEngine or an AsyncConnection, got "
                f"{type(target).__name__}"
            )
        family = _family(conn)
        if family == "postgresql":
            began = not conn.in_transaction()
            if began:
                await conn.begin()
            acquired = bool(
                (await conn.execute(text(_TRY["postgresql"]), {"key": lock_key(name)})).scalar()
            )
            try:
                yield acquired
            finally:
                if began:
                    await conn.commit()
            return
        mysql_name = lock_name(name, lock_scope(conn))
        acquired = (await conn.execute(text(_TRY["mysql"]), {"name": mysql_name})).scalar() == 1
        try:
            if not galera:  # asked after GET_LOCK: racing takers stay as close as before
                await refuse_on_galera(
                    conn,
                    f"try_cluster_lock({name!r})",
                    "Use a job (the scheduler's claims hold cluster-wide on Galera) or PostgreSQL.",
                )
            yield acquired
        finally:
            if acquired:
                await release_locks(conn, [mysql_name])
