"""``GET /jobs`` (read-only, a health/readiness probe) and the optional admin routes.

``jobs_router`` has only the read-only routes. ``create_jobs_router(admin_dependency=...)``
adds ``POST /jobs/{name}/run``; without an authorization dependency the admin routes do not
exist at all, so an application cannot expose them by accident.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response, params
from sqlalchemy.exc import DBAPIError

from ..errors import (
    ConfigurationError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from ..job import RECURRING_INSTANCE
from .dependencies import get_ekbatan
from .health import build_report, describe_failure, is_valid_name
from .models import JobsReport, RunNowResult
from .state import EkbatanState

__all__ = ["create_jobs_router", "jobs_router"]

_UNHEALTHY = {
    503: {
        "model": JobsReport,
        "description": "The database is unreachable or a task is dead (same body as 200).",
    }
}

# Module-level aliases: FastAPI evaluates the routes' (string) annotations in this namespace.
Name = Annotated[str, Path(description="the task_name (job name)", max_length=100)]
State = Annotated[EkbatanState, Depends(get_ekbatan)]
Limit = Annotated[int, Query(ge=1, le=10_000, description="at most this many rows")]
Offset = Annotated[int, Query(ge=0, description="skip this many rows (by execution_time)")]
Instance = Annotated[
    str, Query(max_length=100, description="task_instance; a recurring job's row by default")
]


def create_jobs_router(
    *,
    prefix: str = "/jobs",
    admin_dependency: Callable[..., Any] | params.Depends | None = None,
    include_task_data: bool = False,
    tags: Sequence[str | Enum] = ("jobs",),
    timeout: float = 5.0,
) -> APIRouter:
    """The jobs routes under ``prefix``.

    ``admin_dependency`` (a dependency callable or ``Depends(...)``) authorizes the admin
    routes and mounts them; it should raise ``HTTPException(401/403)`` to refuse.
    ``include_task_data`` shows each row's ``task_data`` (it may hold personal data).
    ``timeout`` bounds the read of the table, so a probe answers 503 rather than hanging.
    """
    router = APIRouter(prefix=prefix, tags=list(tags))

    @router.get(
        "",
        response_model=JobsReport,
        responses=_UNHEALTHY,  # type: ignore[arg-type]
        summary="Every task in the cluster, and this instance's scheduler",
    )
    async def list_jobs(
        state: State,
        response: Response,
        limit: Limit = 1000,
        offset: Offset = 0,
    ) -> JobsReport:
        """200 when healthy; 503 (same body) when the database is unreachable or a task is
        dead, so it can serve as a readiness probe."""
        report = await build_report(
            state,
            limit=limit,
            offset=offset,
            include_task_data=include_task_data,
            timeout=timeout,
        )
        if not report.healthy:
            response.status_code = 503
        return report

    @router.get(
        "/{name}",
        response_model=JobsReport,
        responses={**_UNHEALTHY, 404: {"description": "No job or task of that name"}},  # type: ignore[dict-item]
        summary="The task instances of one job",
    )
    async def get_job(
        name: Name,
        state: State,
        response: Response,
        limit: Limit = 1000,
        offset: Offset = 0,
    ) -> JobsReport:
        """Like ``GET /jobs`` but for the rows of one task name; 404 when the name is neither
        a job of this instance nor in the table."""
        report = await build_report(
            state,
            name=name,
            limit=limit,
            offset=offset,
            include_task_data=include_task_data,
            timeout=timeout,
        )
        if report.database_time is not None and not report.tasks and name not in state.jobs:
            raise HTTPException(404, detail=f"no job or task named {name!r}")
        if not report.healthy:
            response.status_code = 503
        return report

    if admin_dependency is not None:
        guard = (
            admin_dependency
            if isinstance(admin_dependency, params.Depends)
            else Depends(admin_dependency)
        )
        _add_admin_routes(router, guard, timeout)
    return router


def _add_admin_routes(router: APIRouter, guard: params.Depends, timeout: float) -> None:
    @router.post(
        "/{name}/run",
        response_model=RunNowResult,
        status_code=202,
        dependencies=[guard],
        responses={
            404: {"description": "No task instance of that name"},
            409: {"description": "The instance is running right now, or the task is paused"},
            503: {"description": "The database is unreachable"},
        },
        summary="Run a task instance now",
    )
    async def run_now(
        name: Name,
        state: State,
        instance: Instance = RECURRING_INSTANCE,
        force: Annotated[
            bool, Query(description="run a paused task once anyway (on this instance)")
        ] = False,
    ) -> RunNowResult:
        """Make the instance due now (the database's clock), keeping its failure counters.
        A paused task answers 409 unless ``force``."""
        if not is_valid_name(name) or not is_valid_name(instance):
            raise HTTPException(422, detail="names are 1 to 100 characters")
        try:
            async with asyncio.timeout(timeout):
                await state.client.run_now(name, instance, force=force)
        except TaskNotFoundError as error:
            raise HTTPException(404, detail=str(error)) from None
        except (TaskPickedError, TaskPausedError, UnknownJobError) as error:
            raise HTTPException(409, detail=str(error)) from None
        except ConfigurationError as error:
            raise HTTPException(422, detail=str(error)) from None
        except SchemaMissingError as error:
            raise HTTPException(503, detail=str(error)) from None
        except TimeoutError:
            raise HTTPException(503, detail="database unreachable: no answer in time") from None
        except (DBAPIError, OSError) as error:
            raise HTTPException(503, detail=describe_failure(error)) from None
        return RunNowResult(
            name=name, instance=instance, detail="due now; it runs at the next poll"
        )


jobs_router = create_jobs_router()
"""``GET /jobs`` and ``GET /jobs/{name}``, without admin routes."""
