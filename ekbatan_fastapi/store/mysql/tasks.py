"""MySQL 8+ and MariaDB 10.6+ (asyncmy): the hot path, and MySQL before 8 through an override.

Neither database has ``UPDATE ... RETURNING`` or ``UPDATE ... FROM``. Where PostgreSQL answers
"which rows did this write" in the write itself, a short transaction here first locks and reads
the rows (in primary-key order, so two writers never wait on each other in a cycle), then
writes exactly those. Single statements answer with their row count (SQLAlchemy's MySQL
dialects connect with ``CLIENT_FOUND_ROWS``: matched rows, not changed rows).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import TextClause, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ...domain.records import ExecutionRecord
from ...domain.rows import (
    Finish,
    FinishKind,
    NewTask,
    Owned,
    PollingStrategy,
    PollResult,
    Revival,
    TaskKey,
    TaskRow,
)
from ..database import aware, chunks, known_time
from ..external import Caller
from ..lease import Lease
from ..tasks import TaskStore
from . import hot
from . import statements as q
from .database import ER_DUP_ENTRY, MySQLDatabase, errno, naive_utc
from .names import NamesTables, transaction
from .polls import PollStatements

__all__ = ["MySQLTaskStore", "owned_params"]

_CHUNK = 250
"""Keys per statement when reading many keys at once. MariaDB turns an ``IN`` list of 1,000
values or more (``in_predicate_conversion_threshold``; a pair counts twice) into a join over a
temporary table that scans the whole table: 500 pairs read 122,013 rows of a 123,000-row
table, 300 pairs read 300."""
_INSERT_ROWS = 1000
"""Rows per executemany of ``insert_missing`` (one transaction for all of them)."""


def owned_params(triples: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
    """The parameters of ``statements.OWNED``: the key pairs and the (key, version) triples."""
    return {"owned": list(triples), "keys": list(dict.fromkeys((n, i) for n, i, _ in triples))}


class MySQLTaskStore(TaskStore):
    """MySQL 8+ and MariaDB 10.6+: ``FOR UPDATE SKIP LOCKED`` for lock-and-fetch."""

    supports_skip_locked = True
    keys_per_statement = _CHUNK
    supports_claim_ahead = True

    def __init__(self, db: MySQLDatabase) -> None:
        super().__init__(db)
        self.db: MySQLDatabase = db
        sql = db.sql
        t = db.quoted(db.tables.tasks)
        p = db.quoted(db.tables.paused)
        self._t = t
        self._polls = PollStatements(db, t, p)
        self._inline = hot.InlinedLists()
        self._names = NamesTables(db)
        self._lock_keys = sql(q.lock_keys(t))
        self._claim = sql(q.claim(t))
        self._lock_owned = sql(q.lock_owned(t))
        self._delete = sql(q.delete_owned(t))
        self._release = sql(q.release(t))
        self._heartbeat = sql(q.heartbeat(t))
        self._lock_beating = sql(q.lock_beating(t))
        self._heartbeat_keys = sql(q.heartbeat_keys(t))
        self._still_owned = sql(q.still_owned(t))
        self._dead_candidates = sql(q.dead_candidates(t))
        self._lock_dead = sql(q.lock_dead(t, skip_locked=self.supports_skip_locked))
        self._existing = sql(q.existing(t))
        self._replace = sql(q.replace(t))

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
                await self.db.transaction(
                    functools.partial(self._insert, tasks=unique, keys=missing)
                )
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
                continue
            return missing
        inserted = []
        for key in missing:
            try:
                await self.db.rowcount(insert(self.table).values(self._values(unique[key])))
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
            else:
                inserted.append(key)
        return inserted

    async def _missing_keys(self, keys: list[TaskKey]) -> list[TaskKey]:
        async with self.db.connect() as conn:
            return sorted(await self._absent(conn, keys))

    async def _absent(self, on: AsyncConnection | Caller, keys: list[TaskKey]) -> list[TaskKey]:
        """The ``keys`` no row has (in their order), read ``_CHUNK`` keys per statement."""
        existing: set[TaskKey] = set()
        for chunk in chunks(keys, _CHUNK):
            result = await on.execute(self._existing, {"keys": chunk})
            existing.update((r[0], r[1]) for r in result)
        return [key for key in keys if key not in existing]

    async def _now_for(
        self, on: AsyncConnection | Caller, tasks: Iterable[NewTask]
    ) -> datetime | None:
        """The database's now when one of ``tasks`` has no time of its own (due now)."""
        if any(task.execution_time is None for task in tasks):
            return (await on.execute(select(self.db.now_expr()))).scalar_one()
        return None

    async def _insert(
        self, conn: AsyncConnection, *, tasks: dict[TaskKey, NewTask], keys: list[TaskKey]
    ) -> None:
        """Executemanys of ``_INSERT_ROWS`` rows (asyncmy sends each as multi-row INSERTs);
        the event loop gets a turn between them."""
        now = await self._now_for(conn, (tasks[key] for key in keys))
        for chunk in chunks(keys, _INSERT_ROWS):
            await conn.execute(insert(self.table), [self._values(tasks[k], now) for k in chunk])

    def _values(self, task: NewTask, now: datetime | None = None) -> dict[str, Any]:
        """The row of ``task``; without a time it is due at ``now`` (default: the database's
        now, as SQL)."""
        due = task.execution_time if task.execution_time is not None else now
        return {
            "task_name": task.task_name,
            "task_instance": task.task_instance,
            "task_data": task.task_data,
            "execution_time": due if due is not None else self.db.now_expr(),
            "picked": False,
            "version": 1,
            "priority": task.priority,
        }

    @staticmethod
    def _upsert_params(task: NewTask) -> dict[str, Any]:
        return {
            "name": task.task_name,
            "instance": task.task_instance,
            "data": task.task_data,
            "time": naive_utc(task.execution_time),
            "priority": task.priority,
        }

    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """``task.execution_time`` None means the database's now."""
        params = self._upsert_params(task)
        if replace and await self.db.rowcount(self._replace, params) == 1:
            return True
        try:
            await self.db.rowcount(insert(self.table).values(self._values(task)))
            return True
        except DBAPIError as error:
            if errno(error) != ER_DUP_ENTRY:
                raise
        # A peer inserted it between our two statements: replace it unless it is picked.
        return replace and await self.db.rowcount(self._replace, params) == 1

    async def upsert_on(self, caller: Caller, task: NewTask, *, replace: bool) -> bool:
        """As ``upsert``, inside the caller's transaction: a duplicate key only undoes its own
        statement in InnoDB, so the caller's transaction goes on."""
        params = self._upsert_params(task)
        if replace and await caller.rowcount(self._replace, params) == 1:
            return True
        try:
            await caller.execute(insert(self.table).values(self._values(task)))
            return True
        except DBAPIError as error:
            if errno(error) != ER_DUP_ENTRY:
                raise
        return replace and await caller.rowcount(self._replace, params) == 1

    async def insert_missing_on(self, caller: Caller, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """Row by row once the caller's transaction lost a race (a duplicate key), since the
        whole set cannot be retried here."""
        unique: dict[TaskKey, NewTask] = {}
        for task in tasks:
            unique.setdefault((task.task_name, task.task_instance), task)
        missing = await self._absent(caller, list(unique))
        if not missing:
            return []
        now = await self._now_for(caller, (unique[key] for key in missing))
        rows = [self._values(unique[key], now) for key in missing]
        try:
            await caller.execute(insert(self.table), rows)
            return sorted(missing)
        except DBAPIError as error:
            if errno(error) != ER_DUP_ENTRY:
                raise
        inserted: list[TaskKey] = []
        for key in missing:
            try:
                await caller.execute(insert(self.table).values(self._values(unique[key])))
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
            else:
                inserted.append(key)
        return sorted(inserted)

    # -- the hot path -----------------------------------------------------------------------

    async def _poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: PollingStrategy,
        *,
        skip_paused: bool,
        lease: Lease | None,
        ahead_ms: int = 0,
    ) -> PollResult:
        """As the base says; ``next_due`` is None when the batch came back full (the poller
        polls again at once and does not read it). Lock-and-fetch runs on ``lease``'s
        connection; the fetch strategy's claim in transactions of its own."""
        if strategy == PollingStrategy.LOCK_AND_FETCH:
            if not self.supports_skip_locked:
                raise ValueError(f"{self.dialect_name} has no FOR UPDATE SKIP LOCKED")
            return await self._lock_and_fetch(names, limit, picked_by, skip_paused, lease, ahead_ms)
        params: dict[str, Any] = {"limit": limit}
        if table := self._names.get(names):  # no copy of the names: they are in the table
            candidates = self._polls.by_table(skip_paused, ahead_ms, *table.refs)[0]
        else:
            candidates = self._polls.scan(skip_paused, ahead_ms)[0]
            params["names"] = list(names)
            if 0 < len(names) <= q.PER_NAME_MAX:
                candidates = self._polls.per_name(skip_paused, len(names), ahead_ms)[0]
                params.update(q.name_params(list(names)))

        async def read() -> list[Any]:
            async with self.db.connect() as conn:
                if table:
                    await table.ensure(conn)
                return list(await conn.execute(candidates, params))

        rows = await (table.retried(read) if table else read())
        db_now = known_time(rows[0]._mapping["db_now"])
        next_due = aware(rows[0]._mapping["next_due"])
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

        claimed = await self.db.transaction(claim)
        return PollResult(claimed, db_now, next_due, more_due=len(seen) >= limit)

    async def _lock_and_fetch(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        skip_paused: bool,
        lease: Lease | None,
        ahead_ms: int,
    ) -> PollResult:
        """On the driver's cursor (``hot``), on ``lease``'s connection."""
        if not names:
            return PollResult([], known_time((await self.db.clock())[0]), None)
        table = self._names.get(names)
        if table:  # the names from a temporary table (``names.py``)
            _, lock_due, clock_sql = self._polls.by_table(skip_paused, ahead_ms, *table.refs)
            params: dict[str, Any] = {"limit": limit}
            clock: tuple[str, dict[str, Any]] = (clock_sql.text, {})
        else:
            _, lock_due, clock_sql = self._polls.scan(skip_paused, ahead_ms)
            listed = self._inline.get(names, "poll")
            params = {"names": listed, "limit": limit}
            if len(names) <= q.PER_NAME_MAX:
                lock_due = self._polls.per_name(skip_paused, len(names), ahead_ms)[1]
                params = {"limit": limit, **q.name_params(list(names))}
            clock = (clock_sql.text, {"names": listed})

        async def run(cursor: Any) -> PollResult:
            return await hot.lock_and_fetch(
                cursor,
                lock_due.text,
                params,
                self._claim.text,
                clock,
                limit=limit,
                picked_by=picked_by,
            )

        return await transaction(self.db, lease, table, run)

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
        claimed_at = known_time(now)
        return [
            self.to_row(r)._replace(
                picked=True,
                picked_by=picked_by,
                last_heartbeat=claimed_at,
                version=int(r._mapping["version"]) + 1,
            )
            for r in locked
        ]

    async def _finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None,
        history: Sequence[ExecutionRecord],
        picked_by: str | None,
        retry: bool,
    ) -> set[TaskKey]:
        """One statement per kind of result, each guarded by the owned versions, in one
        transaction: when every row matched, all were recorded. Otherwise (rows revived
        meanwhile) that is rolled back, and a second transaction locks the rows in key order,
        keeps those still at our version and writes exactly those."""
        if not items:
            return set()
        by_key = {i.owned.key: i for i in items}
        writes = [(stmt.text, p, n) for stmt, p, n in self._writes(list(by_key.values()))]
        try:  # on the driver's cursor (``hot``), on ``lease``'s connection
            await hot.transaction(
                self.db, lease, functools.partial(hot.write_all, name="finish", writes=writes)
            )
            return set(by_key)
        except hot.RowsLost:
            pass

        async def precise(conn: AsyncConnection) -> set[TaskKey]:
            locked = await conn.execute(self._lock_owned, {"keys": list(by_key)})
            ours = [
                by_key[(r[0], r[1])] for r in locked if by_key[(r[0], r[1])].owned.version == r[2]
            ]
            for stmt, params, _ in self._writes(ours):
                await conn.execute(stmt, params)
            return {item.owned.key for item in ours}

        return await self.db.transaction(precise)

    def _writes(self, items: list[Finish]) -> list[tuple[TextClause, dict[str, Any], int]]:
        """One statement per kind of result: (statement, parameters, rows it must match)."""
        groups: dict[FinishKind, list[Finish]] = {}
        for item in items:
            groups.setdefault(item.kind, []).append(item)
        return [(*self._finish_statement(k, g), len(g)) for k, g in groups.items()]

    def _finish_statement(
        self, kind: FinishKind, group: list[Finish]
    ) -> tuple[TextClause, dict[str, Any]]:
        params = owned_params(
            [(i.owned.task_name, i.owned.task_instance, i.owned.version) for i in group]
        )
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
                        f"t{n}": naive_utc(item.next_time),
                    }
                )
        next_time = f"CASE {' '.join(whens)} END" if whens else "NULL"
        outcome = {FinishKind.FAILED: "failed", FinishKind.SKIPPED: "skipped"}.get(
            kind, "succeeded"
        )
        return self.db.sql(q.reschedule_owned(self._t, next_time, outcome=outcome)), params

    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        """Lock the owned rows nobody else holds (SKIP LOCKED; ``statements.lock_beating``)
        and update those, in one transaction (MySQL 5: one plain update); only when fewer rows
        were beaten than asked, a read says which are still ours (a version only grows, so a
        row revived meanwhile cannot match the read)."""
        if not owned:
            return set()
        keys = [(o.task_name, o.task_instance, o.version) for o in owned]
        beaten = await hot.transaction(self.db, None, functools.partial(self._beat, keys))
        if len(beaten) == len(set(keys)):
            return {o.key for o in owned}
        # Rows missed: revived elsewhere (no longer ours), or held by another transaction
        # (still ours: revival skips locked rows too; the next round beats them).
        async with self.db.connect() as conn:
            result = await conn.execute(self._still_owned, owned_params(keys))
            return beaten | {(r[0], r[1]) for r in result}

    async def _beat(self, keys: list[tuple[str, str, int]], cursor: Any) -> set[TaskKey]:
        """On the driver's cursor (``hot``)."""
        params = owned_params(keys)
        if not self.supports_skip_locked:  # MySQL 5: one plain update
            done = await hot.execute(cursor, "heartbeat", self._heartbeat.text, params)
            return set(params["keys"]) if done == len(set(keys)) else set()
        return await hot.beat(cursor, self._lock_beating.text, self._heartbeat_keys.text, params)

    async def _revive_dead(self, names: Sequence[str], dead_after: timedelta) -> Revival:
        """A plain read finds candidates (the usual answer is none) and the next death; a
        transaction then locks them in key order, checks again that they are dead at the
        version seen, and unpicks."""
        if not names:
            return Revival([], None)
        dead_us = dead_after // timedelta(microseconds=1)
        table = self._names.get(names)
        check = self._polls.dead_by_table(*table.refs) if table else self._dead_candidates
        params: dict[str, Any] = {"dead_us": dead_us}
        if not table:
            params["names"] = self._inline.get(names, "dead")

        async def read(cursor: Any) -> list[Any]:
            await hot.execute(cursor, "dead-execution check", check.text, params)
            return list(await cursor.fetchall())

        result = await transaction(self.db, None, table, read)
        candidates = [(r[0], r[1], int(r[2])) for r in result if r[0] is not None]
        next_death = aware(next((r[3] for r in result if r[0] is None), None))
        if not candidates:
            return Revival([], next_death)

        revived = await self._revive_candidates(candidates, dead_us)
        return Revival(revived, next_death)

    async def _revive_candidates(
        self, candidates: list[tuple[str, str, int]], dead_us: int
    ) -> list[TaskRow]:
        """Lock the candidates in key order (skipping those another transaction holds),
        check again that they are dead at the version seen, and unpick them."""

        async def run(conn: AsyncConnection) -> list[TaskRow]:
            locked = list(
                await conn.execute(
                    self._lock_dead, {**owned_params(candidates), "dead_us": dead_us}
                )
            )
            rows = [self.to_row(r) for r in locked]
            if rows:
                owned = [(r.task_name, r.task_instance, r.version) for r in rows]
                await conn.execute(self._release, owned_params(owned))
            return rows

        return await self.db.transaction(run, read_committed=True)
