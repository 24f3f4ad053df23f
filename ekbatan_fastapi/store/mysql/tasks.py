"""MySQL 8+ and MariaDB 10.6+ (asyncmy): the hot path, and MySQL before 8 through an override.

Neither database has ``UPDATE ... RETURNING`` or ``UPDATE ... FROM``. Where PostgreSQL answers
"which rows did this write" in the write itself, a short transaction here first locks and reads
the rows (in primary-key order, so two writers never wait on each other in a cycle), then
writes exactly those. Single statements answer with their row count (SQLAlchemy's MySQL
dialects connect with ``CLIENT_FOUND_ROWS``: matched rows, not changed rows).

The hot statements go to asyncmy's own cursor, under SQLAlchemy's connection (the last part of
this module). The claim (lock-and-fetch), the completion's first, version-guarded attempt and
the heartbeat are all the scheduler sends under load. Through SQLAlchemy each costs more client
CPU than the server spends on it: the expansion of the ``IN :keys`` lists (the statement is
compiled again for every list length), parameter processing and ``Row`` objects (see
docs/BENCHMARKS.md, "MariaDB's own limit"). Here the texts of ``statements`` are sent with
asyncmy's own ``%(name)s`` interpolation (a list goes as a tuple, which the driver writes as
``(a, b)``; the server receives the same literal text either way) on the connection a busy loop
holds (``Lease``), and rows are decoded by ``task_row``.

The transaction itself still starts and ends through SQLAlchemy's connection (the isolation
statement, ``COMMIT``): its events see the session (the test clock's ``SET timestamp``) and
its state stays true. (On an engine set to ``READ COMMITTED`` for an application's
``AUTOCOMMIT`` one, no statement went through SQLAlchemy: the driver commits.)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import TextClause, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ...domain.rows import (
    ExecutionRecord,
    Finish,
    FinishKind,
    NewTask,
    Own,
    Owned,
    PollingStrategy,
    PollResult,
    Revival,
    TaskKey,
    TaskRow,
)
from ..database import Lease, aware, chunks, known_time
from ..external import WHOLE_TEXT, Caller
from ..locks import is_galera
from ..tasks import TaskStore
from . import statements as q
from .database import (
    CONFLICT_RETRIES,
    ER_DUP_ENTRY,
    ER_LOCK_DEADLOCK,
    MySQLDatabase,
    after_conflict,
    errno,
    naive_utc,
)
from .literals import literal
from .names import NamesTable, NamesTables

__all__ = ["MySQLTaskStore", "owned_params", "task_row"]

_NO_LEAD = timedelta(0)

Sent = Callable[[str, str], None] | None
"""What is told of a statement before it is sent (``TaskStore.on_statement``)."""

_CHUNK = 250
"""Keys per statement when reading many keys at once. MariaDB turns an ``IN`` list of 1,000
values or more (``in_predicate_conversion_threshold``; a pair counts twice) into a join over a
temporary table that scans the whole table: 500 pairs read 122,013 rows of a 123,000-row
table, 300 pairs read 300."""


def owned_params(triples: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
    """The parameters of ``statements.OWNED``: the key pairs and the (key, version) triples."""
    return {"owned": list(triples), "keys": list(dict.fromkeys((n, i) for n, i, _ in triples))}


class MySQLTaskStore(TaskStore):
    """MySQL 8+ and MariaDB 10.6+: ``FOR UPDATE SKIP LOCKED`` for lock-and-fetch."""

    supports_skip_locked = True

    async def galera(self) -> bool:
        async with self.db.connect() as conn:
            return await is_galera(conn)

    keys_per_statement = _CHUNK
    supports_claim_ahead = True

    def __init__(self, db: MySQLDatabase) -> None:
        super().__init__(db)
        self.db: MySQLDatabase = db
        sql = db.sql
        t = db.quoted(db.tables.tasks)
        p = db.quoted(db.tables.paused)
        self._t = t
        self._polls = q.PollStatements(db.sql, t, p)
        self._inline = InlinedLists()
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
        self._replace = sql(q.replace(t))

    # -- startup and the client -------------------------------------------------------------

    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """In one transaction, read which keys exist and insert the others with multi-row
        ``INSERT`` statements (``insert_texts``); when a peer inserted one of them meanwhile,
        a duplicate key rolls it all back and it runs again, so the answer is exact. (No
        ``INSERT IGNORE``: it would also turn a too-long value into a silent truncation.) A
        key that collides only under the column's collation (``'Job'`` and ``'job'``) falls
        back to row by row."""
        unique = _unique(tasks)
        for _ in range(2):
            try:
                return await self.db.transaction(
                    functools.partial(self._insert_absent, tasks=unique)
                )
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
        async with self.db.connect() as conn:
            missing = await self._absent(_Text(conn), list(unique))
        return await self._insert_one_by_one([unique[key] for key in missing])

    async def _insert_one_by_one(self, tasks: Iterable[NewTask]) -> list[TaskKey]:
        inserted = []
        for task in tasks:
            try:
                await self.db.rowcount(insert(self.table).values(self._values(task)))
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
            else:
                inserted.append((task.task_name, task.task_instance))
        return sorted(inserted)

    async def _insert_absent(
        self, conn: AsyncConnection, *, tasks: dict[TaskKey, NewTask]
    ) -> list[TaskKey]:
        """The rows of ``tasks`` whose key has none yet, inserted on ``conn``; their keys."""
        text = _Text(conn)
        missing = await self._absent(text, list(tasks))
        if not missing:
            return []
        rows = [tasks[key] for key in missing]
        now = await self._now_for(conn, rows)
        for statement, _ in insert_texts(self._t, await text.driver(), rows, now):
            await text.exec_text(statement)
        return sorted(missing)

    async def _absent(self, on: _Text | Caller, keys: list[TaskKey]) -> list[TaskKey]:
        """The ``keys`` no row has (in their order): one statement per name and
        ``EXISTING_MAX`` instance ids."""
        driver = await on.driver()
        existing: set[TaskKey] = set()
        for name, instances in _by_name(keys).items():
            for chunk in chunks(instances, q.EXISTING_MAX):
                result = await on.exec_text(existing_text(self._t, driver, name, chunk))
                existing.update((r[0], r[1]) for r in result)
        return [key for key in keys if key not in existing]

    async def _now_for(
        self, on: AsyncConnection | Caller, tasks: Iterable[NewTask]
    ) -> datetime | None:
        """The database's now when one of ``tasks`` has no time of its own (due now)."""
        if any(task.execution_time is None for task in tasks):
            return (await on.execute(select(self.db.now_expr()))).scalar_one()
        return None

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
        """Once the caller's transaction lost a race (a duplicate key: InnoDB undoes that
        statement alone), the rows of that statement and the next ones go row by row, since
        the whole set cannot be retried here; the statements before it stand."""
        unique = _unique(tasks)
        missing = await self._absent(caller, list(unique))
        if not missing:
            return []
        rows = [unique[key] for key in missing]
        now = await self._now_for(caller, rows)
        done = 0
        for statement, count in insert_texts(self._t, await caller.driver(), rows, now):
            try:
                await caller.exec_text(statement)
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
                rest = await self._insert_one_by_one_on(caller, rows[done:])
                return sorted([*missing[:done], *rest])
            done += count
        return sorted(missing)

    async def _insert_one_by_one_on(
        self, caller: Caller, tasks: Iterable[NewTask]
    ) -> list[TaskKey]:
        inserted: list[TaskKey] = []
        for task in tasks:
            try:
                await caller.execute(insert(self.table).values(self._values(task)))
            except DBAPIError as error:
                if errno(error) != ER_DUP_ENTRY:
                    raise
            else:
                inserted.append((task.task_name, task.task_instance))
        return inserted

    # -- the hot path -----------------------------------------------------------------------

    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: PollingStrategy,
        *,
        skip_paused: bool = False,
        lease: Lease | None = None,
        ahead: timedelta = _NO_LEAD,
    ) -> PollResult:
        """As the base says; ``next_due`` is None when the batch came back full (the poller
        polls again at once and does not read it). Lock-and-fetch runs on ``lease``'s
        connection; the fetch strategy's claim in transactions of its own."""
        if ahead:
            self.check_lead(ahead)
        ahead_ms = round(ahead.total_seconds() * 1000) if ahead else 0
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
            clock: tuple[str, dict[str, Any]] = (clock_sql.text, {"picked_by": picked_by})
        else:
            _, lock_due, clock_sql = self._polls.scan(skip_paused, ahead_ms)
            listed = self._inline.get(names, "poll")
            params = {"names": listed, "limit": limit}
            if len(names) <= q.PER_NAME_MAX:
                lock_due = self._polls.per_name(skip_paused, len(names), ahead_ms)[1]
                params = {"limit": limit, **q.name_params(list(names))}
            clock = (clock_sql.text, {"names": listed, "picked_by": picked_by})

        async def run(cursor: Any) -> PollResult:
            return await lock_and_fetch(
                cursor,
                lock_due.text,
                params,
                self._claim.text,
                clock,
                limit=limit,
                picked_by=picked_by,
                sent=self.on_statement,
            )

        return await names_transaction(self.db, lease, table, run)

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

    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[ExecutionRecord] = (),
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
        writes = [(stmt.text, p, n) for stmt, p, n in self._writes(list(by_key.values()))]
        try:  # on the driver's cursor (``hot``), on ``lease``'s connection
            await cursor_transaction(
                self.db,
                lease,
                functools.partial(write_all, name="finish", writes=writes, sent=self.on_statement),
            )
            return set(by_key)
        except RowsLost:
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
        beaten = await cursor_transaction(self.db, None, functools.partial(self._beat, keys))
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
            sent = self.on_statement
            done = await execute(cursor, "heartbeat", self._heartbeat.text, params, sent)
            return set(params["keys"]) if done == len(set(keys)) else set()
        return await beat(
            cursor, self._lock_beating.text, self._heartbeat_keys.text, params, self.on_statement
        )

    async def _revive_dead(
        self,
        names: Sequence[str],
        dead_after: timedelta,
        own: Own | None,
        held: Collection[TaskKey],
    ) -> Revival:
        """A plain read finds candidates (the usual answer is none) and the next death; a
        transaction then locks them in key order, checks again that they are dead at the
        version seen, and unpicks. The candidates ``held`` or picked by ``own`` since it became
        ready (its name compared here, byte for byte, not by the column's collation) are left
        out (``TaskStore.revive_dead``); the lock checks the version, so what was read of them
        cannot have changed in between."""
        if not names:
            return Revival([], None)
        dead_us = dead_after // timedelta(microseconds=1)
        table = self._names.get(names)
        check = self._polls.dead_by_table(*table.refs) if table else self._dead_candidates
        params: dict[str, Any] = {"dead_us": dead_us}
        if not table:
            params["names"] = self._inline.get(names, "dead")

        async def read(cursor: Any) -> list[Any]:
            await execute(cursor, "dead-execution check", check.text, params, self.on_statement)
            return list(await cursor.fetchall())

        result = await names_transaction(self.db, None, table, read)
        candidates = [
            (r[0], r[1], int(r[2]))
            for r in result
            if r[0] is not None and (r[0], r[1]) not in held and not _ours(own, r[4], r[5])
        ]
        next_death = aware(next((r[3] for r in result if r[0] is None), None))
        if not candidates:
            return Revival([], next_death)

        revived = await self._revive_candidates(candidates, dead_us)
        return Revival(revived, next_death)

    async def _revive_candidates(
        self, candidates: list[tuple[str, str, int]], dead_us: int
    ) -> list[TaskRow]:
        """Lock the candidates in key order (skipping those another transaction holds),
        check again that they are dead at the version seen, and unpick them. A write conflict
        (error 1213: on Galera, a write to these rows committed first on another node, e.g.
        their owner's heartbeat held up with this revival by the same stall) is not run again:
        it would judge the rows by a heartbeat stored with the time its statement began, as old
        as the stall; the next check looks again."""

        async def run(conn: AsyncConnection) -> list[TaskRow]:
            return await self._lock_and_release(conn, candidates, dead_us)

        try:
            return await self.db.transaction(run, read_committed=True, attempts=1)
        except DBAPIError as error:
            if errno(error) != ER_LOCK_DEADLOCK:
                raise
            self.db.write_conflicts += 1
            return []

    async def _lock_and_release(
        self, conn: AsyncConnection, candidates: list[tuple[str, str, int]], dead_us: int
    ) -> list[TaskRow]:
        """In ``conn``'s transaction: lock those of the candidates still dead at the version
        seen and unpick them; the rows it locked."""
        locked = list(
            await conn.execute(self._lock_dead, {**owned_params(candidates), "dead_us": dead_us})
        )
        rows = [self.to_row(r) for r in locked]
        if rows:
            owned = [(r.task_name, r.task_instance, r.version) for r in rows]
            await conn.execute(self._release, owned_params(owned))
        return rows


# -- new rows, written out -----------------------------------------------------------------------

_INSERT_TEXT = 1 << 20
"""Characters per multi-row ``INSERT`` of ``insert_texts`` (about 1 MB, and one row more at
most): far below every server's ``max_allowed_packet`` (4 MB on MySQL 5.7, 16 MB on MariaDB,
64 MB on MySQL 8), and 3,000-4,000 schedule rows of a few fields of data each."""


def _unique(tasks: Iterable[NewTask]) -> dict[TaskKey, NewTask]:
    """The tasks by key, the first of each key."""
    unique: dict[TaskKey, NewTask] = {}
    for task in tasks:
        unique.setdefault((task.task_name, task.task_instance), task)
    return unique


def _by_name(keys: Iterable[TaskKey]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, instance in keys:
        grouped.setdefault(name, []).append(instance)
    return grouped


def existing_text(t: str, driver: Any, name: str, instances: Sequence[str]) -> str:
    """``statements.existing`` with its values written in (``literals.literal``)."""
    listed = "(" + ",".join([literal(driver, i) for i in instances]) + ")"
    return q.existing(t, literal(driver, name), listed)


def insert_texts(
    t: str, driver: Any, tasks: Sequence[NewTask], now: datetime | None
) -> Iterator[tuple[str, int]]:
    """``tasks`` as multi-row ``INSERT`` statements of ``_INSERT_TEXT`` characters at most
    (a longer row goes alone), each with how many of ``tasks`` it holds, in their order.
    Values are written as ``literals.literal`` writes parameters (text in the session's
    quoting, bytes in hexadecimal); each distinct name and time once. A task without a time
    is due at ``now``. Through the driver's own parameters this was 13 µs of client CPU per
    row (its escaping of each time); written here, under 2."""
    names: dict[str, str] = {}
    times: dict[datetime | None, str] = {}
    head = q.insert_rows(t, "")
    rows: list[str] = []
    size = len(head)
    for task in tasks:
        name = names.get(task.task_name)
        if name is None:
            name = names[task.task_name] = literal(driver, task.task_name)
        at = times.get(task.execution_time)
        if at is None:
            due = task.execution_time if task.execution_time is not None else now
            at = times[task.execution_time] = literal(driver, naive_utc(due))
        row = (
            f"({name},{literal(driver, task.task_instance)},{literal(driver, task.task_data)},"
            f"{at},0,1,{literal(driver, task.priority)})"
        )
        if rows and size + len(row) > _INSERT_TEXT:
            yield head + ",".join(rows), len(rows)
            rows, size = [], len(head)
        rows.append(row)
        size += len(row) + 1
    if rows:
        yield head + ",".join(rows), len(rows)


class _Text:
    """Statements written out whole on one of our connections (``Caller``'s ``exec_text``
    and ``driver`` for ``conn``)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def driver(self) -> Any:
        return (await self._conn.get_raw_connection()).driver_connection

    async def exec_text(self, statement: str) -> Any:
        return await self._conn.exec_driver_sql(statement, execution_options=WHOLE_TEXT)


# -- the hot statements on asyncmy's own cursor ------------------------------------------------

T = TypeVar("T")

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")


class RowsLost(Exception):
    """A version-guarded write matched fewer rows than it was given (rolls the transaction
    back; the connection is kept)."""


@functools.lru_cache(maxsize=512)
def driver_sql(sql: str) -> str:
    """A ``statements`` text (``:name``) in asyncmy's ``%(name)s`` style."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


class Inlined:
    """A long list parameter (100,000 task names) written into the statement's text once per
    statement, where it would be escaped element by element at every execution (90 ms of
    CPU for the poll's two statements with 100,000 names). The text is kept per escaping mode
    (``NO_BACKSLASH_ESCAPES`` changes it)."""

    __slots__ = ("_texts", "values")

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = tuple(values)
        self._texts: dict[str, str] = {}

    def literal(self, cursor: Any) -> str:
        """The list as SQL text, ``%`` doubled for the driver's interpolation."""
        mode = cursor.mogrify("%s", ("\\",))
        known = self._texts.get(mode)
        if known is None:
            known = self._texts[mode] = _literal(cursor, self.values)
        return known


class InlinedLists:
    """One ``Inlined`` per statement, kept while its list is the same."""

    def __init__(self) -> None:
        self._by_statement: dict[str, Inlined] = {}

    def get(self, values: Sequence[Any], statement: str) -> Inlined:
        key = tuple(values)
        known = self._by_statement.get(statement)
        if known is None or known.values != key:
            known = self._by_statement[statement] = Inlined(key)
        return known


@functools.lru_cache(maxsize=256)
def _placeholders(count: int, arity: int) -> str:
    one = "%s" if arity == 0 else "(" + ", ".join(["%s"] * arity) + ")"
    return ", ".join([one] * count)


def _literal(cursor: Any, values: Sequence[Any]) -> str:
    """A list (of scalars, or of tuples) as the SQL text ``(a, b)`` / ``((a, b), (c, d))``,
    each value written as a statement's own parameter is (``literals.literal``, as the
    session's SQL mode reads it; asyncmy's own escaping of a tuple's elements ignored
    ``NO_BACKSLASH_ESCAPES``). ``%`` comes doubled, for the driver's interpolation of the
    statement's other parameters."""
    arity = len(values[0]) if values and isinstance(values[0], (tuple, list)) else 0
    flat = tuple(v for row in values for v in row) if arity else tuple(values)
    escaped: str = cursor.mogrify(_placeholders(len(values), arity), flat)
    return f"({escaped})".replace("%", "%%")


_MARKER = re.compile("\x00(\\w+)\x00")


@functools.lru_cache(maxsize=512)
def _template(sql: str, lists: tuple[str, ...]) -> str:
    """``driver_sql(sql)`` with each of the ``lists`` parameters left as a marker."""
    for name in lists:
        sql = re.sub(rf"(?<![:\w]):{name}\b", f"\x00{name}\x00", sql)
    return driver_sql(sql)


async def execute(
    cursor: Any, name: str, sql: str, params: dict[str, Any], sent: Sent = None
) -> int:
    """Run one statement text on the driver's cursor; the rows it matched. A list parameter
    (of scalars, or of tuples) is written into the text as ``(a, b)``, escaped by the driver
    (an ``Inlined`` one once per statement and escaping mode). ``sent`` is told of it first
    (``TaskStore.on_statement``)."""
    if sent is not None:
        sent(name, sql)
    args: dict[str, Any] = {}
    lists: dict[str, str] = {}
    for k, v in params.items():
        if isinstance(v, Inlined):
            lists[k] = v.literal(cursor)
        elif isinstance(v, (list, tuple)):
            lists[k] = _literal(cursor, v)
        else:
            args[k] = v
    if not lists:
        return int(await cursor.execute(driver_sql(sql), args))
    # One pass: a list's text is never searched for another list's marker.
    text = _MARKER.sub(lambda m: lists[m.group(1)], _template(sql, tuple(lists)))
    return int(await cursor.execute(text, args))


def task_row(r: Any) -> TaskRow:
    """A row whose first columns are ``statements.COLUMNS`` (``TaskRow``'s fields, in order):
    asyncmy returns naive UTC times and ``picked`` as a number."""
    (
        task_name, task_instance, task_data, execution_time, picked, picked_by, last_success,
        last_failure, consecutive_failures, last_heartbeat, version, priority,
    ) = r[:q.DB_NOW]  # fmt: skip
    return TaskRow(
        task_name,
        task_instance,
        bytes(task_data) if task_data is not None else None,
        known_time(execution_time),
        bool(picked),
        picked_by,
        aware(last_success),
        aware(last_failure),
        consecutive_failures,
        aware(last_heartbeat),
        int(version),
        priority,
    )


async def cursor_transaction(
    db: MySQLDatabase,
    lease: Lease | None,
    work: Callable[[Any], Awaitable[T]],
    prepare: Callable[[AsyncConnection, Any], Awaitable[None]] | None = None,
) -> T:
    """Run ``work`` (given an asyncmy cursor) in one ``READ COMMITTED`` transaction on
    ``lease``'s connection (or a pooled one) and commit; a deadlock victim is run again. A
    ``RowsLost`` rolls back and keeps the connection; any other error discards it.
    ``prepare`` (the connection, its asyncmy connection) runs first, outside the transaction
    (``names.NamesTable.ensure``)."""
    held = lease if lease is not None else db.lease()
    lost = False
    try:
        async with db.leased(held):
            conn = await held.connection()
            driver = await held.driver()
            if prepare is not None:
                await prepare(conn, driver)
            for attempt in range(1, CONFLICT_RETRIES + 1):
                try:
                    if db.read_committed is not None:
                        await conn.exec_driver_sql(q.READ_COMMITTED)
                    async with driver.cursor() as cursor:
                        result = await work(cursor)
                    await (conn.commit() if conn.in_transaction() else driver.commit())
                    return result
                except RowsLost:
                    await _rollback(conn, driver)
                    lost = True
                    break
                except Exception as error:
                    if errno(error) != ER_LOCK_DEADLOCK or attempt == CONFLICT_RETRIES:
                        raise
                    await _rollback(conn, driver)
                await after_conflict(db, attempt)
    except Exception as error:
        if db.is_missing_table(error):
            raise db.missing_table(error) from error
        raise
    finally:
        if lease is None:
            await held.release()
    assert lost
    raise RowsLost


async def _rollback(conn: AsyncConnection, driver: Any) -> None:
    """End the failed transaction so that the connection can run the next one. A ``COMMIT``
    that failed (a Galera certification conflict is reported there, as error 1213) leaves
    SQLAlchemy's transaction inactive but still present: ``in_transaction()`` is false, and
    until ``rollback()`` every statement on the connection raises ``PendingRollbackError``.
    ``rollback()`` ends it (and the server's transaction); without one (nothing went through
    SQLAlchemy: an engine set to ``READ COMMITTED``) the driver rolls back."""
    if conn.get_transaction() is not None:
        await conn.rollback()
    else:
        await driver.rollback()


async def lock_and_fetch(
    cursor: Any,
    lock_due: str,
    params: dict[str, Any],
    claim: str,
    clock: tuple[str, dict[str, Any]],
    *,
    limit: int,
    picked_by: str,
    sent: Sent = None,
) -> PollResult:
    """In the caller's transaction: lock due rows nobody else holds, claim them, and (when the
    batch is not full) read the clock and the next due time."""
    await execute(cursor, "poll", lock_due, params, sent)
    locked = await cursor.fetchall()
    claimed: list[TaskRow] = []
    if locked:
        now = locked[0][q.DB_NOW]
        keys = [(r[0], r[1]) for r in locked]
        written = await execute(
            cursor, "claim", claim, {"keys": keys, "picked_by": picked_by, "now": now}, sent
        )
        if written != len(keys):  # cannot happen: the rows are locked and unpicked
            raise RuntimeError(f"claimed {written} of {len(keys)} locked rows")
        at = aware(now)
        claimed = [
            row._replace(
                picked=True, picked_by=picked_by, last_heartbeat=at, version=row.version + 1
            )
            for row in map(task_row, locked)
        ]
        if len(locked) >= limit:
            return PollResult(claimed, known_time(now), None)
    await execute(cursor, "poll", *clock, sent)
    rows = await cursor.fetchall()
    row = rows[0]
    held = tuple((r[2], known_time(r[3])) for r in rows if len(r) > 2 and r[2] is not None)
    return PollResult(claimed, known_time(row[0]), aware(row[1]), held=held)


async def write_all(
    cursor: Any, name: str, writes: Sequence[tuple[str, dict[str, Any], int]], sent: Sent = None
) -> None:
    """Each (statement, parameters, rows expected); ``RowsLost`` when one matched fewer."""
    for sql, params, expected in writes:
        if await execute(cursor, name, sql, params, sent) != expected:
            raise RowsLost


async def beat(
    cursor: Any, lock_beating: str, heartbeat_keys: str, params: dict[str, Any], sent: Sent = None
) -> set[TaskKey]:
    """Heartbeat: lock the owned rows nobody else holds (SKIP LOCKED), update those."""
    await execute(cursor, "heartbeat", lock_beating, params, sent)
    locked = [(str(r[0]), str(r[1])) for r in await cursor.fetchall()]
    if locked:
        await execute(cursor, "heartbeat", heartbeat_keys, {"keys": locked}, sent)
    return set(locked)


async def names_transaction(
    db: MySQLDatabase,
    lease: Lease | None,
    table: NamesTable | None,
    work: Callable[[Any], Awaitable[T]],
) -> T:
    """``cursor_transaction``, on a connection that holds ``table`` (when there is one)."""
    if table is None:
        return await cursor_transaction(db, lease, work)
    return await table.retried(lambda: cursor_transaction(db, lease, work, table.ensure))


def _ours(own: Own | None, picked_by: str | None, last_heartbeat: datetime | None) -> bool:
    """A dead-execution candidate picked by this incarnation of the checking instance."""
    if own is None or picked_by != own.name:
        return False
    beaten = aware(last_heartbeat)
    return beaten is not None and beaten >= own.since
