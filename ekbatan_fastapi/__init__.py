"""ekbatan-fastapi: cluster-wide recurring background jobs over one ``scheduled_tasks`` table.

The core never imports FastAPI; the FastAPI integration lives in ``ekbatan_fastapi.web`` and
its names (``ekbatan_lifespan``, ``jobs_router``, ...) are re-exported here lazily, so
``import ekbatan_fastapi`` alone does not import FastAPI. The layers are described in
docs/architecture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import SchedulerClient
from .client.backfill import BackfillResult
from .domain.catchup import CatchUp
from .domain.clock import Clock, OffsetClock, SystemClock
from .domain.codec import TaskDataError, TaskDataInvalid
from .domain.context import ExecutionContext, HeartbeatState
from .domain.errors import (
    ConfigurationError,
    DatabaseTimeout,
    DatabaseUnavailable,
    EkbatanError,
    ExecutionSuperseded,
    JobTimedOut,
    RunNotClaimedError,
    ScheduleError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from .domain.failure import ExponentialBackoff, FailureHandler, MaxRetries, RetryLater
from .domain.job import RECURRING_INSTANCE, DistributedJob, Job, OneTimeJob, distributed_job
from .domain.logs import TaskLogFilter
from .domain.records import ExecutionRecord, InstanceInfo, Outcome, PauseInfo
from .domain.rows import PollingStrategy
from .domain.schedules import Jittered, Schedule, Schedules, parse_schedule
from .domain.tasks import ScheduledTask
from .domain.version import VERSION
from .engine.config import SchedulerConfig
from .engine.observer import ExecutionFinished, SchedulerObserver
from .engine.scheduler import Scheduler
from .engine.status import ExecutionStatus, SchedulerStatus
from .registry import JobRegistry, JobRegistryBuilder, SchedulerBuilder, job_registry
from .store.connection import ConnectionProvider
from .store.locks import try_cluster_lock
from .store.tables import create_schema, metadata, scheduled_tasks

__version__ = VERSION

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
    from .settings import EkbatanSettings
    from .web import (
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


def __getattr__(name: str) -> Any:
    """The FastAPI integration and the settings, imported on first use."""
    if name in _INTEGRATION:
        from . import web

        return getattr(web, name)
    if name == "EkbatanSettings":
        from .settings import EkbatanSettings

        return EkbatanSettings
    raise AttributeError(f"module 'ekbatan_fastapi' has no attribute {name!r}")


__all__ = [  # noqa: RUF022 - the integration's names are listed last, after the core's
    "RECURRING_INSTANCE",
    "BackfillResult",
    "CatchUp",
    "Clock",
    "ConfigurationError",
    "ConnectionProvider",
    "DatabaseTimeout",
    "DatabaseUnavailable",
    "DistributedJob",
    "EkbatanError",
    "ExecutionContext",
    "ExecutionFinished",
    "ExecutionRecord",
    "ExecutionStatus",
    "ExecutionSuperseded",
    "ExponentialBackoff",
    "FailureHandler",
    "HeartbeatState",
    "InstanceInfo",
    "Jittered",
    "Job",
    "JobRegistry",
    "JobRegistryBuilder",
    "JobTimedOut",
    "MaxRetries",
    "OffsetClock",
    "OneTimeJob",
    "Outcome",
    "PauseInfo",
    "PollingStrategy",
    "RetryLater",
    "RunNotClaimedError",
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
    "TaskLogFilter",
    "TaskDataError",
    "TaskDataInvalid",
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
    "try_cluster_lock",
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
