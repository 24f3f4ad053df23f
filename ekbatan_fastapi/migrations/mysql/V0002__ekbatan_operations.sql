-- ekbatan-fastapi's own tables for MySQL 8+ and MariaDB 10.6+; scheduled_tasks (V0001) stays
-- db-scheduler's, verbatim. Timestamps are datetime(6) holding UTC, as in V0001. Text columns are
-- bounded varchars (indexable); the lengths match ekbatan_fastapi/store/tables.py.

CREATE TABLE ekbatan_execution_history (
    id             BIGINT        NOT NULL AUTO_INCREMENT,
    task_name      VARCHAR(100)  NOT NULL,
    task_instance  VARCHAR(100)  NOT NULL,
    execution_time DATETIME(6)   NOT NULL,
    picked_by      VARCHAR(50),
    started_at     DATETIME(6)   NOT NULL,
    finished_at    DATETIME(6)   NOT NULL,
    outcome        VARCHAR(20)   NOT NULL,
    error_class    VARCHAR(200),
    error_message  VARCHAR(2000),
    PRIMARY KEY (id),
    INDEX ekbatan_history_task_idx (task_name, id),
    INDEX ekbatan_history_finished_idx (finished_at)
);

CREATE TABLE ekbatan_paused_tasks (
    task_name  VARCHAR(100)  NOT NULL,
    paused_by  VARCHAR(200),
    paused_at  DATETIME(6)   NOT NULL,
    reason     VARCHAR(1000),
    PRIMARY KEY (task_name)
);

CREATE TABLE ekbatan_scheduler_instances (
    name            VARCHAR(50)  NOT NULL,
    host            VARCHAR(255) NOT NULL,
    pid             INT          NOT NULL,
    started_at      DATETIME(6)  NOT NULL,
    last_seen       DATETIME(6)  NOT NULL,
    library_version VARCHAR(50)  NOT NULL,
    PRIMARY KEY (name)
);
