-- ekbatan-fastapi's requests to stop a running execution for MySQL 8+ and MariaDB 10.6+
-- (client.cancel_running, the admin route POST /jobs/{name}/cancel, `ekbatan-jobs cancel`):
-- one row per task instance, naming the claim (version) it stops, who asked and why.
-- The instance that runs it reads the rows of what it runs once per heartbeat round (only while
-- it runs something), cancels the execution and deletes the row. scheduled_tasks (V0001) stays
-- db-scheduler's, verbatim. Timestamps are datetime(6) holding UTC, as in V0001; the lengths
-- match ekbatan_fastapi/store/tables.py.

CREATE TABLE ekbatan_cancel_requests (
    task_name     VARCHAR(100)  NOT NULL,
    task_instance VARCHAR(100)  NOT NULL,
    version       BIGINT        NOT NULL,
    requested_by  VARCHAR(200),
    requested_at  DATETIME(6)   NOT NULL,
    reason        VARCHAR(1000),
    PRIMARY KEY (task_name, task_instance)
);
