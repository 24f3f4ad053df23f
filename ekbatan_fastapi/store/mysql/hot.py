"""The MySQL/MariaDB hot statements on asyncmy's own cursor, under SQLAlchemy's connection.

The claim (lock-and-fetch), the completion's first, version-guarded attempt and the heartbeat
are all the scheduler sends under load. Through SQLAlchemy each costs more client CPU than the
server spends on it: the expansion of the ``IN :keys`` lists (the statement is compiled again
for every list length), parameter processing and ``Row`` objects (see docs/BENCHMARKS.md,
"MariaDB's own limit"). Here the texts of ``statements`` are sent with asyncmy's own
``%(name)s`` interpolation (a list goes as a tuple, which the driver writes as ``(a, b)``;
the server receives the same literal text either way) on the connection a busy loop holds
(``Lease``), and rows are decoded by position.

The transaction itself still starts and ends through SQLAlchemy's connection (the isolation
statement, ``COMMIT``): its events see the session (the test clock's ``SET timestamp``) and
its state stays true. (On an engine set to ``READ COMMITTED`` for an application's
``AUTOCOMMIT`` one, no statement went through SQLAlchemy: the driver commits.)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from ...domain.rows import PollResult, TaskKey, TaskRow
from ..database import aware, known_time
from ..lease import Lease
from ..probe import probes
from . import statements as q
from .database import ER_LOCK_DEADLOCK, MySQLDatabase, errno

__all__ = [
    "Inlined",
    "InlinedLists",
    "RowsLost",
    "beat",
    "driver_sql",
    "execute",
    "lock_and_fetch",
    "task_row",
    "transaction",
    "write_all",
]

T = TypeVar("T")

_DEADLOCK_RETRIES = 5
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
    each value escaped by the driver as a statement's own parameter is: asyncmy escapes the
    elements of a tuple parameter without regard to ``NO_BACKSLASH_ESCAPES``, which would
    break (or change) a name with a quote or a backslash in that mode. ``%`` comes doubled,
    for the driver's interpolation of the statement's other parameters."""
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


async def execute(cursor: Any, name: str, sql: str, params: dict[str, Any]) -> int:
    """Run one statement text on the driver's cursor; the rows it matched. A list parameter
    (of scalars, or of tuples) is written into the text as ``(a, b)``, escaped by the driver
    (an ``Inlined`` one once per statement and escaping mode)."""
    if probes.active:
        probes.statement(name, sql)
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
    """A row of ``statements.COLUMNS``, by position (asyncmy returns naive UTC times)."""
    execution_time = aware(r[3])
    assert execution_time is not None
    return TaskRow(
        r[0],
        r[1],
        bytes(r[2]) if r[2] is not None else None,
        execution_time,
        bool(r[4]),
        r[5],
        aware(r[6]),
        aware(r[7]),
        r[8],
        aware(r[9]),
        int(r[10]),
        r[11],
    )


async def transaction(
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
            for attempt in range(1, _DEADLOCK_RETRIES + 1):
                try:
                    if db.read_committed is not None:
                        await conn.exec_driver_sql(q.READ_COMMITTED)
                    async with driver.cursor() as cursor:
                        result = await work(cursor)
                    await (conn.commit() if conn.in_transaction() else driver.commit())
                    return result
                except RowsLost:
                    await (conn.rollback() if conn.in_transaction() else driver.rollback())
                    lost = True
                    break
                except Exception as error:
                    if errno(error) != ER_LOCK_DEADLOCK or attempt == _DEADLOCK_RETRIES:
                        raise
                    await (conn.rollback() if conn.in_transaction() else driver.rollback())
    except Exception as error:
        if db.is_missing_table(error):
            raise db.missing_table(error) from error
        raise
    finally:
        if lease is None:
            await held.release()
    assert lost
    raise RowsLost


async def lock_and_fetch(
    cursor: Any,
    lock_due: str,
    params: dict[str, Any],
    claim: str,
    clock: tuple[str, dict[str, Any]],
    *,
    limit: int,
    picked_by: str,
) -> PollResult:
    """In the caller's transaction: lock due rows nobody else holds, claim them, and (when the
    batch is not full) read the clock and the next due time."""
    await execute(cursor, "poll", lock_due, params)
    locked = await cursor.fetchall()
    claimed: list[TaskRow] = []
    if locked:
        now = locked[0][12]
        keys = [(r[0], r[1]) for r in locked]
        written = await execute(
            cursor, "claim", claim, {"keys": keys, "picked_by": picked_by, "now": now}
        )
        if written != len(keys):  # cannot happen: the rows are locked and unpicked
            raise RuntimeError(f"claimed {written} of {len(keys)} locked rows")
        at = aware(now)
        claimed = [
            task_row(r)._replace(
                picked=True,
                picked_by=picked_by,
                last_heartbeat=at,
                version=int(r[10]) + 1,
            )
            for r in locked
        ]
        if len(locked) >= limit:
            return PollResult(claimed, known_time(now), None)
    await execute(cursor, "poll", *clock)
    row = await cursor.fetchone()
    return PollResult(claimed, known_time(row[0]), aware(row[1]))


async def write_all(
    cursor: Any, name: str, writes: Sequence[tuple[str, dict[str, Any], int]]
) -> None:
    """Each (statement, parameters, rows expected); ``RowsLost`` when one matched fewer."""
    for sql, params, expected in writes:
        if await execute(cursor, name, sql, params) != expected:
            raise RowsLost


async def beat(
    cursor: Any, lock_beating: str, heartbeat_keys: str, params: dict[str, Any]
) -> set[TaskKey]:
    """Heartbeat: lock the owned rows nobody else holds (SKIP LOCKED), update those."""
    await execute(cursor, "heartbeat", lock_beating, params)
    locked = [(str(r[0]), str(r[1])) for r in await cursor.fetchall()]
    if locked:
        await execute(cursor, "heartbeat", heartbeat_keys, {"keys": locked})
    return set(locked)
