-- ekbatan-fastapi's registry of job definitions: what each job is (kind, schedule and its
-- fingerprint, timeout, concurrency limit, catch-up policy) and which application version
-- wrote it, with the slots each recurring job missed, caught up and skipped, so that
-- every instance, the CLI and /jobs see the cluster's jobs, and a rolling deploy never flips
-- a schedule back and forth. scheduled_tasks (V0001) stays db-scheduler's, verbatim.

CREATE TABLE ekbatan_jobs (
    task_name       TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    schedule        TEXT,
    fingerprint     TEXT,
    app_version     TEXT,
    timeout_ms      BIGINT,
    max_concurrency INT,
    keyed           BOOLEAN NOT NULL,
    written_by      TEXT NOT NULL,
    written_at      TIMESTAMP WITH TIME ZONE NOT NULL,
    catch_up        TEXT,
    missed_slots    BIGINT NOT NULL DEFAULT 0,
    caught_up_slots BIGINT NOT NULL DEFAULT 0,
    skipped_slots   BIGINT NOT NULL DEFAULT 0
);

-- Instances re-read the definitions written since they last looked (a rolling deploy).
CREATE INDEX ekbatan_jobs_written_at_idx ON ekbatan_jobs (written_at);
