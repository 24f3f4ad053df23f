-- ekbatan-fastapi's trace context of scheduled one-time tasks (OpenTelemetry, the [otel] extra):
-- the W3C traceparent/tracestate of the span that scheduled a task instance, written in the
-- transaction that schedules it, so that its executions link to that trace. scheduled_tasks
-- (V0001) and its task_data stay db-scheduler's, verbatim. A row whose task is gone is
-- deleted when the execution finishes, or by the scheduler's hourly housekeeping.

CREATE TABLE ekbatan_trace_context (
    task_name     TEXT NOT NULL,
    task_instance TEXT NOT NULL,
    traceparent   TEXT NOT NULL,
    tracestate    TEXT,
    created_at    TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (task_name, task_instance)
);
