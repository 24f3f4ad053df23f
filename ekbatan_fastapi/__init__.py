"""ekbatan-fastapi: cluster-wide recurring background jobs over one ``scheduled_tasks`` table.

The core (everything importable from here) never imports FastAPI; the FastAPI integration
lives in ``ekbatan_fastapi.fastapi``.
"""

from __future__ import annotations

from .client import ScheduledTask, SchedulerClient
from .clock import Clock, OffsetClock, SystemClock
from .codec import TaskDataError
from .config import SchedulerConfig
from .connection import ConnectionProvider
from .errors import (
    ConfigurationError,
    EkbatanError,
    ScheduleError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from .failure import ExponentialBackoff, FailureHandler, MaxRetries, RetryLater
from .job import (
    RECURRING_INSTANCE,
    DistributedJob,
    ExecutionContext,
    HeartbeatState,
    OneTimeJob,
    distributed_job,
)
from .operations import ExecutionRecord, InstanceInfo, Outcome, PauseInfo
from .registry import JobRegistry, JobRegistryBuilder, SchedulerBuilder, job_registry
from .repository.base import PollingStrategy
from .scheduler import Scheduler
from .schedules import Schedule, Schedules, parse_schedule
from .schema import create_schema, metadata, scheduled_tasks
from .status import ExecutionStatus, SchedulerStatus

__version__ = "0.1.0"

__all__ = [
    "RECURRING_INSTANCE",
    "Clock",
    "ConfigurationError",
    "ConnectionProvider",
    "DistributedJob",
    "EkbatanError",
    "ExecutionContext",
    "ExecutionRecord",
    "ExecutionStatus",
    "ExponentialBackoff",
    "FailureHandler",
    "HeartbeatState",
    "InstanceInfo",
    "JobRegistry",
    "JobRegistryBuilder",
    "MaxRetries",
    "OffsetClock",
    "OneTimeJob",
    "Outcome",
    "PauseInfo",
    "PollingStrategy",
    "RetryLater",
    "Schedule",
    "ScheduleError",
    "ScheduledTask",
    "Scheduler",
    "SchedulerBuilder",
    "SchedulerClient",
    "SchedulerConfig",
    "SchedulerStatus",
    "Schedules",
    "SchemaMissingError",
    "SystemClock",
    "TaskDataError",
    "TaskNotFoundError",
    "TaskPausedError",
    "TaskPickedError",
    "UnknownJobError",
    "create_schema",
    "distributed_job",
    "job_registry",
    "metadata",
    "parse_schedule",
    "scheduled_tasks",
]
