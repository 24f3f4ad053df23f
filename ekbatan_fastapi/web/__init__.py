"""The FastAPI integration: settings, job discovery with dependency injection, the lifespan
and the ``/jobs`` routes. This is the only part of ekbatan-fastapi that imports FastAPI.

    app = FastAPI(lifespan=ekbatan_lifespan)
    app.include_router(jobs_router)
"""

from __future__ import annotations

from ..client.views import (
    ExecutionView,
    HistoryPage,
    HistoryRecord,
    InstanceView,
    JobsReport,
    PauseResult,
    PauseView,
    ResumeResult,
    RunNowResult,
    SchedulerView,
    TaskState,
    TaskView,
)
from ..domain.tasks import derive_state
from ..settings import DataSourceConfig, EkbatanSettings, JobsSettings
from .dependencies import get_ekbatan, get_ekbatan_settings, get_scheduler_client
from .discovery import discover_job_classes, import_job_modules
from .errors import database_unavailable_handler, install_exception_handlers
from .lifespan import (
    AppLifespan,
    EkbatanLifespan,
    build_registry,
    create_ekbatan_lifespan,
    ekbatan_lifespan,
)
from .metrics_routes import create_metrics_router, metrics_router
from .resolver import DependencyResolver
from .routes import create_jobs_router, jobs_router
from .state import STATE_KEY, EkbatanState

__all__ = [
    "STATE_KEY",
    "AppLifespan",
    "DataSourceConfig",
    "DependencyResolver",
    "EkbatanLifespan",
    "EkbatanSettings",
    "EkbatanState",
    "ExecutionView",
    "HistoryPage",
    "HistoryRecord",
    "InstanceView",
    "JobsReport",
    "JobsSettings",
    "PauseResult",
    "PauseView",
    "ResumeResult",
    "RunNowResult",
    "SchedulerView",
    "TaskState",
    "TaskView",
    "build_registry",
    "create_ekbatan_lifespan",
    "create_jobs_router",
    "create_metrics_router",
    "database_unavailable_handler",
    "derive_state",
    "discover_job_classes",
    "ekbatan_lifespan",
    "get_ekbatan",
    "get_ekbatan_settings",
    "get_scheduler_client",
    "import_job_modules",
    "install_exception_handlers",
    "jobs_router",
    "metrics_router",
]
