-- ekbatan-fastapi's requests to stop a running execution (client.cancel_running, the admin route
-- POST /jobs/{name}/cancel, `ekbatan-jobs cancel`): one row per task instance, naming
-- the claim (version) it stops, who asked and why. The instance that runs it reads the rows of
-- what it runs once per heartbeat round (only while it runs something), cancels the execution
-- and deletes the row. scheduled_tasks (V0001) stays db-scheduler's, verbatim.

CREATE TABLE ekbatan_cancel_requests (
    task_name     TEXT NOT NULL,
    task_instance TEXT NOT NULL,
    version       BIGINT NOT NULL,
    requested_by  TEXT,
    requested_at  TIMESTAMP WITH TIME ZONE NOT NULL,
    reason        TEXT,
    PRIMARY KEY (task_name, task_instance)
);
