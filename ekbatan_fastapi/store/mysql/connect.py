"""How the library's own MySQL/MariaDB pool bounds its sessions.

A claim on MySQL/MariaDB is a transaction of several round trips. When a partition swallows
the answer to its ``SELECT ... FOR UPDATE SKIP LOCKED``, the client gives up on the connection
but the server keeps the session and its open transaction, whose row locks cover the due rows:
the peers' claims, heartbeats and completions wait on them until the server drops the session
(``wait_timeout``, 8 hours by default). Every connection of the library's own pool therefore
starts with

* ``innodb_lock_wait_timeout``: a statement waits at most this long for a row lock (then it
  fails and its loop retries) instead of InnoDB's 50 s;
* on MariaDB 10.3+, ``idle_transaction_timeout``: the server ends a session whose transaction
  has been idle this long (an orphan; the library's own transactions are never idle for more
  than a round trip), which releases its locks. MySQL 8 has no such setting (the statement
  carries it in a MariaDB-only executable comment, which MySQL ignores): there, give the jobs
  user a short ``wait_timeout`` (docs/deployment.md).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..options import PoolOptions, PoolSetup

__all__ = ["pool_setup", "session_bounds"]


def session_bounds(seconds: float) -> str:
    """The statement every connection of the library's pool runs first."""
    n = max(1, math.ceil(seconds))
    return (
        f"SET SESSION innodb_lock_wait_timeout = {n} /*M!100300 , idle_transaction_timeout = {n} */"
    )


def pool_setup(url: URL, connect_args: dict[str, Any], options: PoolOptions) -> PoolSetup:
    setup = PoolSetup(url, dict(connect_args))
    seconds = options.idle_transaction_timeout
    if seconds is None or seconds <= 0:
        return setup
    statement = session_bounds(seconds)

    def on_engine(engine: AsyncEngine) -> None:
        # After the driver's own init_command (a URL's time zone, say): a pool event.
        @event.listens_for(engine.sync_engine, "connect")
        def bound_session(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(statement)
            finally:
                cursor.close()

    setup.on_engine = on_engine
    return setup
