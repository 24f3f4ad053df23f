"""The operator's views of the cluster, one set of names for every reader: ``GET /jobs``,
its history, the dashboard and ``ekbatan-jobs --json`` (pydantic models, so that OpenAPI
documents them). ``read_model.py`` builds them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..domain.tasks import TaskState

__all__ = [
    "ExecutionView",
    "HistoryPage",
    "HistoryRecord",
    "InstanceView",
    "JobView",
    "JobsReport",
    "PauseResult",
    "PauseView",
    "ResumeResult",
    "RunNowResult",
    "SchedulerView",
    "TaskPage",
    "TaskState",
    "TaskView",
]


class PauseView(BaseModel):
    """A task paused cluster-wide: who paused it, when and why."""

    name: str = Field(description="the paused task_name")
    paused_by: str | None = Field(description="who paused it (the admin or the scheduler name)")
    paused_at: datetime = Field(description="when, by the database's clock")
    reason: str | None


class TaskView(BaseModel):
    """One row of ``scheduled_tasks``, seen from the database clock."""

    name: str = Field(description="task_name: the job's cluster-wide unique name")
    instance: str = Field(description="task_instance: 'recurring' for a recurring job's row")
    kind: Literal["recurring", "one-time", "unknown"] = Field(
        description="what this instance knows the task as ('unknown': no job of this name "
        "here); ekbatan-jobs, which loads no jobs: as the cluster stored it in ekbatan_jobs"
    )
    schedule: str | None = Field(
        description="the recurring job's schedule (e.g. FIXED_DELAY|PT10S), if known here "
        "(ekbatan-jobs: as stored in ekbatan_jobs)"
    )
    state: TaskState = Field(
        description=(
            "dead: picked with a heartbeat older than the dead-after window; running: picked; "
            "parked: its stored data does not fit its typed job's model (the history says "
            "why; reschedule it with fixed data, or cancel it); "
            "paused: paused cluster-wide (see paused); unresolved: no job of this name on this "
            "instance; overdue: due for longer than two polling intervals; failing: the last "
            "run failed; scheduled: otherwise"
        )
    )
    paused: PauseView | None = Field(
        default=None, description="set while the task is paused: who, when and why"
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
    consecutive_missed_slots: int = Field(
        default=0,
        description="slots that passed without a run since the last one that ran (merged by "
        "CatchUp.latest, skipped by the catch-up policy, due while a run was going)",
    )
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
        description="as last seen by the scheduler's loops (null before the first attempt): "
        "false while the database does not answer; an error that is its answer (read-only, "
        "a pooler mismatch) leaves it true"
    )
    condition: str = Field(
        default="unknown",
        description="now: ok, or what the last error means (unreachable, login-refused, timeout, "
        "read-only, pooler, schema-missing, lock-wait, error, loop-crashed)",
    )
    condition_since: datetime | None = Field(default=None, description="when it began")
    last_error: str | None = Field(
        description="the last error, kept after recovery (see condition and last_error_at)"
    )
    last_error_at: datetime | None = None
    last_successful_poll: datetime | None
    polling_strategy: str
    batch_size: int
    loop_restarts: int
    loop_lag_events: int = Field(
        default=0, description="how often the event loop was found blocked past the threshold"
    )
    max_loop_lag_seconds: float = Field(default=0.0, description="the longest blocked stretch")
    last_loop_lag_at: datetime | None = None
    polling_interval: str = Field(description="ISO-8601")
    heartbeat_interval: str = Field(description="ISO-8601")
    dead_after: str = Field(description="heartbeat_interval x missed_heartbeats_limit, ISO-8601")
    jobs: list[str] = Field(description="the job names registered on this instance")
    running: list[ExecutionView]


class InstanceView(BaseModel):
    """A scheduler instance of the cluster, as it last reported itself."""

    name: str = Field(description="its picked_by value")
    host: str
    pid: int
    started_at: datetime
    last_seen: datetime = Field(description="refreshed with its heartbeats (database clock)")
    last_seen_age_seconds: float | None = Field(
        default=None, description="seconds since last_seen by the database clock"
    )
    library_version: str
    alive: bool = Field(description="seen within the dead-after window")
    this_instance: bool = Field(default=False, description="the instance that answered")


class JobView(BaseModel):
    """One job of the cluster: what it is and how many of its executions run now."""

    name: str
    kind: Literal["recurring", "one-time"]
    schedule: str | None = Field(description="recurring jobs: db-scheduler's form")
    timeout: str | None = Field(description="ISO-8601; null: no limit")
    max_concurrency: int | None = Field(description="cluster-wide limit; null: none")
    per_key: bool = Field(description="the limit applies per concurrency_key")
    running: int = Field(description="executions running now, cluster-wide")
    timed_out_last_day: int = Field(description="executions past their timeout, last 24 h")
    registered_here: bool = Field(description="the instance that answered runs this job")
    app_version: str | None = Field(
        default=None, description="the application version that registered it last"
    )
    written_by: str | None = Field(
        default=None, description="the scheduler instance that stored its definition last"
    )
    written_at: datetime | None = Field(
        default=None, description="when its definition was stored last (database clock)"
    )
    catch_up: str | None = Field(
        default=None, description="recurring jobs: latest, all(max_slots=N) or skip(grace=...)"
    )
    overlap: str | None = Field(
        default=None,
        description="recurring jobs and schedules jobs: skip, buffer_one or cancel_other (what "
        "a slot that comes due while an execution runs does); null when the instance that "
        "answered does not run the job",
    )
    own_schedule: str | None = Field(
        default=None,
        description="set when the instance that answered runs the job by a newer version's "
        "stored schedule (a rolling deploy): its own code's schedule",
    )
    missed_slots: int = Field(default=0, description="slots coalesced into a later run")
    caught_up_slots: int = Field(default=0, description="slots run late, one by one")
    skipped_slots: int = Field(default=0, description="slots the catch-up policy did not run")
    backfill_pending: int = Field(
        default=0, description="backfilled slots waiting or running (rows backfill:<slot>)"
    )
    schedules: dict[str, int] | None = Field(
        default=None,
        description="a PersistentScheduleJob registered here: how many schedules it has, by "
        "state (scheduled, running, paused, parked); GET /jobs/{name}/schedules pages them",
    )


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
    paused: list[PauseView] = Field(
        default_factory=list,
        description="every paused task name, including names without rows in the table",
    )
    instances: list[InstanceView] = Field(
        default_factory=list,
        description="the cluster's scheduler instances, alive or last seen too long ago",
    )
    jobs: list[JobView] = Field(
        default_factory=list,
        description="every job of the cluster (registered here, or by another instance in "
        "ekbatan_jobs): timeout, concurrency limit, running now, timed out",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what is degraded without making the report unhealthy (e.g. a missing "
        "operations table: no history, pauses or instance list)",
    )
    next_offset: int | None = Field(
        default=None,
        description="the offset of the next page of tasks; null when this page is the last",
    )


class TaskPage(BaseModel):
    """``ekbatan-jobs list --json``: a page of tasks, named as in ``JobsReport``."""

    database_time: datetime = Field(description="the database's clock at the read")
    tasks: list[TaskView]
    paused: list[PauseView] = Field(
        description="every paused task name, including names without rows in the table"
    )
    next_offset: int | None = Field(
        description="the offset of the next page of tasks; null when this page is the last"
    )


class RunNowResult(BaseModel):
    """``POST /jobs/{name}/run`` (``ekbatan-jobs run-now``): the instance was made due now."""

    name: str
    instance: str
    detail: str
    forced: bool = Field(default=False, description="a paused task, run once on request")
    claimed_by: str | None = Field(
        default=None,
        description="who claimed a forced run (ekbatan-jobs run-now --force waits for it)",
    )


class HistoryRecord(BaseModel):
    """One execution from the history, newest first."""

    id: int = Field(description="page with before_id=<the last id of a page>")
    task_name: str
    task_instance: str
    execution_time: datetime = Field(description="the slot that ran")
    picked_by: str | None = Field(description="the scheduler instance that ran it")
    started_at: datetime
    finished_at: datetime
    duration_seconds: float
    outcome: str = Field(
        description=(
            "succeeded; failed; timed_out: ran past its job's timeout (a failure); "
            "superseded: its row was revived elsewhere meanwhile; cancelled: at shutdown"
        )
    )
    error_class: str | None
    error_message: str | None = Field(description="without SQL parameters or passwords")


class HistoryPage(BaseModel):
    """``GET /jobs/{name}/history`` (``ekbatan-jobs history``): a page of executions, newest
    first."""

    name: str | None = Field(
        description="the task name (null: every task's, `ekbatan-jobs history` without a name)"
    )
    records: list[HistoryRecord]
    next_before_id: int | None = Field(
        description="pass as before_id for the next (older) page; null on the last page"
    )


class PauseResult(PauseView):
    """``POST /jobs/{name}/pause`` (``ekbatan-jobs pause``): the task is paused cluster-wide."""

    detail: str


class CancelRunningResult(BaseModel):
    """``POST /jobs/{name}/cancel`` (``ekbatan-jobs cancel``): the instance that runs
    the execution was asked to stop it (within one heartbeat interval)."""

    name: str
    instance: str
    running_on: str = Field(description="the scheduler instance asked to stop it")
    requested_by: str | None = Field(
        description="the authorization dependency's answer (null: the answering scheduler)"
    )
    reason: str | None
    detail: str


class ResumeResult(BaseModel):
    """``POST /jobs/{name}/resume`` (``ekbatan-jobs resume``)."""

    name: str
    resumed: bool = Field(description="false when the task was not paused")
    skip_missed: bool
    detail: str
    next_execution_time: datetime | None = Field(
        default=None,
        description="with skip_missed: the slot the overdue row was moved to (null: it was "
        "not overdue)",
    )
