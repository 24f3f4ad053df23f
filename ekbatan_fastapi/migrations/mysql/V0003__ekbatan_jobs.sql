-- ekbatan-fastapi's registry of job definitions for MySQL 8+ and MariaDB 10.6+: what each job is
-- (kind, schedule and its fingerprint, timeout, concurrency limit, catch-up policy) and which
-- application version wrote it, with the slots each recurring job missed, caught up, skipped.
-- Timestamps are datetime(6) holding UTC, as in V0001; the lengths match
-- ekbatan_fastapi/store/tables.py.

CREATE TABLE ekbatan_jobs (
    task_name       VARCHAR(100)  NOT NULL,
    kind            VARCHAR(20)   NOT NULL,
    schedule        VARCHAR(1000),
    fingerprint     VARCHAR(64),
    app_version     VARCHAR(100),
    timeout_ms      BIGINT,
    max_concurrency INT,
    keyed           BOOLEAN       NOT NULL,
    written_by      VARCHAR(50)   NOT NULL,
    written_at      DATETIME(6)   NOT NULL,
    catch_up        VARCHAR(100),
    missed_slots    BIGINT        NOT NULL DEFAULT 0,
    caught_up_slots BIGINT        NOT NULL DEFAULT 0,
    skipped_slots   BIGINT        NOT NULL DEFAULT 0,
    PRIMARY KEY (task_name),
    INDEX ekbatan_jobs_written_at_idx (written_at)
);
