"""The PostgreSQL statements that keep rows alive and put them in the table: the heartbeat,
the revival of dead executions, and scheduling. The claim and the completion are in
``statements.py``, whose conventions these follow (``:name`` parameters, arrays for many
rows, names as one ``names_literal``)."""

from __future__ import annotations

from .statements import KNOWN, wanted_names

__all__ = ["heartbeat", "insert_missing", "notify", "revive_dead", "upsert"]


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
    client CPU for 100,000 names), and ``= ANY`` of it estimated name by name when planned."""
    names = wanted_names(None)
    return f"""
WITH {KNOWN}, dead AS (
    SELECT task_name, task_instance, picked_by, last_heartbeat FROM {t}
    WHERE picked = true AND {names}
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
    and startup with it; it stays for the race with a peer inserting the same key."""
    return f"""
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
