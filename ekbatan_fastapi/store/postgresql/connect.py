"""How the library's own PostgreSQL pool connects (asyncpg).

* **A connect timeout per host.** asyncpg spends ``timeout`` as one budget over all the hosts
  of a multi-host URL (``?host=A&host=B&target_session_attrs=read-write``): a first host that
  accepts TCP and never answers (a frozen primary) uses all of it, and the second host is never
  tried. ``HostConnector`` tries each host with its own timeout, as libpq does, tries the
  host that last worked first and a host whose last attempt failed last, so that after a
  failover only the first new connection pays for the dead host.
* **URL query values asyncpg wants as numbers** (``?statement_cache_size=0``,
  ``?command_timeout=10``) arrive from the URL as strings; they are converted here.
* **PgBouncer in transaction mode** (``pooler="pgbouncer-transaction"``): consecutive
  transactions of one client run on different server connections, so no prepared statement may
  outlive its statement. asyncpg then uses unnamed statements (``statement_cache_size=0``) and
  SQLAlchemy's own prepared statements are unnamed and uncached as well. asyncpg sends
  Parse/Describe/Flush and then Bind/Execute/Sync, so an unnamed statement stays on one server
  connection (verified against PgBouncer 1.18: ``tests/test_deployments.py``).
* **The array codecs, warmed at connect.** asyncpg knows the codecs of the scalar types but
  looks up some array types (``bigint[]``, ``bytea[]``, ``timestamptz[]``, ``smallint[]``,
  the parameters of the heartbeat, the completion and scheduling) on their first use on each
  connection: it turns JIT off for the session, runs its introspection query, and turns JIT
  back on, in three statements outside any transaction. Through PgBouncer's transaction
  pooling those three run on whichever server connections are free, so the introspection
  query often ran where JIT was on, and the server compiled it: 5-7 s on a loaded 2-core
  machine (0.1 s without JIT), holding one of the few server connections, with the first
  heartbeat of a new connection waiting behind it (a chaos run lost slots to it). Each new
  connection of the library's pool now looks the array types up at once, inside one
  transaction (one server connection throughout), before the pool hands it out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ...domain.errors import ConfigurationError
from ..options import PoolOptions, PoolSetup

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "WARMED_ARRAY_TYPES",
    "ConnectFailed",
    "HostConnector",
    "pool_setup",
    "warm_codecs",
]

DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds per host to open a connection (and authenticate)."""

_NUMERIC_QUERY: dict[str, type[int] | type[float]] = {
    "timeout": float,
    "command_timeout": float,
    "statement_cache_size": int,
    "max_cached_statement_lifetime": float,
    "max_cacheable_statement_size": int,
    "prepared_statement_cache_size": int,
}
"""asyncpg's (and SQLAlchemy's) connect arguments that must be numbers."""

_ANY_HOST_ATTRS = (None, "any", "primary", "read-write")
"""``target_session_attrs`` values for which the first acceptable host, in any order, will
do; the others (``prefer-standby``, ...) are left to asyncpg's own host loop."""


WARMED_ARRAY_TYPES = (
    "text[]",
    "bigint[]",
    "integer[]",
    "smallint[]",
    "bytea[]",
    "timestamptz[]",
    "boolean[]",
    "interval[]",
)
"""The array types of the library's statements, looked up by ``warm_codecs``."""

_WARM = "SELECT " + ", ".join(f"CAST(NULL AS {t})" for t in WARMED_ARRAY_TYPES)


async def warm_codecs(conn: Any, timeout: float) -> None:
    """Have asyncpg look up the codecs of ``WARMED_ARRAY_TYPES`` on ``conn`` now, inside a
    transaction: its introspection (JIT off, the query, JIT back) then stays on one server
    connection behind a transaction-pooling PgBouncer (see the module's doc)."""
    async with conn.transaction():
        await conn.fetchrow(_WARM, timeout=timeout)


def _warm_each_connection(timeout: float) -> Callable[[AsyncEngine], None]:
    """The engine hook: ``warm_codecs`` on each new connection, after SQLAlchemy's own
    set-up (its JSON codecs: asyncpg's ``set_type_codec`` empties the type cache)."""

    def on_engine(engine: AsyncEngine) -> None:
        def warm(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.run_async(lambda conn: warm_codecs(conn, timeout))

        event.listen(engine.sync_engine, "connect", warm)

    return on_engine


class ConnectFailed(ConnectionError):
    """No host of the URL gave a usable connection; the message says why, host by host."""


def _unnamed() -> str:
    """SQLAlchemy's name for its prepared statements: the unnamed statement."""
    return ""


def _pairs(hosts: Any, ports: Any) -> list[tuple[str, int | None]]:
    if not isinstance(hosts, list | tuple):
        return []
    port_list: Sequence[Any] = ports if isinstance(ports, list | tuple) else [ports] * len(hosts)
    return [
        (str(h), int(p) if p is not None else None) for h, p in zip(hosts, port_list, strict=False)
    ]


class HostConnector:
    """``asyncpg.connect`` with a connect timeout per host (SQLAlchemy's ``async_creator_fn``)."""

    def __init__(self) -> None:
        self.preferred: tuple[str, int | None] | None = None
        """The host that gave the last connection: tried first."""
        self.failed: set[tuple[str, int | None]] = set()
        """Hosts whose last attempt failed: tried last, until one gives a connection again
        (after a failover the old primary, frozen or gone, costs one connect timeout, not
        one per new connection)."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import asyncpg  # type: ignore[import-untyped]

        timeout = float(kwargs.pop("timeout", DEFAULT_CONNECT_TIMEOUT))
        pairs = _pairs(kwargs.get("host"), kwargs.get("port"))
        attrs = kwargs.get("target_session_attrs")
        if len(pairs) < 2 or attrs not in _ANY_HOST_ATTRS:
            try:
                return await asyncpg.connect(*args, timeout=timeout, **kwargs)
            except TimeoutError:
                where = _where(kwargs.get("host"), kwargs.get("port"))
                raise ConnectFailed(
                    f"no answer from {where} within {timeout:g}s while connecting (connect timeout)"
                ) from None
        kwargs.pop("host")
        kwargs.pop("port", None)
        order = sorted(pairs, key=lambda pair: (pair in self.failed, pair != self.preferred))
        failures: list[str] = []
        for host, port in order:
            try:
                conn = await asyncpg.connect(*args, host=host, port=port, timeout=timeout, **kwargs)
            except asyncio.CancelledError:
                # A caller's own bound (statement_timeout) ended the attempt on this host: the
                # next attempt tries the other hosts first, or it would end the same way.
                self.failed.add((host, port))
                raise
            except TimeoutError:
                self.failed.add((host, port))
                failures.append(
                    f"{_where(host, port)}: no answer within {timeout:g}s (connect timeout)"
                )
            except Exception as error:
                self.failed.add((host, port))
                failures.append(f"{_where(host, port)}: {type(error).__name__}: {error}")
            else:
                self.preferred = (host, port)
                self.failed.discard((host, port))
                return conn
        raise ConnectFailed(
            f"no host of the URL gave a connection ({'; '.join(failures)})"
            + (f"; target_session_attrs={attrs}" if attrs else "")
        )


def _where(host: Any, port: Any) -> str:
    return f"{host}:{port}" if port is not None else str(host)


def _numeric_query(url: URL) -> tuple[URL, dict[str, Any]]:
    """Move the numeric asyncpg arguments of the URL's query into connect arguments, as
    numbers; a value that is not one is a ConfigurationError naming it."""
    moved: dict[str, Any] = {}
    for key, kind in _NUMERIC_QUERY.items():
        if key not in url.query:
            continue
        raw = url.query[key]
        text = raw[-1] if isinstance(raw, tuple) else raw
        try:
            moved[key] = kind(text)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"the URL parameter {key}={text!r} must be a number (e.g. {key}=0)"
            ) from None
    return url.difference_update_query(list(moved)), moved


def pool_setup(url: URL, connect_args: dict[str, Any], options: PoolOptions) -> PoolSetup:
    """The library's own pool on ``url``: numeric query values converted, a connect timeout
    per host, and (transaction pooling) no prepared statement that outlives its statement."""
    url, from_query = _numeric_query(url)
    args: dict[str, Any] = {"timeout": DEFAULT_CONNECT_TIMEOUT, **connect_args, **from_query}
    if options.transaction_pooling:
        for key in ("statement_cache_size", "prepared_statement_cache_size"):
            if args.get(key, 0) != 0:
                raise ConfigurationError(
                    f"{key}={args[key]} contradicts pooler={options.pooler}: server connections "
                    f"are shared between transactions there; drop {key} (the pooler setting "
                    "sets it to 0)"
                )
        args.update(
            statement_cache_size=0,
            prepared_statement_cache_size=0,
            prepared_statement_name_func=_unnamed,
        )
    args.setdefault("async_creator_fn", HostConnector())
    return PoolSetup(url, args, on_engine=_warm_each_connection(float(args["timeout"])))
