"""Liveness locks: each scheduler instance holds a session-level lock named after itself on a
dedicated connection; the database releases it the instant that session ends (the process
died, its host was lost). A peer that finds a row picked by an instance whose lock is free can
revive it without waiting for the dead window (``engine/liveness.py`` decides when).

The lock of an instance is derived from the table and the instance name (``picked_by``):

* PostgreSQL: ``pg_try_advisory_lock(NAMESPACE, key)``, the two-int form, ``key`` the first 31
  bits of ``md5(<schema>.<table>|<name>)``; a peer reads ``pg_locks`` (nothing is taken). Other
  applications' advisory locks use the one-bigint form (``objsubid`` 1) or another namespace.
* MySQL/MariaDB: ``GET_LOCK('ekbatan_live_<sha1(<database>|<schema>.<table>|<name>)>', 0)``; a
  peer asks ``IS_USED_LOCK``. Lock names are server-wide, hence the database in the name.

An instance declares that it holds such a lock in its row of ``ekbatan_scheduler_instances``
(``library_version`` ends with ``LIVENESS_MARK``): instances that take none (db-scheduler on
the JVM, an older Ekbatan, ``liveness_lock: off``) are never judged by a lock.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, select, text, update
from sqlalchemy.util import greenlet_spawn

from .database import Database, aware
from .mysql.database import MySQLDatabase
from .postgresql.database import PostgresDatabase

__all__ = [
    "LIVENESS_MARK",
    "NAMESPACE",
    "Held",
    "LivenessLocks",
    "MySQLLiveness",
    "PostgresLiveness",
    "liveness_locks",
]

NAMESPACE = 0x454B4C56
"""The first key of the PostgreSQL two-int advisory locks (``EKLV``)."""
LIVENESS_MARK = " (liveness lock)"
"""Appended to ``library_version`` in the instance row of an instance that holds its lock."""
_LOOK_LIMIT = 1000
"""Picked rows one look reads at most (the oldest heartbeats first)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A row picked by another instance, as a look found it."""

    task_name: str
    task_instance: str
    version: int
    last_heartbeat: Any
    """As the driver returned it: written back unchanged in the revival's guard."""
    picked_by: str
    execution_time: datetime | None


class LivenessLocks(abc.ABC):
    """One table's liveness locks: this instance's own (``take``) and the peers' (``look``)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        tasks = db.tables.tasks
        self.salt = f"{tasks.schema or ''}.{tasks.name}|"
        self._driver: Any = None
        self._name: str | None = None
        self._holding = False

    # -- this instance's lock --------------------------------------------------------------

    async def take(self, name: str) -> bool:
        """Open a dedicated connection (made as the pool makes its connections, outside the
        pool: it never counts against ``pool_size``) and try to take ``name``'s lock on it:
        True when held; False when another session holds it (the same scheduler name twice),
        the connection closed again. Raises when the database cannot be reached."""
        await self.close()
        creator = self.db.engine.sync_engine.pool._creator
        try:
            async with asyncio.timeout(self.db.statement_timeout):
                dbapi = await greenlet_spawn(creator)
        except TimeoutError:
            raise self.db.timeout_error(connecting=True) from None
        driver = dbapi.driver_connection
        try:
            async with asyncio.timeout(self.db.statement_timeout):
                taken = await self._take(driver, name)
        except BaseException:
            _terminate(driver)
            raise
        self._driver = driver
        self._name = name
        self._holding = taken
        return taken

    async def wait(self, seconds: float) -> bool:
        """After ``take`` found the lock held by another session: wait up to ``seconds`` for
        it on the same connection (True: held now). A session of this instance's that the
        server has not seen end yet (its connection lost on the way) holds it until then:
        waiting takes it the instant it is free, where retrying would leave a gap."""
        if self._driver is None or self._name is None:
            raise ConnectionError("no liveness lock connection to wait on")
        if self._holding:
            return True
        try:
            self._holding = await self._wait(self._driver, self._name, seconds)
        except BaseException:
            await self.close()
            raise
        return self._holding

    @abc.abstractmethod
    async def _wait(self, driver: Any, name: str, seconds: float) -> bool: ...

    @abc.abstractmethod
    async def _take(self, driver: Any, name: str) -> bool: ...

    async def wait_lost(self) -> None:
        """Return when the lock's connection is lost (the lock with it)."""
        if self._driver is None:
            return
        await self._lost(self._driver)

    @abc.abstractmethod
    async def _lost(self, driver: Any) -> None: ...

    async def close(self) -> None:
        """Close the lock's connection (the lock goes with the session)."""
        driver, self._driver, self._holding = self._driver, None, False
        if driver is not None:
            _terminate(driver)

    @property
    def holding(self) -> bool:
        return self._driver is not None and self._holding

    # -- the peers' locks ------------------------------------------------------------------

    async def look(self, me: str) -> list[Held]:
        """Rows picked by instances other than ``me`` (the oldest heartbeats first)."""
        t = self.db.tables.tasks
        stmt = (
            select(
                t.c.task_name,
                t.c.task_instance,
                t.c.version,
                t.c.last_heartbeat,
                t.c.picked_by,
                t.c.execution_time,
            )
            .where(
                t.c.last_heartbeat.is_not(None),
                t.c.picked.is_(True),
                t.c.picked_by.is_not(None),
                t.c.picked_by != me,
            )
            .order_by(t.c.last_heartbeat)
            .limit(_LOOK_LIMIT)
        )
        return [
            Held(r[0], r[1], int(r[2]), r[3], r[4], aware(r[5])) for r in await self.db.rows(stmt)
        ]

    async def declared(self, owners: Sequence[str]) -> set[str]:
        """Which of ``owners`` declare a liveness lock in their instance row."""
        if not owners:
            return set()
        i = self.db.tables.instances
        stmt = select(i.c.name, i.c.library_version).where(i.c.name.in_(sorted(set(owners))))
        return {r[0] for r in await self.db.rows(stmt) if str(r[1]).endswith(LIVENESS_MARK)}

    async def free(self, owners: Sequence[str]) -> set[str]:
        """Which of ``owners``' locks no session holds now."""
        if not owners:
            return set()
        return await self._free(sorted(set(owners)))

    @abc.abstractmethod
    async def _free(self, owners: list[str]) -> set[str]: ...

    async def revive(self, rows: Sequence[Held]) -> list[Held]:
        """Unpick each row if it is still as the look found it (same version, owner and
        heartbeat), bumping ``version`` as a dead-execution revival does; the rows revived.
        One transaction for them all, in key order (one commit: on a server whose every commit
        waits for an fsync, a dead owner's three rows are revived in one wait, not three; two
        peers reviving the same rows lock them in the same order)."""
        t = self.db.tables.tasks
        revived: list[Held] = []
        ordered = sorted(rows, key=lambda r: (r.task_name, r.task_instance))
        async with self.db.connect(begin=True) as conn:
            for row in ordered:
                stmt = (
                    update(t)
                    .where(
                        and_(
                            t.c.task_name == row.task_name,
                            t.c.task_instance == row.task_instance,
                            t.c.version == row.version,
                            t.c.picked.is_(True),
                            t.c.picked_by == row.picked_by,
                            t.c.last_heartbeat == row.last_heartbeat,
                        )
                    )
                    .values(
                        picked=False, picked_by=None, last_heartbeat=None, version=t.c.version + 1
                    )
                )
                if (await conn.execute(stmt)).rowcount:
                    revived.append(row)
        return revived

    async def unsupported(self) -> str | None:
        """Why this database cannot judge instances by their locks (None: it can)."""
        return None


def _terminate(driver: Any) -> None:
    """Close a driver connection at once (no polite goodbye a dead server would not answer):
    the server ends the session, and its locks with it."""
    close = getattr(driver, "terminate", None) or getattr(driver, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _pg_key(salt: str, name: str) -> int:
    return int(hashlib.md5((salt + name).encode(), usedforsecurity=False).hexdigest()[:8], 16) & (
        0x7FFFFFFF
    )


class PostgresLiveness(LivenessLocks):
    """``pg_try_advisory_lock(NAMESPACE, key)`` on the instance's connection."""

    def key(self, name: str) -> int:
        return _pg_key(self.salt, name)

    async def _take(self, driver: Any, name: str) -> bool:
        if await driver.fetchval("SELECT pg_is_in_recovery()"):
            raise ConnectionError("the liveness lock's connection reached a standby")
        with contextlib.suppress(Exception):  # PostgreSQL 14+: never end an idle lock session
            await driver.execute("SET idle_session_timeout = 0")
        return bool(
            await driver.fetchval("SELECT pg_try_advisory_lock($1, $2)", NAMESPACE, self.key(name))
        )

    async def _wait(self, driver: Any, name: str, seconds: float) -> bool:
        await driver.execute(f"SET lock_timeout = '{int(seconds * 1000)}ms'")
        try:
            await driver.execute("SELECT pg_advisory_lock($1, $2)", NAMESPACE, self.key(name))
        except Exception as error:
            if getattr(error, "sqlstate", None) == "55P03":  # lock_not_available
                return False
            raise
        return True

    async def _lost(self, driver: Any) -> None:
        lost = asyncio.Event()
        driver.add_termination_listener(lambda _c: lost.set())
        if driver.is_closed():
            return
        await lost.wait()

    async def _free(self, owners: list[str]) -> set[str]:
        keys = {self.key(o): o for o in owners}
        stmt = text(
            "SELECT CAST(l.objid AS bigint) FROM pg_locks AS l "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND CAST(l.classid AS bigint) = :ns "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        held = {int(r[0]) for r in await self.db.rows(stmt, {"ns": NAMESPACE})}
        return {owner for key, owner in keys.items() if key not in held}


class MySQLLiveness(LivenessLocks):
    """``GET_LOCK`` on the instance's connection, ``IS_USED_LOCK`` for the peers."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._database: str | None = None

    def lock_name(self, database: str, name: str) -> str:
        digest = hashlib.sha1(
            f"{database}|{self.salt}{name}".encode(), usedforsecurity=False
        ).hexdigest()
        return f"ekbatan_live_{digest}"

    async def _database_name(self) -> str:
        if self._database is None:
            rows = await self.db.rows(text("SELECT DATABASE()"))
            self._database = str(rows[0][0] or "")
        return self._database

    async def _take(self, driver: Any, name: str) -> bool:
        async with driver.cursor() as cursor:
            await cursor.execute("SELECT DATABASE()")
            self._database = str((await cursor.fetchone())[0] or "")
            # the lock's session is never idle-ended by the server (8 h by default)
            await cursor.execute("SET SESSION wait_timeout = 31536000")
            await cursor.execute("SELECT GET_LOCK(%s, 0)", (self.lock_name(self._database, name),))
            row = await cursor.fetchone()
        return bool(row and row[0] == 1)

    async def _wait(self, driver: Any, name: str, seconds: float) -> bool:
        async with driver.cursor() as cursor:
            lock = self.lock_name(self._database or "", name)
            await cursor.execute("SELECT GET_LOCK(%s, %s)", (lock, max(1, int(seconds))))
            row = await cursor.fetchone()
        return bool(row and row[0] == 1)

    async def _lost(self, driver: Any) -> None:
        proto = getattr(driver, "_proto", None)
        wait_closed = getattr(proto, "wait_closed", None)
        if wait_closed is not None:
            await wait_closed()
            return
        while True:  # a driver without a close notification: ask
            await asyncio.sleep(1.0)
            try:
                await driver.ping(reconnect=False)
            except Exception:
                return

    async def _free(self, owners: list[str]) -> set[str]:
        database = await self._database_name()
        names = {f"l{i}": self.lock_name(database, o) for i, o in enumerate(owners)}
        columns = ", ".join(f"IS_USED_LOCK(:{k})" for k in names)
        row = (await self.db.rows(text(f"SELECT {columns}"), names))[0]
        return {owner for owner, used in zip(owners, row, strict=True) if used is None}

    async def unsupported(self) -> str | None:
        """Galera (``wsrep_on``): GET_LOCK is per node, a peer on another node sees it free."""
        rows = await self.db.rows(text("SHOW VARIABLES LIKE 'wsrep_on'"))
        if rows and str(rows[0][1]).upper() == "ON":
            return "a Galera cluster (wsrep_on=ON): GET_LOCK locks are per node"
        return None


def liveness_locks(db: Database) -> LivenessLocks | None:
    """The liveness locks of ``db``'s dialect (None: a dialect without session locks)."""
    if isinstance(db, PostgresDatabase):
        return PostgresLiveness(db)
    if isinstance(db, MySQLDatabase):
        return MySQLLiveness(db)
    return None
