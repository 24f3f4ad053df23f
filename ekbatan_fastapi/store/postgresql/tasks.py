"""PostgreSQL's hot path: batched, one round trip each, arrays via ``unnest``.

The hot statements (claim, completion, heartbeat) run on the asyncpg connection under
SQLAlchemy's pooled one, held by the calling loop's ``Lease``: SQLAlchemy's per-statement
checkout, parameter processing and result rows cost several times what asyncpg itself does
(see docs/BENCHMARKS.md), and these statements are all the scheduler sends under load.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from ...domain.rows import (
    ExecutionRecord,
    Finish,
    NewTask,
    Own,
    Owned,
    PollingStrategy,
    PollResult,
    Revival,
    TaskKey,
    TaskRow,
)
from ..database import Lease, chunks, discard_connection
from ..external import Caller
from ..tasks import HistoryTableMissing, HistoryUnwritable, TaskStore
from . import statements as q
from .database import PostgresDatabase, sqlstate

__all__ = ["PostgresTaskStore"]

_INSERT_ROWS = 10_000
"""Tasks per ``insert_missing`` statement: encoding the arrays and building the returned keys
of 100,000 tasks is one stretch of the event loop; 10,000 keep each piece short."""


def _refused_value(error: BaseException) -> bool:
    """A statement the database (or asyncpg, encoding it) refused as a whole: a data,
    integrity, syntax or permission error, not a lost connection or a timeout."""
    code = sqlstate(error)
    if code is not None:
        return code[:2] in ("22", "23", "42")
    return isinstance(error, UnicodeError | ValueError)


_ROW = len(q.COLUMNS)


"""A claimed row's first columns are ``statements.RETURNING``, ``TaskRow``'s fields in order
(asyncpg returns aware times): ``TaskRow._make(r[:_ROW])``."""
_NO_LEAD = timedelta(0)


_KIND_OF_NULL = int(q.KIND_OF_NULL)
_OUTCOME_OF_NULL = q.OUTCOME_OF_NULL.value


def _held(value: str | None) -> tuple[tuple[str, datetime], ...]:
    """The poll's ``held`` (``statements._HELD_COLUMNS``): JSON ``[[name, epoch], ...]``."""
    if not value:
        return ()
    return tuple((str(n), datetime.fromtimestamp(float(e), UTC)) for n, e in json.loads(value))


def _inserted_keys(rows: Sequence[Any]) -> list[TaskKey]:
    """The keys ``statements.insert_missing`` answered (its one row of two arrays)."""
    names, instances = rows[0]
    return list(zip(names, instances, strict=True)) if names else []


def _owned_params(owned: Sequence[Owned]) -> dict[str, Any]:
    """The keys and versions as three arrays (``Owned`` is a named tuple: one transposition)."""
    if not owned:
        return {"names": [], "instances": [], "versions": []}
    names, instances, versions = zip(*owned, strict=True)
    return {"names": list(names), "instances": list(instances), "versions": list(versions)}


class PostgresTaskStore(TaskStore):
    """PostgreSQL 12+ (asyncpg)."""

    supports_skip_locked = True
    supports_notify = True
    writes_history_with_finish = True
    supports_claim_ahead = True

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(db)
        tables = db.tables
        t = db.quoted(tables.tasks)
        h = db.quoted(tables.history)
        p = db.quoted(tables.paused)
        self._t, self._p = t, p
        self._poll_sql: dict[tuple[PollingStrategy, bool, int | None, int], q.Statement] = {}
        """The poll statements, made on first use: by strategy, ``skip_paused``, window and
        lead (``claim_ahead`` in milliseconds)."""
        self._polls: dict[tuple[PollingStrategy, bool, bool, int, int], q.Statement] = {}
        """The same by what ``poll`` is given (strategy, ``skip_paused``, many names or not,
        limit, lead): one lookup per poll, the window not worked out again."""
        self._claim = q.Statement("claim", q.claim(t))
        self._finish_sql = q.Statement("finish", q.finish(t))
        self._finish_history = {
            (retry, same): q.Statement("finish", q.finish(t, h, retry=retry, same_keys=same))
            for retry in (False, True)
            for same in (False, True)
        }
        self._heartbeat = q.Statement("heartbeat", q.heartbeat(t))
        self._revive_sql = text(q.revive_dead(t))
        self._insert_missing = text(q.insert_missing(t))
        self._upsert = {replace: text(q.upsert(t, replace=replace)) for replace in (False, True)}
        self._notify = text(q.notify())
        self._literals: dict[str, tuple[tuple[str, ...], str]] = {}
        """Per statement (``poll``, ``revive``): the last names it was sent, and their
        ``names_literal`` (made once, not per statement)."""
        self.channel = f"ekbatan_{tables.table_name.replace('.', '_')}"[:63]
        """The LISTEN/NOTIFY channel of this table."""

    def _poll_statement(
        self,
        strategy: PollingStrategy,
        skip_paused: bool,
        names: int,
        limit: int,
        ahead_ms: int = 0,
    ) -> q.Statement:
        locking = strategy == PollingStrategy.LOCK_AND_FETCH
        window = q.window(limit, locking=locking) if names < q.MANY_NAMES else None
        key = (strategy, skip_paused, window, ahead_ms)
        stmt = self._poll_sql.get(key)
        if stmt is None:
            make = q.lock_and_fetch if locking else q.fetch_candidates
            p = self._p if skip_paused else None
            stmt = q.Statement("poll", make(self._t, p, window=window, ahead_ms=ahead_ms))
            self._poll_sql[key] = stmt
        return stmt

    def statements(self) -> dict[str, str]:
        lock_and_fetch = self._poll_statement(PollingStrategy.LOCK_AND_FETCH, True, 1, 50)
        fetch_candidates = self._poll_statement(PollingStrategy.FETCH, True, 1, 50)
        return {
            "lock_and_fetch": lock_and_fetch.template,
            "fetch_candidates": fetch_candidates.template,
            "claim": self._claim.template,
            "finish": self._finish_sql.template,
            "finish_history": self._finish_history[False, True].template,
        }

    async def _fetch(
        self, stmt: q.Statement, params: dict[str, Any], lease: Lease | None
    ) -> list[Any]:
        """Run ``stmt`` on asyncpg directly, on ``lease``'s connection (or a pooled one)."""
        held = lease if lease is not None else self.db.lease()
        if self.on_statement is not None:
            self.on_statement(stmt.name, stmt.sql)
        try:
            return await self.db.fetch(held, stmt.sql, [params[name] for name in stmt.order])
        except Exception as error:
            if self.db.is_missing_table(error):
                if self.db.tables.history.name in str(error):
                    raise HistoryTableMissing(str(error)) from error
                raise self.db.missing_table(error) from error
            raise
        finally:
            if lease is None:
                await held.release()

    # -- scheduling -------------------------------------------------------------------------

    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """One statement of arrays per ``_INSERT_ROWS`` tasks (each race-safe on its own), so
        the event loop gets a turn between them."""
        inserted: list[TaskKey] = []
        for chunk in chunks(tasks, _INSERT_ROWS):
            rows = await self.db.rows(self._insert_missing, self._insert_params(chunk))
            inserted += _inserted_keys(rows)
        return sorted(inserted)

    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """``task.execution_time`` None means the database's now."""
        return bool(await self.db.rows(self._upsert[replace], self._upsert_params(task)))

    def _upsert_params(self, task: NewTask) -> dict[str, Any]:
        return {
            "name": task.task_name,
            "instance": task.task_instance,
            "data": task.task_data,
            "time": task.execution_time,
            "priority": task.priority,
            "channel": self.channel,
        }

    @staticmethod
    def _insert_params(tasks: Sequence[NewTask]) -> dict[str, Any]:
        return {
            "names": [t.task_name for t in tasks],
            "instances": [t.task_instance for t in tasks],
            "datas": [t.task_data for t in tasks],
            "times": [t.execution_time for t in tasks],
            "priorities": [t.priority for t in tasks],
        }

    async def upsert_on(self, caller: Caller, task: NewTask, *, replace: bool) -> bool:
        """Its NOTIFY is sent when the caller commits (PostgreSQL's notifications are
        transactional): listeners never hear of a row that is rolled back."""
        result = await caller.execute(self._upsert[replace], self._upsert_params(task))
        return bool(result.fetchall())

    async def insert_missing_on(self, caller: Caller, tasks: Sequence[NewTask]) -> list[TaskKey]:
        if not tasks:
            return []
        result = await caller.execute(self._insert_missing, self._insert_params(tasks))
        return sorted(_inserted_keys(result.fetchall()))

    async def notify_on(self, caller: Caller, execution_time: datetime | None) -> None:
        payload = "" if execution_time is None else str(execution_time.timestamp())
        await caller.execute(self._notify, {"channel": self.channel, "payload": payload})

    async def notify(self, execution_time: datetime | None) -> None:
        payload = "" if execution_time is None else str(execution_time.timestamp())
        await self.db.rows(self._notify, {"channel": self.channel, "payload": payload})

    async def listen(self, on_due: Callable[[datetime | None], None]) -> None:
        """Hold one pooled connection with LISTEN on the table's channel until it is lost."""

        def received(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            try:
                when = datetime.fromtimestamp(float(payload), UTC) if payload else None
            except ValueError:
                when = None  # a notification we did not write: poll to be safe
            on_due(when)

        async with self.db.engine.connect() as conn:
            try:
                raw = await conn.get_raw_connection()
                driver: Any = raw.driver_connection
                lost = asyncio.Event()
                driver.add_termination_listener(lambda _c: lost.set())
                async with asyncio.timeout(self.db.statement_timeout):
                    await driver.add_listener(self.channel, received)
                on_due(None)  # catch up on whatever was scheduled while nobody listened
                await lost.wait()
            finally:
                # Never back to the pool (it still listens), and no UNLISTEN: a connection that
                # died silently would never answer it. Closing the session ends the LISTEN.
                await discard_connection(conn)
        raise ConnectionError(f"the LISTEN connection on channel {self.channel} was lost")

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
        if ahead:
            self.check_lead(ahead)
        ahead_ms = round(ahead.total_seconds() * 1000) if ahead else 0
        many = len(names) >= q.MANY_NAMES
        params: dict[str, Any] = {"limit": limit, "picked_by": picked_by}
        params["names"] = self._names_literal(names) if many else names
        poll = self._polls.get((strategy, skip_paused, many, limit, ahead_ms))
        if poll is None:
            poll = self._poll_statement(strategy, skip_paused, len(names), limit, ahead_ms)
            self._polls[strategy, skip_paused, many, limit, ahead_ms] = poll
        rows = await self._fetch(poll, params, lease)
        first = rows[0]
        if strategy == PollingStrategy.LOCK_AND_FETCH:
            # ``TaskRow._make`` without its Python frame (the slice is always ``_ROW`` long)
            new, row_type = tuple.__new__, TaskRow
            claimed = [new(row_type, r[:_ROW]) for r in rows if r["task_name"] is not None]
            held = first["held"]
            return PollResult(
                claimed, first["db_now"], first["next_due"], held=_held(held) if held else ()
            )
        db_now: datetime = first["db_now"]
        next_due: datetime | None = first["next_due"]
        candidates = [r for r in rows if r["task_name"] is not None]
        if not candidates:
            return PollResult([], db_now, next_due)
        params["names"] = [r["task_name"] for r in candidates]
        params["instances"] = [r["task_instance"] for r in candidates]
        params["versions"] = [r["version"] for r in candidates]
        claimed_rows = await self._fetch(self._claim, params, lease)
        claimed = [TaskRow._make(r[:_ROW]) for r in claimed_rows]
        return PollResult(claimed, db_now, next_due, more_due=len(candidates) >= limit)

    def _names_literal(self, names: Sequence[str], statement: str = "poll") -> str:
        key = tuple(names)
        known = self._literals.get(statement)
        if known is None or key != known[0]:
            known = self._literals[statement] = (key, q.names_literal(key))
        return known[1]

    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[ExecutionRecord] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        if not items:
            if not history:
                return set()
            params: dict[str, Any] = {"names": [], "instances": [], "versions": []}
        else:  # ``_owned_params`` written out: one transposition of the ``Owned`` tuples
            names, instances, versions = zip(*[i.owned for i in items], strict=True)
            params = {
                "names": list(names),
                "instances": list(instances),
                "versions": list(versions),
            }
        columns: list[tuple[str, list[Any], Any]] = [
            ("next_times", [i.next_time for i in items], None),
            ("kinds", [int(i.kind) for i in items], _KIND_OF_NULL),
        ]
        if history:
            same_keys = self._history_params(history, params, columns)
            params["picked_by"] = picked_by
        for key, values, of_null in columns:
            # An array of one column, or NULL where every value is ``of_null`` (the value the
            # statement reads a NULL as: ``unnest`` of several arrays pads a shorter, or NULL,
            # one with NULLs), so that asyncpg does not have to encode (and type-check) each
            # element.
            params[key] = None if values.count(of_null) == len(values) else values
        if not history:
            rows = await self._fetch(self._finish_sql, params, lease)
            return {(r[0], r[1]) for r in rows}
        try:
            rows = await self._fetch(self._finish_history[retry, same_keys], params, lease)
        except HistoryTableMissing:
            raise
        except Exception as error:
            if not _refused_value(error):
                raise
            # The statement failed as a whole (nothing written): because of the history's
            # values or a permission on its table. The results must not wait for it.
            raise HistoryUnwritable(f"{type(error).__name__}: {error}") from error
        return {(r[0], r[1]) for r in rows}

    @staticmethod
    def _history_params(
        history: Sequence[ExecutionRecord],
        finish: dict[str, Any],
        columns: list[tuple[str, list[Any], Any]],
    ) -> bool:
        """Add ``statements.HISTORY_PARAMS``' arrays to ``finish``, the results' parameters,
        and to ``columns`` those sent as NULL when all empty: the records' columns in one
        transposition (an ``ExecutionRecord`` is a named tuple). True when the records are the
        results' rows in order (``finish(same_keys=True)``): their keys and versions are not
        sent again."""
        column = dict(
            zip(ExecutionRecord._fields, map(list, zip(*history, strict=True)), strict=True)
        )
        names, instances, versions = column["task_name"], column["task_instance"], column["version"]
        same: bool = (
            names == finish["names"]
            and instances == finish["instances"]
            and versions == finish["versions"]
        )
        if not same:
            finish["h_names"], finish["h_instances"] = names, instances
            finish["h_versions"] = versions
        finish["h_times"], finish["h_started"] = column["execution_time"], column["started_at"]
        finish["h_finished"] = column["finished_at"]
        columns.append(("h_outcomes", column["outcome"], _OUTCOME_OF_NULL))
        columns.append(("h_classes", column["error_class"], None))
        columns.append(("h_messages", column["error_message"], None))
        return same

    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        if not owned:
            return set()
        rows = await self._fetch(self._heartbeat, _owned_params(owned), None)
        return {(r[0], r[1]) for r in rows}

    async def _revive_dead(
        self,
        names: Sequence[str],
        dead_after: timedelta,
        own: Own | None,
        held: Collection[TaskKey],
    ) -> Revival:
        literal = self._names_literal(names, "revive")  # 100,000 names: no per-name encoding
        params = {
            "names": literal,
            "dead_after": dead_after,
            "own": own.name if own is not None else None,
            "own_since": own.since if own is not None else None,
            "held_names": [k[0] for k in held],
            "held_instances": [k[1] for k in held],
        }
        rows = await self.db.rows(self._revive_sql, params)
        revived = [self.to_row(r) for r in rows if r[0] is not None]
        return Revival(revived, rows[0]._mapping["next_death"])
