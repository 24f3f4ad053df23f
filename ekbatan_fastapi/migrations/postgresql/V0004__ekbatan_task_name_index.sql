-- ekbatan-fastapi's index on db-scheduler's table (V0001 stays verbatim): every poll reaches the
-- rows of the task names it knows through it, one range per (task name, priority), so that rows
-- of names it does not know (another application sharing the table, unresolved rows) are never
-- read. A NULL priority is indexed as 32768, above every smallint, where ORDER BY priority DESC
-- puts it. On a big live table, create it first by hand with CREATE INDEX CONCURRENTLY (same
-- name and definition): this migration then finds it and records itself as baseline.

CREATE INDEX IF NOT EXISTS ekbatan_task_name_priority_idx ON scheduled_tasks (task_name COLLATE "C", (COALESCE(CAST(priority AS integer), 32768)), execution_time);
