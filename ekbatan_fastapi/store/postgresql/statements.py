"""Every PostgreSQL statement of the library's hot path and upkeep, in one place to review:
the polls and the claim, the completion (with its history), the heartbeat, the revival of
dead executions, and scheduling.

Each statement is a function of the quoted table names it reads (``t``: ``scheduled_tasks``,
``h``: the history, ``p``: the paused tasks), so the text is built once per store. Bound
parameters are written ``:name``; ``Statement`` numbers them ``$1, $2, ...`` for the
statements sent to asyncpg itself (the hot path), and the others go through SQLAlchemy's
``text()``.

Multi-row statements take their rows as parallel arrays (``unnest``), so the SQL text is the
same for every batch size and asyncpg prepares it once per connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ...domain.rows import FinishKind, Outcome, TaskRow

__all__ = [
    "HISTORY_PARAMS",
    "KNOWN",
    "MANY_NAMES",
    "RETURNING",
    "Statement",
    "claim",
    "due_by",
    "fetch_candidates",
    "finish",
    "heartbeat",
    "insert_missing",
    "lock_and_fetch",
    "names_literal",
    "notify",
    "revive_dead",
    "upsert",
    "wanted_names",
    "window",
]

COLUMNS = TaskRow._fields
RETURNING = ", ".join(f"t.{c}" for c in COLUMNS)
"""Claimed rows come back with ``TaskRow``'s fields as their first columns, in its order: the
row is ``TaskRow._make`` of them, no position counted by hand."""

# fmt: off
HISTORY_PARAMS = (
    "h_names", "h_instances", "h_versions", "h_times", "h_started", "h_finished", "h_outcomes",
    "h_classes", "h_messages",
)
# fmt: on
"""The history arrays of ``finish(history=True)``."""

_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")


class Statement:
    """A statement for asyncpg itself: ``:name`` parameters become ``$1``, ``$2``..."""

    def __init__(self, name: str, template: str) -> None:
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        self.name = name
        self.template = template
        """The text with ``:name`` parameters (what ``bench/db_limit.py`` hands to pgbench)."""
        self.sql = _PARAMETER.sub(number, template)
        self.order = tuple(order)

    def args(self, params: dict[str, Any]) -> list[Any]:
        return [params[name] for name in self.order]


def names_literal(names: Iterable[str]) -> str:
    """Many task names as one array literal (``{"a","b"}``), the ``:names`` of the polls that
    read the due rows in time order (``MANY_NAMES``): one text parameter, where an array is
    encoded and type-checked by asyncpg element by element at every poll (30 ms of CPU for
    100,000 names). Names have no NUL; a quote or backslash is escaped."""
    quoted = ('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in names)
    return "{" + ",".join(quoted) + "}"


KNOWN = "known AS MATERIALIZED (SELECT unnest(CAST(CAST(:names AS text) AS text[])) AS name)"
"""The names of ``names_literal``, parsed once per statement."""


def due_by(ahead_ms: int = 0) -> str:
    """The time up to which a poll claims rows: ``now()``, or ``ahead_ms`` milliseconds later
    (``claim_ahead``: rows claimed before their time start at it). A constant in the text, so
    the default statements are those of a scheduler without a lead."""
    return "now()" if ahead_ms <= 0 else f"(now() + interval '{int(ahead_ms)} milliseconds')"


def wanted_names(p: str | None) -> str:
    """The task names this instance polls for (``KNOWN``), less the paused ones when ``p``
    is given. ``IS TRUE`` keeps the membership a hashed subplan, one hash probe per row read:
    as a join it could be planned as a loop over the names, and ``= ANY`` of the array would
    be searched linearly in a generic plan and estimated name by name at every custom one
    (1.1-2.4 ms of planning per poll with 1,000 names)."""
    names = "(task_name IN (SELECT name FROM known)) IS TRUE"
    return f"{names} AND task_name NOT IN (SELECT task_name FROM {p})" if p else names


def _next_due(t: str, wanted: str, due: str = "now()") -> str:
    return (
        f"(SELECT min(execution_time) FROM {t} WHERE picked = false AND execution_time > {due} "
        f"AND {wanted})"
    )


# -- reaching the known names' rows through the index --------------------------------------------
#
# The task names this instance knows are reached through ``ekbatan_task_name_priority_idx``
# (migration V0004: ``task_name COLLATE "C"``, the priority with NULL as 32768, which sorts
# above every ``smallint`` as NULL does in ``ORDER BY priority DESC``, and ``execution_time``),
# one index range per (task name, priority): the rows of names it does not know (another
# application sharing the table, unresolved rows) are never read, however many there are. The
# conditions are row comparisons on that index's columns, expression and collation, which no
# other index of the table can serve: the plan is the same whatever the statistics say, custom
# or generic. ``groups`` is a loose index scan: one descent per (task name, priority) with rows.

_KEY = 't.task_name COLLATE "C"'
_PRIORITY = "COALESCE(CAST(t.priority AS integer), 32768)"
_ORDER = f"ORDER BY {_KEY}, {_PRIORITY}, t.execution_time"


def _groups(p: str | None, t: str) -> str:
    """``known`` (the names, less the paused ones) and ``groups`` (each (name, priority) that
    has rows)."""
    paused = f" WHERE n.name NOT IN (SELECT task_name FROM {p})" if p else ""
    return f"""known AS MATERIALIZED (
    SELECT DISTINCT n.name FROM unnest(CAST(:names AS text[])) AS n(name){paused}
), groups AS (
    SELECT f.task_name, f.priority FROM known AS n
    CROSS JOIN LATERAL (
        SELECT t.task_name, {_PRIORITY} AS priority FROM {t} AS t
        WHERE ({_KEY}, {_PRIORITY}) >= (n.name, -32768)
        ORDER BY {_KEY}, {_PRIORITY} LIMIT 1
    ) AS f WHERE f.task_name = n.name
  UNION ALL
    SELECT f.task_name, f.priority FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT t.task_name, {_PRIORITY} AS priority FROM {t} AS t
        WHERE ({_KEY}, {_PRIORITY}) > (g.task_name, g.priority)
        ORDER BY {_KEY}, {_PRIORITY} LIMIT 1
    ) AS f WHERE f.task_name = g.task_name
)"""


def window(limit: int, *, locking: bool) -> int:
    """How many due rows of each (name, priority) a poll of ``limit`` rows looks at: ``limit``
    (fetch) or ``2 x limit`` (lock-and-fetch: room to skip a peer's locked rows), rounded up
    to a power of two. It is written into the statement as a constant: a bound parameter there
    would be estimated at a tenth of the table in a generic plan, which can cost more than the
    poll itself (a plan that expensive is JIT-compiled at every execution)."""
    wanted = max(2 * limit if locking else limit, 16)
    return 1 << (wanted - 1).bit_length()


def _due_candidates(t: str, window: int, due: str = "now()") -> str:
    """``candidates``: per (name, priority), its first ``window`` due unpicked rows."""
    return f"""candidates AS MATERIALIZED (
    SELECT c.* FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT t.task_name, t.task_instance, t.priority, t.execution_time, t.version
        FROM {t} AS t
        WHERE ({_KEY}, {_PRIORITY}) >= (g.task_name, g.priority)
          AND ({_KEY}, {_PRIORITY}, t.execution_time) <= (g.task_name, g.priority, {due})
          AND t.picked = false
        {_ORDER} LIMIT {window}
    ) AS c
)"""


def _next_due_by_group(t: str, due: str = "now()") -> str:
    """The earliest ``execution_time`` after ``due`` of an unpicked row of the known names."""
    return f"""(SELECT min((
        SELECT t.execution_time FROM {t} AS t
        WHERE ({_KEY}, {_PRIORITY}, t.execution_time) > (g.task_name, g.priority, {due})
          AND ({_KEY}, {_PRIORITY}) <= (g.task_name, g.priority) AND t.picked = false
        {_ORDER} LIMIT 1
    )) FROM groups AS g)"""


# -- claiming ----------------------------------------------------------------------------------

HELD_LIMIT = 100
"""Rows picked by other instances a sleeping poll reports at most (``held``)."""


def _held(t: str) -> str:
    """``held``: rows of the known names picked by other instances (their heartbeat is set):
    a recurring one comes due again at its next slot, which the poller wakes for, and a dead
    owner's rows are what the liveness watch looks at. Read only when the poll is about to
    sleep (a batch that was not full), through ``last_heartbeat_idx`` (only picked rows have a
    heartbeat)."""
    return f"""held AS MATERIALIZED (
    SELECT h.task_name, h.task_instance, h.execution_time FROM {t} AS h
    WHERE h.last_heartbeat IS NOT NULL AND h.picked = true AND h.picked_by <> :picked_by
      AND (h.task_name IN (SELECT name FROM known)) IS TRUE
    LIMIT {HELD_LIMIT}
)"""


_HELD_COLUMNS = """CASE WHEN (SELECT count(*) FROM claimed) < :limit THEN (
            SELECT CAST(json_agg(json_build_array(task_name, extract(epoch FROM execution_time)))
                AS text) FROM held
        ) END AS held"""
"""``held`` as one JSON text, ``[[task_name, epoch seconds], ...]``: an array column would make
asyncpg introspect its type (three more round trips) on each new connection's first poll."""


MANY_NAMES = 500
"""From this many task names on, the poll reads the due rows in time order and keeps those of
its names (one index descent per name would cost more than the rows of other names it skips)."""


_CLAIMED = """claimed AS (
    UPDATE {t} AS t
    SET picked = true, picked_by = :picked_by, last_heartbeat = now(), version = t.version + 1
    WHERE t.ctid = ANY(ARRAY(SELECT ctid FROM due))
    RETURNING {returning}
)"""
"""The claim of the rows ``due`` locked, found by their ``ctid`` (a TID scan): a join on the
key could be planned as a hash join over the whole table in a generic plan. A row whose
locked version the statement's snapshot cannot see (a peer changed it just before) is not
claimed, and is reported as skipped."""


def lock_and_fetch(t: str, p: str | None, *, window: int | None = 128, ahead_ms: int = 0) -> str:
    """Claim due rows in one statement (``FOR UPDATE SKIP LOCKED``). ``skipped`` is a due row
    this statement did not claim although the batch had room: another transaction held it
    locked (a peer's claim, or anybody's lock). It is reported as the next due time, which is
    then not in the future, and the scheduler looks again soon. Not computed for a full batch,
    which is polled again at once anyway.

    With a ``window`` (see ``window()``), the rows are reached per known task name (see
    ``_groups``): the candidates are the first ``window`` due rows of each (name, priority),
    locked one by one in claim order, skipping those a peer holds, until ``limit`` are claimed.
    Without, the due rows are read in claim order and those of the names kept (``MANY_NAMES``).
    ``ahead_ms``: rows due up to that many milliseconds from now count as due (``due_by``).
    """
    due = due_by(ahead_ms)
    if window is None:
        return _lock_and_fetch_scan(t, p, due)
    return f"""
WITH RECURSIVE {_groups(p, t)}, {_due_candidates(t, window, due)}, due AS (
    SELECT x.ctid
    FROM (SELECT * FROM candidates ORDER BY priority DESC, execution_time) AS c
    CROSS JOIN LATERAL (
        SELECT t.ctid FROM {t} AS t
        WHERE t.task_name = c.task_name AND t.task_instance = c.task_instance
          AND t.picked = false AND t.execution_time <= {due}
        FOR UPDATE SKIP LOCKED
    ) AS x
    ORDER BY c.priority DESC, c.execution_time
    LIMIT :limit
), {_CLAIMED.format(t=t, returning=RETURNING)}, {_held(t)}
SELECT c.*, x.db_now, COALESCE(x.skipped, x.next_due) AS next_due, x.held
FROM (
    SELECT now() AS db_now, {_next_due_by_group(t, due)} AS next_due,
        CASE WHEN (SELECT count(*) FROM claimed) < :limit THEN (
            SELECT min(execution_time) FROM candidates
            WHERE (task_name, task_instance) NOT IN (SELECT task_name, task_instance FROM claimed)
        ) END AS skipped,
        {_HELD_COLUMNS}
) AS x
LEFT JOIN claimed AS c ON true
"""


def _lock_and_fetch_scan(t: str, p: str | None, due: str) -> str:
    wanted = wanted_names(p)
    return f"""
WITH {KNOWN}, due AS (
    SELECT ctid FROM {t}
    WHERE picked = false AND execution_time <= {due} AND {wanted}
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), {_CLAIMED.format(t=t, returning=RETURNING)}, {_held(t)}
SELECT c.*, x.db_now, COALESCE(x.skipped, x.next_due) AS next_due, x.held
FROM (
    SELECT now() AS db_now, {_next_due(t, wanted, due)} AS next_due,
        CASE WHEN (SELECT count(*) FROM claimed) < :limit THEN (
            SELECT min(execution_time) FROM {t}
            WHERE picked = false AND execution_time <= {due} AND {wanted}
              AND (task_name, task_instance) NOT IN (SELECT task_name, task_instance FROM claimed)
        ) END AS skipped,
        {_HELD_COLUMNS}
) AS x
LEFT JOIN claimed AS c ON true
"""


def fetch_candidates(t: str, p: str | None, *, window: int | None = 64, ahead_ms: int = 0) -> str:
    """Fetch, step 1 (no locks): the clock, the next due time and the candidates (by name
    with a ``window``, as ``lock_and_fetch``; ``ahead_ms`` as there)."""
    due = due_by(ahead_ms)
    if window is not None:
        return f"""
WITH RECURSIVE {_groups(p, t)}, {_due_candidates(t, window, due)}
SELECT c.task_name, c.task_instance, c.version, x.db_now, x.next_due
FROM (SELECT now() AS db_now, {_next_due_by_group(t, due)} AS next_due) AS x
LEFT JOIN LATERAL (
    SELECT * FROM candidates ORDER BY priority DESC, execution_time LIMIT :limit
) AS c ON true
"""
    wanted = wanted_names(p)
    return f"""
WITH {KNOWN}
SELECT c.*, x.db_now, x.next_due
FROM (SELECT now() AS db_now, {_next_due(t, wanted, due)} AS next_due) AS x
LEFT JOIN LATERAL (
    SELECT task_name, task_instance, version FROM {t}
    WHERE picked = false AND execution_time <= {due} AND {wanted}
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
) AS c ON true
"""


def claim(t: str) -> str:
    """Fetch, step 2: the optimistic claim of several candidates at once. Locking in key order
    first keeps two concurrent claimers from deadlocking; the version check is re-evaluated on
    the locked row."""
    return f"""
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
RETURNING {RETURNING}
"""


# -- recording results ---------------------------------------------------------------------------

KIND_OF_NULL = FinishKind.DELETED
"""The kind a NULL ``:kinds`` array stands for in ``finish``: every result deletes its row (a
batch of one-time successes), and asyncpg then need not encode the array element by element."""
OUTCOME_OF_NULL = Outcome.SUCCEEDED
"""The outcome a NULL ``:h_outcomes`` array stands for in ``finish``'s history."""

_SUCCEEDED, _FAILED, _DELETED = (
    int(FinishKind.SUCCEEDED), int(FinishKind.FAILED), int(FinishKind.DELETED)
)  # fmt: skip
"""The kinds in ``finish``'s text (released and skipped leave the counters alone; skipped
moves the time)."""


def finish(t: str, h: str | None = None, *, retry: bool = False, same_keys: bool = False) -> str:
    """Record a batch of results, each write guarded by the owned version; with ``h``, also
    write the execution history in the same statement: one record per execution, its outcome
    ``superseded`` where the version-guarded write matched nothing (the row was revived
    elsewhere). ``retry``: an earlier attempt may have committed (its answer was lost): its
    records are in the table already, and the retry's writes match nothing. Not again.
    ``same_keys``: the records are the results' rows in order, so the history's keys and
    versions are the results' arrays. A NULL array (``unnest`` pads it) stands for one value in
    every row: ``:kinds`` for ``KIND_OF_NULL``, ``:h_outcomes`` for ``OUTCOME_OF_NULL``."""
    history = "" if h is None else _finish_history(h, retry=retry, same_keys=same_keys)
    return f"""
WITH d AS (
    SELECT task_name, task_instance, version, next_time, COALESCE(kind, {KIND_OF_NULL:d}) AS kind
    FROM unnest(
        CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[]),
        CAST(:next_times AS timestamptz[]), CAST(:kinds AS smallint[])
    ) AS d(task_name, task_instance, version, next_time, kind)
), deleted AS (
    DELETE FROM {t} AS t USING d
    WHERE d.kind = {_DELETED} AND t.task_name = d.task_name AND t.task_instance = d.task_instance
      AND t.version = d.version
    RETURNING t.task_name, t.task_instance, d.version
), updated AS (
    UPDATE {t} AS t SET
        execution_time = COALESCE(d.next_time, t.execution_time),
        picked = false, picked_by = NULL, last_heartbeat = NULL,
        last_success = CASE WHEN d.kind = {_SUCCEEDED} THEN now() ELSE t.last_success END,
        last_failure = CASE WHEN d.kind = {_FAILED} THEN now() ELSE t.last_failure END,
        consecutive_failures = CASE d.kind
            WHEN {_SUCCEEDED} THEN 0
            WHEN {_FAILED} THEN COALESCE(t.consecutive_failures, 0) + 1
            ELSE t.consecutive_failures END,
        version = t.version + 1
    FROM d
    WHERE d.kind <> {_DELETED} AND t.task_name = d.task_name AND t.task_instance = d.task_instance
      AND t.version = d.version
    RETURNING t.task_name, t.task_instance, d.version
), done AS (
    SELECT task_name, task_instance, version FROM deleted
    UNION ALL
    SELECT task_name, task_instance, version FROM updated
){history}
SELECT task_name, task_instance FROM done
"""


def _finish_history(h: str, *, retry: bool, same_keys: bool) -> str:
    unwritten = (
        f"""
    WHERE NOT EXISTS (
        SELECT 1 FROM {h} AS w
        WHERE w.task_name = e.task_name AND w.task_instance = e.task_instance
          AND w.execution_time = e.execution_time AND w.started_at = e.started_at
          AND w.picked_by = :picked_by
    )"""
        if retry
        else ""
    )
    keys = (
        "CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[])"
        if same_keys
        else "CAST(:h_names AS text[]), CAST(:h_instances AS text[]), CAST(:h_versions AS bigint[])"
    )
    return f""", history AS (
    INSERT INTO {h} (task_name, task_instance, execution_time, picked_by, started_at,
                     finished_at, outcome, error_class, error_message)
    SELECT e.task_name, e.task_instance, e.execution_time, :picked_by, e.started_at,
           e.finished_at,
           CASE WHEN done.task_name IS NULL THEN 'superseded'
                ELSE COALESCE(e.outcome, '{OUTCOME_OF_NULL.value}') END,
           e.error_class, e.error_message
    FROM unnest(
        {keys},
        CAST(:h_times AS timestamptz[]), CAST(:h_started AS timestamptz[]),
        CAST(:h_finished AS timestamptz[]), CAST(:h_outcomes AS text[]),
        CAST(:h_classes AS text[]), CAST(:h_messages AS text[])
    ) AS e(task_name, task_instance, version, execution_time, started_at, finished_at, outcome,
           error_class, error_message)
    LEFT JOIN done ON done.task_name = e.task_name AND done.task_instance = e.task_instance
        AND done.version = e.version{unwritten}
)"""


# -- keeping rows alive, and scheduling ---------------------------------------------------


def heartbeat(t: str) -> str:
    """Set ``last_heartbeat`` on the owned rows nobody else holds locked (``SKIP LOCKED``);
    answer which rows are still ours (at the owned version, picked), beaten or not. A row held
    is being written by this instance's completion (its result is being recorded), by the
    execution's own ``ctx.transaction()``, or by a transaction that hangs; it is beaten at the
    next round (revival skips locked rows too). Waiting for it instead deadlocked with a
    completion of the same rows, which locks them in another order: PostgreSQL broke the
    cycle after ``deadlock_timeout`` (1 s) by failing the heartbeat, and the completion had
    waited all that time (docs/BENCHMARKS.md, the same-second burst, round 5)."""
    return f"""
WITH d AS (
    SELECT * FROM unnest(
        CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:versions AS bigint[])
    ) AS d(task_name, task_instance, version)
), owned AS MATERIALIZED (
    SELECT t.ctid, t.task_name, t.task_instance FROM {t} AS t
    JOIN d ON t.task_name = d.task_name AND t.task_instance = d.task_instance
    WHERE t.version = d.version AND t.picked = true
), beating AS (
    SELECT t.ctid FROM {t} AS t
    WHERE t.ctid = ANY(ARRAY(SELECT ctid FROM owned)) AND t.picked = true
    FOR UPDATE OF t SKIP LOCKED
), beat AS (
    UPDATE {t} AS t SET last_heartbeat = now()
    WHERE t.ctid = ANY(ARRAY(SELECT ctid FROM beating))
)
SELECT task_name, task_instance FROM owned
"""


def revive_dead(t: str) -> str:
    """Revive dead executions, and answer when the next picked row would die if its heartbeats
    stopped now: the housekeeper looks again then, instead of at its next round (failover
    within milliseconds of the dead window, not up to one heartbeat interval later). The
    names come as one ``names_literal`` (made once per list of names), parsed once per
    statement, and are checked with one hash probe per picked row (``wanted``): an array
    parameter would be encoded and checked name by name by asyncpg at every round (54 ms of
    client CPU for 100,000 names), and ``= ANY`` of it estimated name by name when planned.
    Rows among the ``:held_*`` keys (the executions of the instance that checks) or picked by
    ``:own`` (its name) and beaten since ``:own_since`` (it became ready) are never revived:
    they are alive, whatever their heartbeat says (``TaskStore.revive_dead``)."""
    names = wanted_names(None)
    return f"""
WITH {KNOWN}, dead AS (
    SELECT task_name, task_instance, picked_by, last_heartbeat FROM {t}
    WHERE picked = true AND {names}
      AND (last_heartbeat IS NULL OR last_heartbeat < now() - CAST(:dead_after AS interval))
      AND (CAST(:own AS text) IS NULL OR picked_by IS DISTINCT FROM CAST(:own AS text)
           OR last_heartbeat < CAST(:own_since AS timestamptz))
      AND NOT EXISTS (
          SELECT 1 FROM unnest(CAST(:held_names AS text[]), CAST(:held_instances AS text[]))
              AS h(name, instance)
          WHERE h.name = task_name AND h.instance = task_instance
      )
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
    WHERE picked = true AND {names}
      AND last_heartbeat >= now() - CAST(:dead_after AS interval)
) AS w
LEFT JOIN revived AS r ON true
"""


# -- scheduling ------------------------------------------------------------------------------------


def insert_missing(t: str) -> str:
    """Insert the rows that do not exist. The ``NOT EXISTS`` reads the committed rows without
    waiting: ``ON CONFLICT`` alone would wait for a transaction that holds an existing row
    locked (a stopped process between its ``ctx.transaction()`` completion and its commit),
    and startup with it; it stays for the race with a peer inserting the same key. The keys
    it inserted come back as one row of two arrays (``names``, ``instances``; NULL when it
    inserted none): 100,000 result rows cost the client more CPU than the insert itself."""
    return f"""
WITH inserted AS (
INSERT INTO {t} (task_name, task_instance, task_data, execution_time, picked, version, priority)
SELECT d.task_name, d.task_instance, d.task_data, COALESCE(d.execution_time, now()), false, 1,
       d.priority
FROM unnest(CAST(:names AS text[]), CAST(:instances AS text[]), CAST(:datas AS bytea[]),
            CAST(:times AS timestamptz[]), CAST(:priorities AS smallint[]))
    AS d(task_name, task_instance, task_data, execution_time, priority)
WHERE NOT EXISTS (
    SELECT 1 FROM {t} AS e WHERE e.task_name = d.task_name AND e.task_instance = d.task_instance
)
ON CONFLICT (task_name, task_instance) DO NOTHING
RETURNING task_name, task_instance
)
SELECT array_agg(task_name) AS names, array_agg(task_instance) AS instances FROM inserted
"""


def upsert(t: str, *, replace: bool) -> str:
    """Insert one row (or, with ``replace``, move an unpicked existing one), and notify the
    listeners. The notification is sent at commit, so listeners never see a row that is not
    there yet."""
    action = (
        """UPDATE SET execution_time = EXCLUDED.execution_time, task_data = EXCLUDED.task_data,
    priority = EXCLUDED.priority, version = t.version + 1 WHERE t.picked = false"""
        if replace
        else "NOTHING"
    )
    return f"""
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


def notify() -> str:
    return "SELECT pg_notify(:channel, :payload)"
