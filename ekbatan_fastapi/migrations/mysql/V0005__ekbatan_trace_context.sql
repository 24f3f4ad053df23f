-- ekbatan-fastapi's trace context of scheduled one-time tasks for MySQL 8+ and MariaDB 10.6+
-- (OpenTelemetry, the [otel] extra): the W3C traceparent/tracestate of the span that scheduled a
-- task instance, written in the transaction that schedules it, so that its executions link to that
-- trace. scheduled_tasks (V0001) and its task_data stay db-scheduler's, verbatim. Timestamps are
-- datetime(6) holding UTC, as in V0001; the lengths match ekbatan_fastapi/store/tables.py.

CREATE TABLE ekbatan_trace_context (
    task_name     VARCHAR(100)  NOT NULL,
    task_instance VARCHAR(100)  NOT NULL,
    traceparent   VARCHAR(55)   NOT NULL,
    tracestate    VARCHAR(512),
    created_at    DATETIME(6)   NOT NULL,
    PRIMARY KEY (task_name, task_instance)
);
