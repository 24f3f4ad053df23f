-- ekbatan-fastapi's own tables; scheduled_tasks (V0001) stays db-scheduler's, verbatim.

CREATE TABLE ekbatan_execution_history (
    id             BIGSERIAL PRIMARY KEY,
    task_name      TEXT NOT NULL,
    task_instance  TEXT NOT NULL,
    execution_time TIMESTAMP WITH TIME ZONE NOT NULL,
    picked_by      TEXT,
    started_at     TIMESTAMP WITH TIME ZONE NOT NULL,
    finished_at    TIMESTAMP WITH TIME ZONE NOT NULL,
    outcome        TEXT NOT NULL,
    error_class    TEXT,
    error_message  TEXT
);

CREATE INDEX ekbatan_history_task_idx     ON ekbatan_execution_history (task_name, id);
CREATE INDEX ekbatan_history_finished_idx ON ekbatan_execution_history (finished_at);

CREATE TABLE ekbatan_paused_tasks (
    task_name  TEXT PRIMARY KEY,
    paused_by  TEXT,
    paused_at  TIMESTAMP WITH TIME ZONE NOT NULL,
    reason     TEXT
);

CREATE TABLE ekbatan_scheduler_instances (
    name            TEXT PRIMARY KEY,
    host            TEXT NOT NULL,
    pid             INT NOT NULL,
    started_at      TIMESTAMP WITH TIME ZONE NOT NULL,
    last_seen       TIMESTAMP WITH TIME ZONE NOT NULL,
    library_version TEXT NOT NULL
);
