"""ekbatan-fastapi: cluster-wide recurring background jobs over one ``scheduled_tasks`` table.

The core never imports FastAPI; the FastAPI integration lives in ``ekbatan_fastapi.integration``
and its names (``ekbatan_lifespan``, ``jobs_router``, ...) are re-exported here lazily, so
``import ekbatan_fastapi`` alone does not import FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import ScheduledTask, SchedulerClient
from .clock import Clock, OffsetClock, SystemClock
from .codec import TaskDataError
from .config import SchedulerConfig
from .connection import ConnectionProvider
from .errors import (
    ConfigurationError,
    DatabaseTimeout,
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
from .observer import ExecutionFinished, SchedulerObserver
from .operations import ExecutionRecord, InstanceInfo, Outcome, PauseInfo
from .registry import JobRegistry, JobRegistryBuilder, SchedulerBuilder, job_registry
from .repository.base import PollingStrategy
from .scheduler import Scheduler
from .schedules import Schedule, Schedules, parse_schedule
from .schema import create_schema, metadata, scheduled_tasks
from .status import ExecutionStatus, SchedulerStatus

__version__ = "0.1.0"

_INTEGRATION = frozenset(
    {
        "EkbatanLifespan",
        "EkbatanState",
        "JobsReport",
        "build_registry",
        "create_ekbatan_lifespan",
        "create_jobs_router",
        "create_metrics_router",
        "ekbatan_lifespan",
        "get_ekbatan",
        "get_ekbatan_settings",
        "get_scheduler_client",
        "jobs_router",
        "metrics_router",
    }
)

if TYPE_CHECKING:
    from .integration import (
        EkbatanLifespan,
        EkbatanState,
        JobsReport,
        build_registry,
        create_ekbatan_lifespan,
        create_jobs_router,
        create_metrics_router,
        ekbatan_lifespan,
        get_ekbatan,
        get_ekbatan_settings,
        get_scheduler_client,
        jobs_router,
        metrics_router,
    )
    from .settings import EkbatanSettings


def __getattr__(name: str) -> Any:
    """The FastAPI integration and the settings, imported on first use."""
    if name in _INTEGRATION:
        from . import integration

        return getattr(integration, name)
    if name == "EkbatanSettings":
        from .settings import EkbatanSettings

        return EkbatanSettings
    raise AttributeError(f"module 'ekbatan_fastapi' has no attribute {name!r}")


__all__ = [  # noqa: RUF022 - the integration's names are listed last, after the core's
    "RECURRING_INSTANCE",
    "Clock",
    "ConfigurationError",
    "ConnectionProvider",
    "DatabaseTimeout",
    "DistributedJob",
    "EkbatanError",
    "ExecutionContext",
    "ExecutionFinished",
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
    "SchedulerObserver",
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
    "EkbatanLifespan",
    "EkbatanSettings",
    "EkbatanState",
    "JobsReport",
    "build_registry",
    "create_ekbatan_lifespan",
    "create_jobs_router",
    "create_metrics_router",
    "ekbatan_lifespan",
    "get_ekbatan",
    "get_ekbatan_settings",
    "get_scheduler_client",
    "jobs_router",
    "metrics_router",
]
