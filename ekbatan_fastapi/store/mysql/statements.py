"""Every MySQL/MariaDB statement of the library, in one place to review.

Each statement is a function of the quoted table names it reads (``t``: ``scheduled_tasks``,
``p``: the paused tasks), so the text is built once per store. ``:name`` are bound parameters
(``IN :names`` / ``IN :keys`` / ``IN :owned`` expand lists, or lists of tuples; ``EXPANDING``
says which). Every timestamp is UTC: the clock is ``UTC_TIMESTAMP(6)``, never ``NOW()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from sqlalchemy import TextClause

from ...domain.rows import TaskRow

__all__ = [
    "BY_KEY",
    "CLOCK",
    "COLUMNS",
    "DB_NOW",
    "EXISTING_MAX",
    "EXPANDING",
    "INSERT_COLUMNS",
    "NAMES_TABLE_PREFIX",
    "NOW",
    "PER_NAME_MAX",
    "READ_COMMITTED",
    "RESTORE_LOCK_WAIT",
    "SHORT_LOCK_WAIT",
    "PollStatements",
    "candidates",
    "candidates_per_name",
    "claim",
    "clock",
    "copy_names_table",
    "create_names_table",
    "dead_candidates",
    "delete_owned",
    "due_by",
    "empty_names_table",
    "existing",
    "fill_names",
    "fill_names_from",
    "heartbeat",
    "heartbeat_keys",
    "insert_rows",
    "lock_beating",
    "lock_dead",
    "lock_due",
    "lock_due_per_name",
    "lock_keys",
    "lock_owned",
    "name_params",
    "release",
    "replace",
    "reschedule_owned",
    "still_owned",
]

COLUMNS = ", ".join(TaskRow._fields)
"""The columns of a row read whole: ``TaskRow``'s fields, in its order (``tasks.task_row``); a
locking poll adds the database's clock after them (``DB_NOW``)."""
DB_NOW = len(TaskRow._fields)
"""The position of ``db_now`` in the rows of the locking polls: right after ``COLUMNS``."""
KEY = "(task_name, task_instance)"
# The owned rows: the key pairs first, so that the optimizer reads them by the primary key
# (a three-column row constructor alone can make MariaDB scan the table, and a scanning
# DELETE or locking read waits for every row another transaction holds).
OWNED = "(task_name, task_instance) IN :keys AND (task_name, task_instance, version) IN :owned"
BY_KEY = "FORCE INDEX (PRIMARY)"
"""In every statement that reads rows by their keys (``IN :keys``). Without it, MariaDB 10.11's
range optimizer also weighs ``ekbatan_task_name_priority_idx`` (its first column is the key's
first) for the pairs: 2.4-2.7 ms of planning for a claim ``UPDATE`` or a completion ``DELETE``
of 50 keys, against 0.2-0.3 ms, though the plan is the primary key either way
(docs/BENCHMARKS.md, "MariaDB's own limit"). ``FORCE``, not ``USE``: on a small table
(300 rows) both the bare statement and ``USE INDEX`` scan the whole table, which locks or waits
for rows other transactions hold. ``DELETE`` takes index hints only in its multi-table form
(so the MySQL manual says, and MariaDB's grammar)."""
NOW = "UTC_TIMESTAMP(6)"
CLOCK = f"SELECT {NOW}"


def due_by(ahead_ms: int = 0) -> str:
    """The time up to which a poll claims rows: ``NOW``, or ``ahead_ms`` milliseconds later
    (``claim_ahead``; MySQL has no ``MILLISECOND`` unit). A constant in the text, so the
    default statements are unchanged."""
    return NOW if ahead_ms <= 0 else f"({NOW} + INTERVAL {int(ahead_ms) * 1000} MICROSECOND)"


DEAD = (
    f"picked = 1 AND (last_heartbeat IS NULL "
    f"OR last_heartbeat < {NOW} - INTERVAL :dead_us MICROSECOND)"
)
READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
SHORT_LOCK_WAIT = (
    "SET @ekbatan_lock_wait = @@SESSION.innodb_lock_wait_timeout, "
    "SESSION innodb_lock_wait_timeout = 1"
)
"""Where ``SKIP LOCKED`` is missing: a row lock waited for at most a second (the session's own
bound is kept aside for ``RESTORE_LOCK_WAIT``)."""
RESTORE_LOCK_WAIT = "SET SESSION innodb_lock_wait_timeout = @ekbatan_lock_wait"
"""The session's bound as it was (the pool's, see ``connect.py``; not the server's default)."""
EXPANDING = ("names", "keys", "owned", "instances")
"""The list parameters (``IN :x``); every statement's parameter of these names expands."""


def _wanted(p: str | None, k: str | None = None) -> str:
    """The task names this instance polls for (the ``:names`` list, or the rows of the names
    table ``k``), less the paused ones when ``p`` is given."""
    names = f"task_name IN (SELECT task_name FROM {k})" if k else "task_name IN :names"
    return f"{names} AND task_name NOT IN (SELECT task_name FROM {p})" if p else names


def _next_due(t: str, p: str | None, k: str | None, due: str | None = None) -> str:
    """The earliest ``execution_time`` of this instance's unpicked rows (after ``due`` when
    given). With the names in a table (``k``) the rows are read in time order and joined to
    it, in that order (``STRAIGHT_JOIN``): ``execution_time_idx`` walked to the first row of
    ours, one names-table lookup per row. Left to itself the optimizer may start from the
    names and read every row of every name (all 100,000 rows of 100,000 names, 140-270 ms;
    4,800 rows of 600 names), as a ``MIN`` would."""
    if not k:
        # In time order, not ``MIN``: ``MIN`` reads every row of the names (the primary key's
        # range: 100,000 schedules of one PersistentScheduleJob, 80 ms per idle poll), the
        # ordered read walks ``execution_time_idx`` to the first row of ours.
        after = f" AND execution_time > {due}" if due else ""
        return (
            f"(SELECT execution_time FROM {t} WHERE picked = 0{after} AND {_wanted(p)} "
            "ORDER BY execution_time LIMIT 1)"
        )
    after = f" AND s.execution_time > {due}" if due else ""
    paused = f" AND s.task_name NOT IN (SELECT task_name FROM {p})" if p else ""
    return (
        f"(SELECT s.execution_time FROM {t} AS s STRAIGHT_JOIN {k} AS n "
        f"ON n.task_name = s.task_name WHERE s.picked = 0{after}{paused} "
        "ORDER BY s.execution_time LIMIT 1)"
    )


def _unless_full(t: str, p: str | None, due: str, next_due: str) -> str:
    """``next_due`` only when fewer than ``:limit`` rows are due: a full batch makes the
    poller poll again at once, without reading it. The ``MIN`` runs through
    ``ekbatan_task_name_priority_idx`` once foreign rows make the time index the worse choice,
    and there a name's due rows come before its future ones: with a backlog it read all of them
    at every poll (20,204 rows for 20,000 due; 304 so). MySQL evaluates a ``CASE`` branch only
    when it is taken."""
    due_rows = (
        f"SELECT 1 FROM {t} WHERE picked = 0 AND execution_time <= {due} AND {_wanted(p)} "
        "LIMIT :limit"
    )
    return f"CASE WHEN (SELECT COUNT(*) FROM ({due_rows}) AS d) < :limit THEN {next_due} END"


NAMES_TABLE_PREFIX = "ekbatan_names_"
"""The session temporary tables of job names (``store/mysql/names.py``) start so."""


def create_names_table(k: str, t: str) -> str:
    """A session temporary table ``k`` with the type and collation of ``t``'s ``task_name``
    (copied from the column: a different collation would keep the index from the join)."""
    return (
        f"CREATE TEMPORARY TABLE {k} (PRIMARY KEY (task_name)) "
        f"SELECT task_name FROM {t} WHERE FALSE"
    )


def copy_names_table(k2: str, k: str) -> str:
    """A second temporary table like ``k`` (``names.NamesTable``: MySQL opens a temporary
    table once per statement)."""
    return f"CREATE TEMPORARY TABLE {k2} LIKE {k}"


def fill_names_from(k2: str, k: str) -> str:
    return f"INSERT INTO {k2} (task_name) SELECT task_name FROM {k}"


def empty_names_table(k: str) -> str:
    return f"DELETE FROM {k}"


def fill_names(k: str, values: str) -> str:
    """``values`` is the driver-escaped ``(a), (b), ...`` list. Two names equal under the
    column's collation (``Job``, ``job``) are one row, as an ``IN`` list matches them (no
    ``INSERT IGNORE``: it warns, and would truncate a name that is too long)."""
    return (
        f"INSERT INTO {k} (task_name) VALUES {values} ON DUPLICATE KEY UPDATE task_name = task_name"
    )


PER_NAME_MAX = 100
"""Up to this many job names, a poll reads each name's due rows through
``ekbatan_task_name_priority_idx`` (migration V0004), one ``UNION ALL`` part per name, so rows
of names it does not know are never read; beyond it, the due rows in time order with the
names filtered (one statement of that size per poll costs more than it saves unless the table
holds many foreign rows)."""


def name_params(names: list[str]) -> dict[str, str]:
    """The bound parameters of ``_due_per_name``: ``:name_0``, ``:name_1``, ..."""
    return {f"name_{i}": name for i, name in enumerate(names)}


def _due_per_name(t: str, p: str | None, count: int, due: str = NOW) -> str:
    """The best ``:limit`` due unpicked rows of ``count`` names (no locks): per name a ``ref``
    on ``ekbatan_task_name_priority_idx`` read in claim order, stopping at ``:limit``; rows of
    other names are never read. (A name's future rows are walked when it has fewer due rows
    than the limit, as its index range runs on past them.)"""
    paused = f" AND task_name NOT IN (SELECT task_name FROM {p})" if p else ""
    parts = " UNION ALL ".join(
        f"(SELECT task_name, task_instance, priority, execution_time FROM {t} "
        f"WHERE task_name = :name_{i} AND picked = 0 AND execution_time <= {due}{paused} "
        "ORDER BY priority DESC, execution_time ASC LIMIT :limit)"
        for i in range(count)
    )
    return f"{parts} ORDER BY priority DESC, execution_time ASC LIMIT :limit"


# -- claiming ----------------------------------------------------------------------------------


def candidates(
    t: str, p: str | None, due: str = NOW, k: str | None = None, k2: str | None = None
) -> str:
    """Fetch, step 1 (no locks): the clock, the next due time and the candidates (due by
    ``due``: ``due_by``; the names from the table ``k`` when given, and its twin ``k2`` for
    the next due time: MySQL opens a temporary table once per statement)."""
    wanted = _wanted(p, k)
    next_due = _next_due(t, p, k2 or k, due)
    if not k:  # (a names table is walked in time order from ``due``: no backlog read)
        next_due = _unless_full(t, p, due, next_due)
    return f"""
SELECT x.db_now, x.next_due, c.task_name, c.task_instance, c.version
FROM (SELECT {NOW} AS db_now, {next_due} AS next_due) AS x
LEFT JOIN (
    SELECT task_name, task_instance, version, priority, execution_time FROM {t}
    WHERE picked = 0 AND execution_time <= {due} AND {wanted}
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
) AS c ON TRUE
ORDER BY c.priority DESC, c.execution_time ASC
"""


def candidates_per_name(t: str, p: str | None, count: int, due: str = NOW) -> str:
    """As ``candidates`` for ``count`` names given as ``:name_<i>`` (and ``:names`` for the
    next due time)."""
    if count == 1:
        paused = f" AND task_name NOT IN (SELECT task_name FROM {p})" if p else ""
        rows = (
            f"SELECT task_name, task_instance, version, priority, execution_time FROM {t} "
            f"WHERE task_name = :name_0 AND picked = 0 AND execution_time <= {due}{paused} "
            "ORDER BY priority DESC, execution_time ASC LIMIT :limit"
        )
    else:
        rows = (
            "SELECT k.task_name, k.task_instance, r.version, k.priority, k.execution_time "
            f"FROM ({_due_per_name(t, p, count, due)}) AS k JOIN {t} AS r "
            "ON r.task_name = k.task_name AND r.task_instance = k.task_instance"
        )
    next_due = _unless_full(t, p, due, _next_due(t, p, None, due))
    return f"""
SELECT x.db_now, x.next_due, c.task_name, c.task_instance, c.version
FROM (SELECT {NOW} AS db_now, {next_due} AS next_due) AS x
LEFT JOIN ({rows}) AS c ON TRUE
ORDER BY c.priority DESC, c.execution_time ASC
"""


def lock_keys(t: str) -> str:
    """Fetch, step 2: lock the candidates in key order; those still unpicked at the version
    seen are claimed (the optimistic check, made under the row lock)."""
    return f"""
SELECT {COLUMNS}, {NOW} AS db_now FROM {t} {BY_KEY}
WHERE {KEY} IN :keys
ORDER BY task_name, task_instance
FOR UPDATE
"""


def lock_due(t: str, p: str | None, due: str = NOW, k: str | None = None) -> str:
    """Lock-and-fetch: lock due rows nobody else holds; claimed by ``claim`` in the same
    transaction."""
    return f"""
SELECT {COLUMNS}, {NOW} AS db_now FROM {t}
WHERE picked = 0 AND execution_time <= {due} AND {_wanted(p, k)}
ORDER BY priority DESC, execution_time ASC
LIMIT :limit
FOR UPDATE SKIP LOCKED
"""


def lock_due_per_name(t: str, p: str | None, count: int, due: str = NOW) -> str:
    """As ``lock_due`` for ``count`` names given as ``:name_<i>``: the candidates are read
    without locks through our index, then those rows locked by primary key (skipping those a
    peer holds) and checked again."""
    if count == 1:  # one name: its index range in claim order, locked as it is read
        paused = f" AND task_name NOT IN (SELECT task_name FROM {p})" if p else ""
        return f"""
SELECT {COLUMNS}, {NOW} AS db_now FROM {t}
WHERE task_name = :name_0 AND picked = 0 AND execution_time <= {due}{paused}
ORDER BY priority DESC, execution_time ASC
LIMIT :limit
FOR UPDATE SKIP LOCKED
"""
    cols = ", ".join(f"r.{c}" for c in TaskRow._fields)
    return f"""
SELECT {cols}, {NOW} AS db_now
FROM ({_due_per_name(t, p, count, due)}) AS k
JOIN {t} AS r ON r.task_name = k.task_name AND r.task_instance = k.task_instance
WHERE r.picked = 0 AND r.execution_time <= {due}
ORDER BY k.priority DESC, k.execution_time ASC
FOR UPDATE SKIP LOCKED
"""


def clock(t: str, p: str | None, k: str | None = None, k2: str | None = None) -> str:
    """Lock-and-fetch, after the claim and in its transaction: the clock and the earliest
    unpicked time, due or not, and the rows other instances hold (``held``). A due time here
    is a row this poll did not get: a peer held its lock (a peer's claim, or a peer's scan
    that locks a row while it checks it), or it came due between ``lock_due``'s clock and
    this one. The scheduler then looks again soon instead of a poll interval later. With the
    names in a table, the due time reads ``k`` and the held rows its twin ``k2`` (each
    opened once, as MySQL requires)."""
    next_due = _next_due(t, p, k)
    if k and not k2:  # no twin to read the held rows from
        return f"SELECT {NOW} AS db_now, {next_due} AS next_due"
    return f"""
SELECT x.db_now, x.next_due, h.task_name, h.execution_time
FROM (SELECT {NOW} AS db_now, {next_due} AS next_due) AS x
LEFT JOIN ({held(t, k2 if k else None)}) AS h ON TRUE
"""


HELD_LIMIT = 100
"""Rows picked by other instances a sleeping poll reports at most."""


def held(t: str, k: str | None = None) -> str:
    """Rows of the polled names (the ``:names`` list, or the names table ``k``) picked by
    other instances (only picked rows have a heartbeat: ``last_heartbeat_idx``): a recurring
    one comes due again at its next slot, and their owners are what the liveness watch
    judges (``PollResult.held``)."""
    return (
        f"SELECT task_name, execution_time FROM {t} WHERE last_heartbeat IS NOT NULL "
        f"AND picked = 1 AND picked_by <> :picked_by AND {_wanted(None, k)} LIMIT {HELD_LIMIT}"
    )


def claim(t: str) -> str:
    return f"""
UPDATE {t} {BY_KEY}
SET picked = 1, picked_by = :picked_by, last_heartbeat = :now, version = version + 1
WHERE {KEY} IN :keys AND picked = 0
"""


# -- recording results: every write is guarded by the version the claim wrote ----------------------


def lock_owned(t: str) -> str:
    return f"""
SELECT task_name, task_instance, version FROM {t} {BY_KEY}
WHERE {KEY} IN :keys
ORDER BY task_name, task_instance
FOR UPDATE
"""


def delete_owned(t: str) -> str:
    return f"DELETE d FROM {t} AS d {BY_KEY} WHERE {OWNED}"


def release(t: str) -> str:
    return f"""
UPDATE {t} {BY_KEY} SET picked = 0, picked_by = NULL, last_heartbeat = NULL, version = version + 1
WHERE {OWNED}
"""


def reschedule_owned(t: str, next_time: str, *, outcome: str) -> str:
    """Reschedule owned rows after a ``succeeded``, ``failed`` or ``skipped`` (counters left
    alone) slot; ``next_time`` is a ``CASE`` over the batch's keys (NULL for a key without a
    next time)."""
    counters = {
        "failed": f"last_failure = {NOW}, "
        "consecutive_failures = COALESCE(consecutive_failures, 0) + 1, ",
        "succeeded": f"last_success = {NOW}, consecutive_failures = 0, ",
        "skipped": "",
    }[outcome]
    return f"""
UPDATE {t} {BY_KEY} SET execution_time = COALESCE({next_time}, execution_time),
    picked = 0, picked_by = NULL, last_heartbeat = NULL,
    {counters}version = version + 1
WHERE {OWNED}
"""


def heartbeat(t: str) -> str:
    return f"""
UPDATE {t} {BY_KEY} SET last_heartbeat = {NOW}
WHERE {OWNED} AND picked = 1
"""


def lock_beating(t: str) -> str:
    """Heartbeat, step 1 (SKIP LOCKED): lock the owned rows no other transaction holds. One
    held by a transaction that hangs (a peer's claim orphaned by a partition keeps every due
    row it scanned) is left for the next round: a plain ``UPDATE`` would wait for it, and
    every other row of this instance would miss its heartbeat meanwhile and be revived."""
    return f"""
SELECT task_name, task_instance FROM {t} {BY_KEY}
WHERE {OWNED} AND picked = 1
ORDER BY task_name, task_instance
FOR UPDATE SKIP LOCKED
"""


def heartbeat_keys(t: str) -> str:
    """Heartbeat, step 2: the rows ``lock_beating`` locked."""
    return f"UPDATE {t} {BY_KEY} SET last_heartbeat = {NOW} WHERE {KEY} IN :keys"


def still_owned(t: str) -> str:
    return f"SELECT task_name, task_instance FROM {t} {BY_KEY} WHERE {OWNED} AND picked = 1"


def dead_candidates(t: str, k: str | None = None, k2: str | None = None) -> str:
    """The candidates, and (in the row with a NULL key) when the next picked row would die if
    its heartbeats stopped now (the names from the table ``k`` and its twin ``k2`` when
    given, one per part); with each candidate, who picked it and its last heartbeat."""
    return f"""
SELECT task_name, task_instance, version, NULL AS next_death, picked_by, last_heartbeat
FROM {t}
WHERE {_wanted(None, k)} AND {DEAD}
UNION ALL
SELECT NULL, NULL, NULL, MIN(last_heartbeat) + INTERVAL :dead_us MICROSECOND, NULL, NULL
FROM {t}
WHERE {_wanted(None, k2 or k)} AND picked = 1
  AND last_heartbeat >= {NOW} - INTERVAL :dead_us MICROSECOND
"""


def lock_dead(t: str, *, skip_locked: bool) -> str:
    return f"""
SELECT {COLUMNS} FROM {t} {BY_KEY}
WHERE {OWNED} AND {DEAD}
ORDER BY task_name, task_instance
FOR UPDATE{" SKIP LOCKED" if skip_locked else ""}
"""


# -- scheduling ------------------------------------------------------------------------------------


EXISTING_MAX = 900
"""Instance ids per ``existing`` statement: below MariaDB's ``in_predicate_conversion_threshold``
(1,000), so the list is read as ranges of the primary key, as on MySQL. (A list of key pairs
turned into a join scans the whole table: 1,000 pairs read 200,000 rows of a 200,000-row
table, 1,000 ids of one name 1,000.)"""

INSERT_COLUMNS = "task_name, task_instance, task_data, execution_time, picked, version, priority"
"""The columns of a new row, in the order of ``insert_rows``' values."""


def existing(t: str, name: str = ":name", instances: str = ":instances") -> str:
    """Which of the ``instances`` of task ``name`` have a row (one name per statement; both
    given as parameters, or written in: ``tasks.existing_text``)."""
    return (
        f"SELECT task_name, task_instance FROM {t} {BY_KEY} "
        f"WHERE task_name = {name} AND task_instance IN {instances}"
    )


def insert_rows(t: str, values: str) -> str:
    """A multi-row ``INSERT`` of new rows: ``values`` is ``(...), (...)``, ``INSERT_COLUMNS``
    each, written out (``tasks.insert_texts``)."""
    return f"INSERT INTO {t} ({INSERT_COLUMNS}) VALUES {values}"


def replace(t: str) -> str:
    return f"""
UPDATE {t} SET execution_time = COALESCE(:time, {NOW}), task_data = :data,
    priority = :priority, version = version + 1
WHERE task_name = :name AND task_instance = :instance AND picked = 0
"""


# -- the poll statements of one table, built once per arguments --------------------------------


class PollStatements:
    """The poll statements of one ``scheduled_tasks`` table (``t``) and pause table (``p``),
    both quoted; each built once per instance and arguments (``functools.cache``)."""

    def __init__(self, sql: Callable[[str], TextClause], t: str, p: str) -> None:
        self._sql, self._t, self._p = sql, t, p
        self.scan = functools.cache(self._scan)
        self.per_name = functools.cache(self._per_name)
        self.by_table = functools.cache(self._by_table)
        self.dead_by_table = functools.cache(self._dead_by_table)

    def _scan(self, skip_paused: bool, ahead_ms: int) -> tuple[TextClause, TextClause, TextClause]:
        """(candidates, lock_due, clock) reading the due rows in time order."""
        p, due, sql = self._p if skip_paused else None, due_by(ahead_ms), self._sql
        return (
            sql(candidates(self._t, p, due)),
            sql(lock_due(self._t, p, due)),
            sql(clock(self._t, p)),
        )

    def _per_name(
        self, skip_paused: bool, count: int, ahead_ms: int
    ) -> tuple[TextClause, TextClause]:
        """(candidates, lock_due) reading ``count`` names' rows through our index."""
        p, due, sql = self._p if skip_paused else None, due_by(ahead_ms), self._sql
        return (
            sql(candidates_per_name(self._t, p, count, due)),
            sql(lock_due_per_name(self._t, p, count, due)),
        )

    def _by_table(
        self, skip_paused: bool, ahead_ms: int, k: str, k2: str
    ) -> tuple[TextClause, TextClause, TextClause]:
        """As ``scan``, the names read from the temporary table ``k`` (and its twin ``k2``:
        each statement opens each table once, as MySQL requires)."""
        p, due, sql = self._p if skip_paused else None, due_by(ahead_ms), self._sql
        return (
            sql(candidates(self._t, p, due, k, k2)),
            sql(lock_due(self._t, p, due, k)),
            sql(clock(self._t, p, k, k2)),
        )

    def _dead_by_table(self, k: str, k2: str) -> TextClause:
        """The dead-execution check's candidates, the names read from ``k`` and ``k2``."""
        return self._sql(dead_candidates(self._t, k, k2))
