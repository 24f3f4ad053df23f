-- ekbatan-fastapi's index on db-scheduler's table for MySQL 8+ and MariaDB 10.6+ (V0001 stays
-- verbatim): every poll reaches the rows of the task names it knows through it, one range per task
-- name, so that rows of names it does not know (another application sharing the table, unresolved
-- rows) are never read. On a big live table, create it first by hand (ALGORITHM=INPLACE, LOCK=NONE;
-- same name and definition): this migration then finds it and records itself as baseline.

CREATE INDEX ekbatan_task_name_priority_idx ON scheduled_tasks (task_name, priority DESC, execution_time);
