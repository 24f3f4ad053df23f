"""PostgreSQL statements for the hot path: batched, one round trip each, arrays via unnest.

Multi-row statements take their rows as parallel arrays (``unnest``), so the SQL text is the
same for every batch size and asyncpg prepares it once per connection.

The hot statements (claim, completion, heartbeat) run on the asyncpg connection under
SQLAlchemy's pooled one, held by the calling loop's ``Lease``: SQLAlchemy's per-statement
checkout, parameter processing and result rows cost several times what asyncpg itself does
(see docs/BENCHMARKS.md), and these statements are all the scheduler sends under load.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError

from ..errors import ConfigurationError
from ..operations.tables import HISTORY
from .base import (
    HistoryTableMissing,
    HistoryUnwritable,
    Lease,
    PollingStrategy,
    TaskRepository,
    discard_connection,
)
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

__all__ = ["PostgresRepository"]

_COLUMNS = (
    "task_name",
    "task_instance",
    "task_data",
    "execution_time",
    "picked",
    "picked_by",
    "last_success",
    "last_failure",
    "consecutive_failures",
    "last_heartbeat",
    "version",
    "priority",
)
_RETURNING = ", ".join(f"t.{c}" for c in _COLUMNS)
"""Claimed rows come back in this column order (decoded by position, see ``_task_row``)."""
_NAMES = "CAST(:names AS text[])"
_NEXT_DUE = (
    "(SELECT min(execution_time) FROM {t} WHERE picked = false AND execution_time > now() "
    "AND %(wanted)s)"
)

# ``skipped``: a due row this statement did not claim although the batch had room. Another
# transaction held it locked (a peer's claim, or anybody's lock); reported as the next due
# time, which is then not in the future, and the scheduler looks again soon. Not computed for
# a full batch, which is polled again at once anyway.
_LOCK_AND_FETCH = """
WITH due AS (
    SELECT task_name, task_instance FROM {t}
    WHERE picked = false AND execution_time <= now() AND %(wanted)s
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {t} AS t
    SET picked = true, picked_by = :picked_by, last_heartbeat = now(), version = t.version + 1
    FROM due
    WHERE t.task_name = due.task_name AND t.task_instance = due.task_instance
    RETURNING %(returning)s
)
SELECT c.*, x.db_now, COALESCE(x.skipped, x.next_due)
FROM (
    SELECT now() AS db_now, %(next_due)s AS next_due,
        CASE WHEN (SELECT count(*) FROM due) < :limit THEN (
            SELECT min(execution_time) FROM {t}
            WHERE picked = false AND execution_time <= now() AND %(wanted)s
              AND (task_name, task_instance) NOT IN (SELECT task_name, task_instance FROM due)
        ) END AS skipped
) AS x
LEFT JOIN claimed AS c ON true
"""

_FETCH_CANDIDATES = """
SELECT c.*, x.db_now, x.next_due
FROM (SELECT now() AS db_now, %(next_due)s AS next_due) AS x
LEFT JOIN LATERAL (
    SELECT task_name, task_instance, version FROM {t}
    WHERE picked = false AND execution_time <= now() AND %(wanted)s
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
) AS c ON true
"""

# Optimistic claim of several candidates at once. Locking in key order first keeps two
# concurrent claimers from deadlocking; the version check is re-evaluated on the locked row.
_CLAIM = """
WITH candidates AS (
    SELECT t.task_name, t.task_instance FROM {t} AS t
    JOIN unnest(CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[]))
        AS d(task_name, task_instance, version)
      ON t.task_name = d.task_name AND t.task_instance = d.task_instance
    WHERE t.version = d.version AND t.picked = false
    ORDER BY t.task_name, t.task_instance
    FOR UPDATE OF t
)
UPDATE {t} AS t
SET picked = true, picked_by = :picked_by, last_heartbeat = now(), version = t.version + 1
FROM candidates
WHERE t.task_name = candidates.task_name AND t.task_instance = candidates.task_instance
RETURNING %(returning)s
"""

_FINISH = """
WITH d AS (
    SELECT * FROM unnest(
        CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[]),
        CAST(:next_times AS timestamptz[]), CAST(:kinds AS smallint[])
    ) AS d(task_name, task_instance, version, next_time, kind)
), deleted AS (
    DELETE FROM {t} AS t USING d
    WHERE d.kind = 3 AND t.task_name = d.task_name AND t.task_instance = d.task_instance
      AND t.version = d.version
    RETURNING t.task_name, t.task_instance, d.version
), updated AS (
    UPDATE {t} AS t SET
        execution_time = COALESCE(d.next_time, t.execution_time),
        picked = false, picked_by = NULL, last_heartbeat = NULL,
        last_success = CASE WHEN d.kind = 0 THEN now() ELSE t.last_success END,
        last_failure = CASE WHEN d.kind = 1 THEN now() ELSE t.last_failure END,
        consecutive_failures = CASE d.kind
            WHEN 0 THEN 0
            WHEN 1 THEN COALESCE(t.consecutive_failures, 0) + 1
            ELSE t.consecutive_failures END,
        version = t.version + 1
    FROM d
    WHERE d.kind <> 3 AND t.task_name = d.task_name AND t.task_instance = d.task_instance
      AND t.version = d.version
    RETURNING t.task_name, t.task_instance, d.version
), done AS (
    SELECT task_name, task_instance, version FROM deleted
    UNION ALL
    SELECT task_name, task_instance, version FROM updated
)%(history)s
SELECT task_name, task_instance FROM done
"""

# The same completion also writing the execution history: one record per execution, its
# outcome "superseded" where the version-guarded write above matched nothing (the row was
# revived elsewhere). No separate statement, round trip or commit for the history.
_FINISH_HISTORY = """, history AS (
    INSERT INTO {h} (task_name, task_instance, execution_time, picked_by, started_at,
                     finished_at, outcome, error_class, error_message)
    SELECT e.task_name, e.task_instance, e.execution_time, :picked_by, e.started_at,
           e.finished_at, CASE WHEN done.task_name IS NULL THEN 'superseded' ELSE e.outcome END,
           e.error_class, e.error_message
    FROM unnest(
        CAST(:h_names AS text[]), CAST(:h_instances AS text[]), CAST(:h_versions AS bigint[]),
        CAST(:h_times AS timestamptz[]), CAST(:h_started AS timestamptz[]),
        CAST(:h_finished AS timestamptz[]), CAST(:h_outcomes AS text[]),
        CAST(:h_classes AS text[]), CAST(:h_messages AS text[])
    ) AS e(task_name, task_instance, version, execution_time, started_at, finished_at, outcome,
           error_class, error_message)
    LEFT JOIN done ON done.task_name = e.task_name AND done.task_instance = e.task_instance
        AND done.version = e.version%(unwritten)s
)"""

# On a retry after an error, an earlier attempt may have committed (its answer was lost): its
# records are in the table already, and the retry's writes match nothing. Not again.
_NOT_WRITTEN = """
    WHERE NOT EXISTS (
        SELECT 1 FROM {h} AS w
        WHERE w.task_name = e.task_name AND w.task_instance = e.task_instance
          AND w.execution_time = e.execution_time AND w.started_at = e.started_at
          AND w.picked_by = :picked_by
    )"""

_HEARTBEAT = """
UPDATE {t} AS t SET last_heartbeat = now()
FROM unnest(CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[]))
    AS d(task_name, task_instance, version)
WHERE t.task_name = d.task_name AND t.task_instance = d.task_instance
  AND t.version = d.version AND t.picked = true
RETURNING t.task_name, t.task_instance
"""

# Also answers when the next picked row would die if its heartbeats stopped now: the
# housekeeper looks again then, instead of at its next round (failover within milliseconds of
# the dead window, not up to one heartbeat interval later).
_REVIVE_DEAD = """
WITH dead AS (
    SELECT task_name, task_instance, picked_by, last_heartbeat FROM {t}
    WHERE picked = true AND task_name = ANY(CAST(:names AS text[]))
      AND (last_heartbeat IS NULL OR last_heartbeat < now() - CAST(:dead_after AS interval))
    ORDER BY task_name, task_instance
    FOR UPDATE SKIP LOCKED
), revived AS (
    UPDATE {t} AS t
    SET picked = false, picked_by = NULL, last_heartbeat = NULL, version = t.version + 1
    FROM dead
    WHERE t.task_name = dead.task_name AND t.task_instance = dead.task_instance
    RETURNING t.task_name, t.task_instance, t.task_data, t.execution_time, true AS picked,
        dead.picked_by, t.last_success, t.last_failure, t.consecutive_failures,
        dead.last_heartbeat, t.version - 1 AS version, t.priority
)
SELECT r.*, w.next_death
FROM (
    SELECT min(last_heartbeat) + CAST(:dead_after AS interval) AS next_death FROM {t}
    WHERE picked = true AND task_name = ANY(CAST(:names AS text[]))
      AND last_heartbeat >= now() - CAST(:dead_after AS interval)
) AS w
LEFT JOIN revived AS r ON true
"""

_INSERT_MISSING = """
INSERT INTO {t} (task_name, task_instance, task_data, execution_time, picked, version, priority)
SELECT d.task_name, d.task_instance, d.task_data, COALESCE(d.execution_time, now()), false, 1,
       d.priority
FROM unnest(CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:datas AS bytea[]),
            CAST(:times AS timestamptz[]), CAST(:priorities AS smallint[]))
    AS d(task_name, task_instance, task_data, execution_time, priority)
ON CONFLICT (task_name, task_instance) DO NOTHING
RETURNING task_name, task_instance
"""

# The notification is sent at commit, so listeners never see a row that is not there yet.
_UPSERT = """
WITH written AS (
    INSERT INTO {t} AS t (task_name, task_instance, task_data, execution_time, picked, version,
                          priority)
    VALUES (:name, :instance, :data, COALESCE(CAST(:time AS timestamptz), now()), false, 1,
            :priority)
    ON CONFLICT (task_name, task_instance) DO {action}
    RETURNING t.task_name, t.execution_time
)
SELECT task_name, pg_notify(:channel, CAST(extract(epoch FROM execution_time) AS text))
FROM written
"""
_NOTIFY = "SELECT pg_notify(:channel, :payload)"
_REPLACE = """UPDATE SET execution_time = EXCLUDED.execution_time, task_data = EXCLUDED.task_data,
    priority = EXCLUDED.priority, version = t.version + 1 WHERE t.picked = false"""


_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")


_HISTORY_PARAMS = (
    "h_names",
    "h_instances",
    "h_versions",
    "h_times",
    "h_started",
    "h_finished",
    "h_outcomes",
    "h_classes",
    "h_messages",
)
"""``_FINISH_HISTORY``'s arrays, in ``HistoryEntry``'s field order."""
assert len(_HISTORY_PARAMS) == len(HistoryEntry._fields)


class _Raw:
    """A statement for asyncpg itself: ``:name`` parameters become ``$1``, ``$2``..."""

    def __init__(self, template: str) -> None:
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        self.template = template
        """The text with ``:name`` parameters (what ``bench/db_limit.py`` hands to pgbench)."""
        self.sql = _PARAMETER.sub(number, template)
        self.order = tuple(order)

    def args(self, params: dict[str, Any]) -> list[Any]:
        return [params[name] for name in self.order]


def _refused_value(error: BaseException) -> bool:
    """A statement the database (or asyncpg, encoding it) refused as a whole: a data,
    integrity, syntax or permission error, not a lost connection or a timeout."""
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate[:2] in ("22", "23", "42")
    return isinstance(error, UnicodeError | ValueError)


def _task_row(r: Any) -> TaskRow:
    """A claimed row, by position (``_RETURNING``'s order); asyncpg returns aware times."""
    return TaskRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11])


class PostgresRepository(TaskRepository):
    """PostgreSQL 12+ (asyncpg)."""

    dialect_name = "postgresql"
    supports_skip_locked = True
    supports_notify = True
    writes_history_with_finish = True

    def __init__(self, engine: Any, table_name: str) -> None:
        driver = getattr(getattr(engine, "dialect", None), "driver", "asyncpg")
        if driver != "asyncpg":
            raise ConfigurationError(
                f"the PostgreSQL dialect needs the asyncpg driver, got {driver!r}: use a "
                "postgresql+asyncpg:// URL (or an engine created from one)"
            )
        super().__init__(engine, table_name)
        quoted = ".".join(f'"{part}"' for part in table_name.split("."))

        def fill(template: str, **parts: str) -> str:
            return (template % parts if parts else template).replace("{t}", quoted)

        def sql(template: str, **parts: str) -> TextClause:
            return text(fill(template, **parts))

        def raw(template: str, **parts: str) -> _Raw:
            return _Raw(fill(template, **parts))

        wanted = f"task_name = ANY({_NAMES})"
        paused = ".".join(f'"{part}"' for part in self.pause_table_name.split("."))
        not_paused = f"{wanted} AND task_name NOT IN (SELECT task_name FROM {paused})"
        self._poll_sql: dict[bool, tuple[_Raw, _Raw]] = {}
        for with_pause, filter_ in ((False, wanted), (True, not_paused)):
            parts = {
                "next_due": _NEXT_DUE % {"wanted": filter_},
                "wanted": filter_,
                "returning": _RETURNING,
            }
            self._poll_sql[with_pause] = (
                raw(_LOCK_AND_FETCH, **parts),
                raw(_FETCH_CANDIDATES, **parts),
            )
        self._claim = raw(_CLAIM, returning=_RETURNING)
        schema = self.table.schema
        self.history_table_name = f"{schema}.{HISTORY}" if schema else HISTORY
        history = ".".join(f'"{part}"' for part in self.history_table_name.split("."))
        self._finish = raw(_FINISH, history="")
        self._finish_history = {
            retry: raw(
                _FINISH,
                history=(_FINISH_HISTORY % {"unwritten": _NOT_WRITTEN if retry else ""}).replace(
                    "{h}", history
                ),
            )
            for retry in (False, True)
        }
        self._heartbeat = raw(_HEARTBEAT)
        self._revive_dead = sql(_REVIVE_DEAD)
        self._insert_missing = sql(_INSERT_MISSING)
        self._upsert_keep = sql(_UPSERT.replace("{action}", "NOTHING"))
        self._upsert_replace = sql(_UPSERT.replace("{action}", _REPLACE))
        self._notify = text(_NOTIFY)
        self.channel = f"ekbatan_{table_name.replace('.', '_')}"[:63]

    def is_missing_table(self, error: DBAPIError) -> bool:
        return getattr(error.orig, "sqlstate", None) == "42P01"

    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        if not tasks:
            return []
        rows = await self._rows(
            self._insert_missing,
            {
                "names": [t.task_name for t in tasks],
                "instances": [t.task_instance for t in tasks],
                "datas": [t.task_data for t in tasks],
                "times": [t.execution_time for t in tasks],
                "priorities": [t.priority for t in tasks],
            },
        )
        return [(r[0], r[1]) for r in rows]

    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """``task.execution_time`` None means the database's now."""
        stmt = self._upsert_replace if replace else self._upsert_keep
        rows = await self._rows(
            stmt,
            {
                "name": task.task_name,
                "instance": task.task_instance,
                "data": task.task_data,
                "time": task.execution_time,
                "priority": task.priority,
                "channel": self.channel,
            },
        )
        return bool(rows)

    async def notify(self, execution_time: datetime | None) -> None:
        payload = "" if execution_time is None else str(execution_time.timestamp())
        await self._rows(self._notify, {"channel": self.channel, "payload": payload})

    async def listen(self, on_due: Callable[[datetime | None], None]) -> None:
        """Hold one pooled connection with LISTEN on the table's channel until it is lost."""

        def received(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            try:
                when = datetime.fromtimestamp(float(payload), UTC) if payload else None
            except ValueError:
                when = None  # a notification we did not write: poll to be safe
            on_due(when)

        async with self.engine.connect() as conn:
            try:
                raw = await conn.get_raw_connection()
                driver: Any = raw.driver_connection
                lost = asyncio.Event()
                driver.add_termination_listener(lambda _c: lost.set())
                async with asyncio.timeout(self.statement_timeout):
                    await driver.add_listener(self.channel, received)
                on_due(None)  # catch up on whatever was scheduled while nobody listened
                await lost.wait()
            finally:
                # Never back to the pool (it still listens), and no UNLISTEN: a connection that
                # died silently would never answer it. Closing the session ends the LISTEN.
                await discard_connection(conn)
        raise ConnectionError(f"the LISTEN connection on channel {self.channel} was lost")

    async def _fetch(self, stmt: _Raw, params: dict[str, Any], lease: Lease | None) -> list[Any]:
        """Run ``stmt`` on asyncpg directly, on ``lease``'s connection (or a pooled one)."""
        held = lease if lease is not None else self.lease()
        try:
            async with self._leased(held):
                driver = await held.driver()
                return list(await driver.fetch(stmt.sql, *stmt.args(params)))
        except Exception as error:
            if getattr(error, "sqlstate", None) == "42P01":
                if HISTORY in str(error):
                    raise HistoryTableMissing(str(error)) from error
                raise self.missing_table_error() from error
            raise
        finally:
            if lease is None:
                await held.release()

    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: str,
        *,
        lease: Lease | None = None,
    ) -> PollResult:
        params: dict[str, Any] = {"names": list(names), "limit": limit, "picked_by": picked_by}
        lock_and_fetch, fetch_candidates = self._poll_sql[self.pauses_enabled]
        if strategy == PollingStrategy.LOCK_AND_FETCH:
            rows = await self._fetch(lock_and_fetch, params, lease)
            claimed = [_task_row(r) for r in rows if r[0] is not None]
            return PollResult(claimed, rows[0][12], rows[0][13])
        rows = await self._fetch(fetch_candidates, params, lease)
        db_now: datetime = rows[0][3]
        next_due: datetime | None = rows[0][4]
        candidates = [r for r in rows if r[0] is not None]
        if not candidates:
            return PollResult([], db_now, next_due)
        params["names"] = [r[0] for r in candidates]
        params["instances"] = [r[1] for r in candidates]
        params["versions"] = [r[2] for r in candidates]
        claimed_rows = await self._fetch(self._claim, params, lease)
        claimed = [_task_row(r) for r in claimed_rows]
        return PollResult(claimed, db_now, next_due, more_due=len(candidates) >= limit)

    @staticmethod
    def _owned_params(owned: Sequence[Owned]) -> dict[str, Any]:
        return {
            "names": [o.task_name for o in owned],
            "instances": [o.task_instance for o in owned],
            "versions": [o.version for o in owned],
        }

    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[HistoryEntry] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        if not items and not history:
            return set()
        params = self._owned_params([i.owned for i in items])
        params["next_times"] = [i.next_time for i in items]
        params["kinds"] = [int(i.kind) for i in items]
        if not history:
            rows = await self._fetch(self._finish, params, lease)
            return {(r[0], r[1]) for r in rows}
        columns = list(zip(*history, strict=True))
        params.update(zip(_HISTORY_PARAMS, columns, strict=True))
        params["picked_by"] = picked_by
        try:
            rows = await self._fetch(self._finish_history[retry], params, lease)
        except HistoryTableMissing:
            raise
        except Exception as error:
            if not _refused_value(error):
                raise
            # The statement failed as a whole (nothing written): because of the history's
            # values or a permission on its table. The results must not wait for it.
            raise HistoryUnwritable(f"{type(error).__name__}: {error}") from error
        return {(r[0], r[1]) for r in rows}

    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        if not owned:
            return set()
        rows = await self._fetch(self._heartbeat, self._owned_params(owned), None)
        return {(r[0], r[1]) for r in rows}

    async def revive_dead(self, names: Sequence[str], dead_after: timedelta) -> list[TaskRow]:
        return (await self.revive_and_watch(names, dead_after))[0]

    async def revive_and_watch(
        self, names: Sequence[str], dead_after: timedelta
    ) -> tuple[list[TaskRow], datetime | None]:
        rows = await self._rows(self._revive_dead, {"names": list(names), "dead_after": dead_after})
        revived = [self.to_row(r) for r in rows if r[0] is not None]
        return revived, rows[0]._mapping["next_death"]


# _FINISH spells FinishKind's values as literals: 0 succeeded, 1 failed, 2 released, 3 deleted.
assert [k.value for k in FinishKind] == [0, 1, 2, 3]
