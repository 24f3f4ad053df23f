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
from .client.schedules import ScheduleInfo
from .domain.catchup import CatchUp
from .domain.clock import Clock, OffsetClock, SystemClock
from .domain.codec import TaskDataError, TaskDataInvalid
from .domain.context import ExecutionContext, HeartbeatState
from .domain.errors import (
    ConfigurationError,
    DatabaseLoginRefused,
    DatabaseTimeout,
    DatabaseUnavailable,
    EkbatanError,
    ExecutionCancelled,
    ExecutionSuperseded,
    JobTimedOut,
    NotRunningError,
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
from .domain.overlap import Overlap
from .domain.persistent import PersistentScheduleJob
from .domain.rows import ExecutionRecord, InstanceInfo, Outcome, PauseInfo, PollingStrategy
from .domain.schedules import Jittered, Schedule, Schedules, parse_schedule
from .domain.tasks import ScheduledTask
from .domain.version import VERSION
from .engine.config import SchedulerConfig
from .engine.observer import ExecutionFinished, SchedulerObserver
from .engine.scheduler import ExecutionStatus, Scheduler, SchedulerStatus
from .registry import JobRegistry, JobRegistryBuilder, SchedulerBuilder, job_registry
from .store.connection import ConnectionProvider
from .store.locks import try_cluster_lock
from .store.migrate import create_schema
from .store.tables import metadata, scheduled_tasks

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
    "DatabaseLoginRefused",
    "DatabaseTimeout",
    "DatabaseUnavailable",
    "DistributedJob",
    "EkbatanError",
    "ExecutionCancelled",
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
    "Overlap",
    "PersistentScheduleJob",
    "Outcome",
    "PauseInfo",
    "PollingStrategy",
    "RetryLater",
    "NotRunningError",
    "RunNotClaimedError",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
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
