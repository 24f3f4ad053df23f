-- ekbatan-fastapi's streaks of missed slots for MySQL 8+ and MariaDB 10.6+: per recurring task
-- instance, how many slots in a row passed without a run since its last run (CatchUp.latest
-- merged them, the catch-up policy skipped them, they fell due while a run was going), and the
-- due time the row had when the streak was counted: once the row has moved past it (a slot
-- ran), the streak is over and /jobs shows 0. Written only when slots pass (never on a plain
-- completion). scheduled_tasks (V0001) stays db-scheduler's, verbatim. Timestamps are
-- datetime(6) holding UTC, as in V0001; the lengths match ekbatan_fastapi/store/tables.py.

CREATE TABLE ekbatan_missed_streaks (
    task_name     VARCHAR(100)  NOT NULL,
    task_instance VARCHAR(100)  NOT NULL,
    missed        BIGINT        NOT NULL,
    next_time     DATETIME(6)   NOT NULL,
    updated_at    DATETIME(6)   NOT NULL,
    PRIMARY KEY (task_name, task_instance)
);
