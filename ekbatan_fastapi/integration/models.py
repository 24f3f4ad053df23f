"""The JSON shapes of ``/jobs`` (pydantic models, so that OpenAPI documents them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "ExecutionView",
    "JobsReport",
    "RunNowResult",
    "SchedulerView",
    "TaskState",
    "TaskView",
]

TaskState = Literal["scheduled", "running", "failing", "overdue", "dead", "unresolved"]


class TaskView(BaseModel):
    """One row of ``scheduled_tasks``, seen from the database clock."""

    name: str = Field(description="task_name: the job's cluster-wide unique name")
    instance: str = Field(description="task_instance: 'recurring' for a recurring job's row")
    kind: Literal["recurring", "one-time", "unknown"] = Field(
        description="what this instance knows the task as ('unknown': no job of this name here)"
    )
    schedule: str | None = Field(
        description="the recurring job's schedule (e.g. FIXED_DELAY|PT10S), if known here"
    )
    state: TaskState = Field(
        description=(
            "dead: picked with a heartbeat older than the dead-after window; running: picked; "
            "unresolved: no job of this name on this instance; overdue: due for longer than "
            "two polling intervals; failing: the last run failed; scheduled: otherwise"
        )
    )
    execution_time: datetime = Field(description="the next (or running) slot")
    picked: bool
    picked_by: str | None = Field(description="the scheduler instance running it")
    last_heartbeat: datetime | None
    heartbeat_age_seconds: float | None = Field(
        description="seconds since last_heartbeat by the database clock (picked rows only)"
    )
    fraction_dead: float | None = Field(
        description="heartbeat age / dead-after window: 1.0 or more means it can be revived"
    )
    last_success: datetime | None
    last_failure: datetime | None
    consecutive_failures: int
    priority: int
    version: int
    task_data: Any = Field(
        default=None, description="the instance's data; shown only when the router enables it"
    )


class ExecutionView(BaseModel):
    """An execution running on the instance that answered."""

    task_name: str
    task_instance: str
    execution_time: datetime
    started: datetime
    version: int
    fraction_dead: float
    failed_heartbeats: int


class SchedulerView(BaseModel):
    """The scheduler instance that answered the request."""

    name: str = Field(description="this instance's picked_by value")
    started_at: datetime | None
    ready: bool = Field(description="reached the database and created its recurring rows")
    stopping: bool
    database_reachable: bool | None = Field(
        description="as last seen by the scheduler's loops (null before the first attempt)"
    )
    last_error: str | None
    last_successful_poll: datetime | None
    polling_strategy: str
    batch_size: int
    loop_restarts: int
    polling_interval: str = Field(description="ISO-8601")
    heartbeat_interval: str = Field(description="ISO-8601")
    dead_after: str = Field(description="heartbeat_interval x missed_heartbeats_limit, ISO-8601")
    jobs: list[str] = Field(description="the job names registered on this instance")
    running: list[ExecutionView]


class JobsReport(BaseModel):
    """``GET /jobs``: the cluster's tasks and this instance's scheduler.

    Answered with 503 instead of 200 when ``healthy`` is false: the database is unreachable,
    or a task is dead.
    """

    healthy: bool
    problems: list[str] = Field(description="why healthy is false, one line per problem")
    database_time: datetime | None = Field(description="the database's clock at the read")
    scheduler: SchedulerView
    tasks: list[TaskView]


class RunNowResult(BaseModel):
    """``POST /jobs/{name}/run``: the instance was made due now."""

    name: str
    instance: str
    detail: str
