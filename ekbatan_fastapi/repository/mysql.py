"""MySQL 8+ and MariaDB 10.6+ statements (asyncmy), and MySQL before 8 through an override.

Neither database has ``UPDATE ... RETURNING`` or ``UPDATE ... FROM``. Where PostgreSQL answers
"which rows did this write" in the write itself, a short transaction here first locks and reads
the rows (in primary-key order, so two writers never wait on each other in a cycle), then
writes exactly those. Single statements answer with their row count (SQLAlchemy's MySQL
dialects connect with ``CLIENT_FOUND_ROWS``: matched rows, not changed rows).

Time: the columns are ``datetime(6)`` holding UTC, the database clock is ``UTC_TIMESTAMP(6)``,
and parameters are sent as naive UTC, so neither the session nor the server time zone matters.

Transactions run on the engine as configured (no per-checkout ``AUTOCOMMIT`` switch: on MySQL
drivers that costs four extra round trips per statement). Lock-and-fetch and the revival of
dead executions scan ranges, so their transactions ask for ``READ COMMITTED``: locks on rows
that do not match are released at once and no gap locks block inserts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import TextClause, bindparam, insert, literal_column, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

from ..errors import SchemaMissingError
from ..schema import UTCDateTime
from . import mysql_statements as q
from .base import Lease, PollingStrategy, TaskRepository
from .model import (
    Finish,
    FinishKind,
    HistoryEntry,
    NewTask,
    Owned,
    PollResult,
    TaskKey,
    TaskRow,
)

__all__ = ["MariaDBRepository", "MySQL5Repository", "MySQLRepository"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ER_DUP_ENTRY = 1062
ER_NO_SUCH_TABLE = 1146
ER_LOCK_DEADLOCK = 1213
_DEADLOCK_RETRIES = 5
_CHUNK = 1000
"""Keys per statement when reading many keys at once."""


class _RowsLost(Exception):
    """A version-guarded write matched fewer rows than it was given (rolls the transaction
    back)."""


def _errno(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _utc(value: datetime | None) -> datetime | None:
    """A parameter for a ``datetime(6)`` column: naive UTC (drivers drop an offset silently)."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def _text(sql: str, *expanding: str) -> TextClause:
    """``sql`` with ``expanding`` parameters (lists, or lists of tuples, for ``IN``)."""
    return text(sql).bindparams(*(bindparam(name, expanding=True) for name in expanding))


class MySQLRepository(TaskRepository):
    """MySQL 8+ (asyncmy): ``FOR UPDATE SKIP LOCKED`` for lock-and-fetch."""

    dialect_name = "mysql"
    supports_skip_locked = True

    def __init__(self, engine: AsyncEngine, table_name: str) -> None:
        super().__init__(engine, table_name)
        if _is_autocommit(engine):
            # Each statement would commit alone and drop the row locks our claims rely on.
            self.engine = engine.execution_options(isolation_level="READ COMMITTED")
            self._read_committed: TextClause | None = None
        else:
            self.engine = engine
            self._read_committed = text(q.READ_COMMITTED)
        quoted = ".".join(f"`{part}`" for part in table_name.split("."))

        def sql(template: str, *expanding: str, **parts: str) -> TextClause:
            if parts:
                template = template % parts
            return _text(template.replace("{t}", quoted), *expanding)

        self._sql = sql
        paused = ".".join(f"`{part}`" for part in self.pause_table_name.split("."))
        not_paused = f"{q.WANTED} AND task_name NOT IN (SELECT task_name FROM {paused})"
        # (candidates, lock_due, clock), without and with the pause filter
        self._poll_sql: dict[bool, tuple[TextClause, TextClause, TextClause]] = {
            with_pause: (
                sql(q.CANDIDATES, "names", wanted=wanted),
                sql(q.LOCK_DUE, "names", wanted=wanted),
                sql(q.CLOCK, "names", wanted=wanted),
            )
            for with_pause, wanted in ((False, q.WANTED), (True, not_paused))
        }
        self._lock_keys = sql(q.LOCK_KEYS, "keys")
        self._claim = sql(q.CLAIM, "keys")
        self._lock_owned = sql(q.LOCK_OWNED, "keys")
        self._delete = sql(q.DELETE, "owned")
        self._release = sql(q.RELEASE, "owned")
        self._heartbeat = sql(q.HEARTBEAT, "owned")
        self._still_owned = sql(q.STILL_OWNED, "owned")
        self._dead_candidates = sql(q.DEAD_CANDIDATES, "names")
        skip = " SKIP LOCKED" if self.supports_skip_locked else ""
        self._lock_dead = sql(q.LOCK_DEAD, "owned", skip_locked=skip)
        self._existing = sql(q.EXISTING, "keys")
        self._replace = sql(q.REPLACE)

    # -- plumbing --------------------------------------------------------------------------

    def is_missing_table(self, error: DBAPIError) -> bool:
        return _errno(error) == ER_NO_SUCH_TABLE

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        try:
            yield
        except DBAPIError as error:
            if self.is_missing_table(error):
                raise self.missing_table_error() from error
            raise

    async def _transaction(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, read_committed: bool = False
    ) -> T:
        """Run ``work`` in one transaction and commit; a deadlock victim is run again."""
        for attempt in range(1, _DEADLOCK_RETRIES + 1):
            try:
                async with self._errors(), self._connect() as conn:
                    if read_committed and self._read_committed is not None:
                        await conn.execute(self._read_committed)
                    result = await work(conn)
                    await conn.commit()
                    return result
            except DBAPIError as error:
                if _errno(error) != ER_LOCK_DEADLOCK or attempt == _DEADLOCK_RETRIES:
                    raise
                log.debug("deadlock on %s (attempt %d); retrying", self.table_name, attempt)
        raise AssertionError("unreachable")

    async def _write(self, stmt: Executable, params: Any = None) -> int:
        async def run(conn: AsyncConnection) -> int:
            return int((await conn.execute(stmt, params)).rowcount)

        return await self._transaction(run)

    async def _rowcount(self, stmt: Executable, params: Any = None) -> int:
        """Shared statements that write: committed explicitly (the engine is not AUTOCOMMIT)."""
        return await self._write(stmt, params)

    def now_expr(self) -> ColumnElement[datetime]:
        """``UTC_TIMESTAMP(6)``: ``NOW()`` would follow the session time zone."""
        return literal_column(q.NOW, UTCDateTime())

    # -- startup and the client -------------------------------------------------------------

    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """Read which keys exist, insert the others with plain ``INSERT`` statements in one
        transaction; when a peer inserted one of them meanwhile, a duplicate key rolls it all
        back and the two steps run again, so the answer is exact. (No ``INSERT IGNORE``: it
        would also turn a too-long value into a silent truncation.) A key that collides only
        under the column's collation (``'Job'`` and ``'job'``) falls back to row by row."""
        unique: dict[TaskKey, NewTask] = {}
        for task in tasks:
            unique.setdefault((task.task_name, task.task_instance), task)
        missing: list[TaskKey] = []
        for _ in range(2):
            missing = await self._missing_keys(list(unique))
            if not missing:
                return []
            try:
                await self._transaction(functools.partial(self._insert, tasks=unique, keys=missing))
            except DBAPIError as error:
                if _errno(error) != ER_DUP_ENTRY:
                    raise
                continue
            return missing
        inserted = []
        for key in missing:
            try:
                await self._write(insert(self.table).values(self._values(unique[key])))
            except DBAPIError as error:
                if _errno(error) != ER_DUP_ENTRY:
                    raise
            else:
                inserted.append(key)
        return inserted

    async def _missing_keys(self, keys: list[TaskKey]) -> list[TaskKey]:
        existing: set[TaskKey] = set()
        async with self._errors(), self._connect() as conn:
            for start in range(0, len(keys), _CHUNK):
                result = await conn.execute(self._existing, {"keys": keys[start : start + _CHUNK]})
                existing.update((r[0], r[1]) for r in result)
        return sorted(key for key in keys if key not in existing)

    async def _insert(
        self, conn: AsyncConnection, *, tasks: dict[TaskKey, NewTask], keys: list[TaskKey]
    ) -> None:
        """One executemany (SQLAlchemy sends it as multi-row INSERTs, 1,000 rows each)."""
        now: datetime | None = None
        if any(tasks[key].execution_time is None for key in keys):
            now = (await conn.execute(select(self.now_expr()))).scalar_one()
        rows = []
        for key in keys:
            row = self._values(tasks[key])
            if tasks[key].execution_time is None:
                row["execution_time"] = now
            rows.append(row)
        await conn.execute(insert(self.table), rows)

    def _values(self, task: NewTask) -> dict[str, Any]:
        return {
            "task_name": task.task_name,
            "task_instance": task.task_instance,
            "task_data": task.task_data,
            "execution_time": (
                task.execution_time if task.execution_time is not None else self.now_expr()
            ),
            "picked": False,
            "version": 1,
            "priority": task.priority,
        }

    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """``task.execution_time`` None means the database's now."""
        params = {
            "name": task.task_name,
            "instance": task.task_instance,
            "data": task.task_data,
            "time": _utc(task.execution_time),
            "priority": task.priority,
        }
        if replace and await self._write(self._replace, params) == 1:
            return True
        try:
            await self._write(insert(self.table).values(self._values(task)))
            return True
        except DBAPIError as error:
            if _errno(error) != ER_DUP_ENTRY:
                raise
        # A peer inserted it between our two statements: replace it unless it is picked.
        return replace and await self._write(self._replace, params) == 1

    # -- the hot path -----------------------------------------------------------------------

    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: str,
        *,
        lease: Lease | None = None,
    ) -> PollResult:
        """As the base says; ``next_due`` is None when the batch came back full (the poller
        polls again at once and does not read it). The claim runs in transactions of its own
        (``lease`` is not used)."""
        if strategy == PollingStrategy.LOCK_AND_FETCH:
            if not self.supports_skip_locked:
                raise ValueError(f"{self.dialect_name} has no FOR UPDATE SKIP LOCKED")
            return await self._lock_and_fetch(list(names), limit, picked_by)
        candidates = self._poll_sql[self.pauses_enabled][0]
        async with self._errors(), self._connect() as conn:
            rows = list(await conn.execute(candidates, {"names": list(names), "limit": limit}))
        db_now = self._aware(rows[0]._mapping["db_now"])
        next_due = self.aware(rows[0]._mapping["next_due"])
        seen = {(r[2], r[3]): int(r[4]) for r in rows if r[2] is not None}
        if not seen:
            return PollResult([], db_now, next_due)

        async def claim(conn: AsyncConnection) -> list[TaskRow]:
            locked = await conn.execute(self._lock_keys, {"keys": list(seen)})
            ours = [
                r
                for r in locked
                if not r._mapping["picked"]
                and seen.get((r._mapping["task_name"], r._mapping["task_instance"]))
                == r._mapping["version"]
            ]
            return await self._claim_locked(conn, ours, picked_by)

        claimed = await self._transaction(claim)
        return PollResult(claimed, db_now, next_due, more_due=len(seen) >= limit)

    async def _lock_and_fetch(self, names: list[str], limit: int, picked_by: str) -> PollResult:
        _, lock_due, clock_sql = self._poll_sql[self.pauses_enabled]

        async def run(conn: AsyncConnection) -> PollResult:
            locked = list(await conn.execute(lock_due, {"names": names, "limit": limit}))
            claimed = await self._claim_locked(conn, locked, picked_by)
            if locked and len(locked) >= limit:
                return PollResult(claimed, self._aware(locked[0]._mapping["db_now"]), None)
            clock = (await conn.execute(clock_sql, {"names": names})).one()
            return PollResult(claimed, self._aware(clock[0]), self.aware(clock[1]))

        return await self._transaction(run, read_committed=True)

    async def _claim_locked(
        self, conn: AsyncConnection, locked: Sequence[Any], picked_by: str
    ) -> list[TaskRow]:
        """Claim rows this transaction holds locked; the rows as the claim leaves them."""
        if not locked:
            return []
        now = locked[0]._mapping["db_now"]
        keys = [(r._mapping["task_name"], r._mapping["task_instance"]) for r in locked]
        updated = await conn.execute(
            self._claim, {"keys": keys, "picked_by": picked_by, "now": now}
        )
        if updated.rowcount != len(keys):  # cannot happen: the rows are locked and unpicked
            raise RuntimeError(f"claimed {updated.rowcount} of {len(keys)} locked rows")
        claimed_at = self._aware(now)
        return [
            dataclasses.replace(
                self.to_row(r),
                picked=True,
                picked_by=picked_by,
                last_heartbeat=claimed_at,
                version=int(r._mapping["version"]) + 1,
            )
            for r in locked
        ]

    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[HistoryEntry] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        """One statement per kind of result, each guarded by the owned versions, in one
        transaction: when every row matched, all were recorded. Otherwise (rows revived
        meanwhile) that is rolled back, and a second transaction locks the rows in key order,
        keeps those still at our version and writes exactly those."""
        if not items:
            return set()
        by_key = {i.owned.key: i for i in items}
        try:
            return await self._transaction(
                functools.partial(self._record, items=list(by_key.values()), strict=True)
            )
        except _RowsLost:
            pass

        async def precise(conn: AsyncConnection) -> set[TaskKey]:
            locked = await conn.execute(self._lock_owned, {"keys": list(by_key)})
            ours = [
                by_key[(r[0], r[1])] for r in locked if by_key[(r[0], r[1])].owned.version == r[2]
            ]
            return await self._record(conn, items=ours, strict=False)

        return await self._transaction(precise)

    async def _record(
        self, conn: AsyncConnection, *, items: list[Finish], strict: bool
    ) -> set[TaskKey]:
        groups: dict[FinishKind, list[Finish]] = {}
        for item in items:
            groups.setdefault(item.kind, []).append(item)
        for kind, group in groups.items():
            written = (await conn.execute(*self._finish_statement(kind, group))).rowcount
            if strict and written != len(group):
                raise _RowsLost
        return {item.owned.key for item in items}

    def _finish_statement(
        self, kind: FinishKind, group: list[Finish]
    ) -> tuple[Executable, dict[str, Any]]:
        params: dict[str, Any] = {
            "owned": [(i.owned.task_name, i.owned.task_instance, i.owned.version) for i in group]
        }
        if kind is FinishKind.DELETED:
            return self._delete, params
        if kind is FinishKind.RELEASED:
            return self._release, params
        whens = []
        for n, item in enumerate(group):
            if item.next_time is not None:
                whens.append(
                    f"WHEN task_name = :n{n} AND task_instance = :i{n} "
                    f"THEN CAST(:t{n} AS DATETIME(6))"
                )
                params.update(
                    {
                        f"n{n}": item.owned.task_name,
                        f"i{n}": item.owned.task_instance,
                        f"t{n}": _utc(item.next_time),
                    }
                )
        next_time = f"CASE {' '.join(whens)} END" if whens else "NULL"
        template = q.SUCCEEDED if kind is FinishKind.SUCCEEDED else q.FAILED
        return self._sql(template, "owned", next_time=next_time), params

    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        """One update; only when it matched fewer rows than asked, a read says which are still
        ours (a version only grows, so a row missed by the update cannot match the read)."""
        if not owned:
            return set()
        keys = [(o.task_name, o.task_instance, o.version) for o in owned]
        if await self._write(self._heartbeat, {"owned": keys}) == len(set(keys)):
            return {o.key for o in owned}
        async with self._errors(), self._connect() as conn:
            result = await conn.execute(self._still_owned, {"owned": keys})
            return {(r[0], r[1]) for r in result}

    async def revive_dead(self, names: Sequence[str], dead_after: timedelta) -> list[TaskRow]:
        return (await self.revive_and_watch(names, dead_after))[0]

    async def revive_and_watch(
        self, names: Sequence[str], dead_after: timedelta
    ) -> tuple[list[TaskRow], datetime | None]:
        """A plain read finds candidates (the usual answer is none) and the next death; a
        transaction then locks them in key order, checks again that they are dead at the
        version seen, and unpicks."""
        if not names:
            return [], None
        dead_us = dead_after // timedelta(microseconds=1)
        async with self._errors(), self._connect() as conn:
            result = list(
                await conn.execute(
                    self._dead_candidates, {"names": list(names), "dead_us": dead_us}
                )
            )
        candidates = [(r[0], r[1], int(r[2])) for r in result if r[0] is not None]
        next_death = self.aware(next((r[3] for r in result if r[0] is None), None))
        if not candidates:
            return [], next_death

        async def run(conn: AsyncConnection) -> list[TaskRow]:
            locked = list(
                await conn.execute(self._lock_dead, {"owned": candidates, "dead_us": dead_us})
            )
            rows = [self.to_row(r) for r in locked]
            if rows:
                owned = [(r.task_name, r.task_instance, r.version) for r in rows]
                await conn.execute(self._release, {"owned": owned})
            return rows

        return await self._transaction(run, read_committed=True), next_death

    def _aware(self, value: datetime | None) -> datetime:
        aware = self.aware(value)
        assert aware is not None
        return aware


class MariaDBRepository(MySQLRepository):
    """MariaDB 10.6+ (asyncmy): the MySQL statements; ``SKIP LOCKED`` exists from 10.6."""

    dialect_name = "mariadb"


class MySQL5Repository(MySQLRepository):
    """MySQL before 8 (and MariaDB before 10.6): no ``SKIP LOCKED``, so the optimistic
    ``fetch`` strategy only. Reachable only through ``b.dialect("mysql5")``."""

    dialect_name = "mysql5"
    supports_skip_locked = False

    def missing_table_error(self) -> SchemaMissingError:
        message = str(super().missing_table_error())
        return SchemaMissingError(message.replace("migrations/mysql5/", "migrations/mysql/"))


def _is_autocommit(engine: AsyncEngine) -> bool:
    configured = engine.get_execution_options().get("isolation_level")
    on_connect = getattr(engine.dialect, "_on_connect_isolation_level", None)
    return "AUTOCOMMIT" in (configured, on_connect)
