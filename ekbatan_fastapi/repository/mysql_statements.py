"""The MySQL/MariaDB statements, in one place to review (used by ``mysql.py``).

``{t}`` is the quoted table name; ``%(name)s`` parts are filled in once, when the repository
is built; ``:name`` are bound parameters (``IN :names`` / ``IN :keys`` expand lists, or lists of
tuples). Every timestamp is UTC: the clock is ``UTC_TIMESTAMP(6)``, never ``NOW()``.
"""

from __future__ import annotations

COLUMNS = (
    "task_name, task_instance, task_data, execution_time, picked, picked_by, last_success, "
    "last_failure, consecutive_failures, last_heartbeat, version, priority"
)
KEY = "(task_name, task_instance)"
OWNED = "(task_name, task_instance, version)"
NOW = "UTC_TIMESTAMP(6)"
# %(wanted)s: the task names this instance polls for (less the paused ones once the
# operations tables exist).
WANTED = "task_name IN :names"
NEXT_DUE = (
    "(SELECT MIN(execution_time) FROM {t} "
    f"WHERE picked = 0 AND execution_time > {NOW} AND %(wanted)s)"
)
DEAD = (
    f"picked = 1 AND (last_heartbeat IS NULL "
    f"OR last_heartbeat < {NOW} - INTERVAL :dead_us MICROSECOND)"
)

READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

# Fetch, step 1 (no locks): the clock, the next due time and the candidates, in one statement.
CANDIDATES = f"""
SELECT x.db_now, x.next_due, c.task_name, c.task_instance, c.version
FROM (SELECT {NOW} AS db_now, {NEXT_DUE} AS next_due) AS x
LEFT JOIN (
    SELECT task_name, task_instance, version, priority, execution_time FROM {{t}}
    WHERE picked = 0 AND execution_time <= {NOW} AND %(wanted)s
    ORDER BY priority DESC, execution_time ASC
    LIMIT :limit
) AS c ON TRUE
ORDER BY c.priority DESC, c.execution_time ASC
"""

# Fetch, step 2: lock the candidates in key order; those still unpicked at the version we saw
# are claimed (the optimistic check, made under the row lock).
LOCK_KEYS = f"""
SELECT {COLUMNS}, {NOW} AS db_now FROM {{t}}
WHERE {KEY} IN :keys
ORDER BY task_name, task_instance
FOR UPDATE
"""

# Lock-and-fetch: lock due rows nobody else holds; claimed by CLAIM in the same transaction.
LOCK_DUE = f"""
SELECT {COLUMNS}, {NOW} AS db_now FROM {{t}}
WHERE picked = 0 AND execution_time <= {NOW} AND %(wanted)s
ORDER BY priority DESC, execution_time ASC
LIMIT :limit
FOR UPDATE SKIP LOCKED
"""

# Lock-and-fetch, after the claim and in its transaction: the clock and the earliest unpicked
# time, due or not. A due time here is a row this poll did not get: a peer held its lock (a
# peer's claim, or a peer's scan that locks a row while it checks it), or it came due between
# LOCK_DUE's clock and this one. The scheduler then looks again soon instead of a poll
# interval later.
EARLIEST = "(SELECT MIN(execution_time) FROM {t} WHERE picked = 0 AND %(wanted)s)"
CLOCK = f"SELECT {NOW} AS db_now, {EARLIEST} AS next_due"

CLAIM = f"""
UPDATE {{t}} SET picked = 1, picked_by = :picked_by, last_heartbeat = :now, version = version + 1
WHERE {KEY} IN :keys AND picked = 0
"""

LOCK_OWNED = f"""
SELECT task_name, task_instance, version FROM {{t}}
WHERE {KEY} IN :keys
ORDER BY task_name, task_instance
FOR UPDATE
"""

# Recording results: every write is guarded by the version the claim wrote.
DELETE = f"DELETE FROM {{t}} WHERE {OWNED} IN :owned"

RELEASE = f"""
UPDATE {{t}} SET picked = 0, picked_by = NULL, last_heartbeat = NULL, version = version + 1
WHERE {OWNED} IN :owned
"""

# %(next_time)s is a CASE over the batch's keys (NULL for a key without a next time).
SUCCEEDED = f"""
UPDATE {{t}} SET execution_time = COALESCE(%(next_time)s, execution_time),
    picked = 0, picked_by = NULL, last_heartbeat = NULL,
    last_success = {NOW}, consecutive_failures = 0, version = version + 1
WHERE {OWNED} IN :owned
"""
FAILED = f"""
UPDATE {{t}} SET execution_time = COALESCE(%(next_time)s, execution_time),
    picked = 0, picked_by = NULL, last_heartbeat = NULL,
    last_failure = {NOW}, consecutive_failures = COALESCE(consecutive_failures, 0) + 1,
    version = version + 1
WHERE {OWNED} IN :owned
"""

HEARTBEAT = f"""
UPDATE {{t}} SET last_heartbeat = {NOW}
WHERE {OWNED} IN :owned AND picked = 1
"""
STILL_OWNED = f"SELECT task_name, task_instance FROM {{t}} WHERE {OWNED} IN :owned AND picked = 1"

# The candidates, and (in the row with a NULL key) when the next picked row would die if its
# heartbeats stopped now.
DEAD_CANDIDATES = f"""
SELECT task_name, task_instance, version, NULL AS next_death FROM {{t}}
WHERE task_name IN :names AND {DEAD}
UNION ALL
SELECT NULL, NULL, NULL, MIN(last_heartbeat) + INTERVAL :dead_us MICROSECOND FROM {{t}}
WHERE task_name IN :names AND picked = 1
  AND last_heartbeat >= {NOW} - INTERVAL :dead_us MICROSECOND
"""
LOCK_DEAD = f"""
SELECT {COLUMNS} FROM {{t}}
WHERE {OWNED} IN :owned AND {DEAD}
ORDER BY task_name, task_instance
FOR UPDATE%(skip_locked)s
"""

EXISTING = f"SELECT task_name, task_instance FROM {{t}} WHERE {KEY} IN :keys"

REPLACE = f"""
UPDATE {{t}} SET execution_time = COALESCE(:time, {NOW}), task_data = :data,
    priority = :priority, version = version + 1
WHERE task_name = :name AND task_instance = :instance AND picked = 0
"""
