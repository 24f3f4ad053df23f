"""``GET /jobs`` (read-only, a health/readiness probe), the history, the dashboard and the
optional admin routes.

``jobs_router`` has only the read-only routes and the dashboard. ``create_jobs_router(
admin_dependency=...)`` adds ``POST /jobs/{name}/run``, ``/pause`` and ``/resume``; without an
authorization dependency the admin routes do not exist at all, so an application cannot
expose them by accident.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Response, params

from .admin import add_admin_routes
from .dashboard import add_dashboard_route
from .http_errors import error_response, translated_errors
from .report import build_report, history_record
from .route_params import BeforeId, HistoryLimit, Limit, Name, Offset, State
from .views import HistoryPage, JobsReport

__all__ = ["create_jobs_router", "jobs_router"]

_UNHEALTHY: dict[int | str, dict[str, Any]] = {
    503: {
        "model": JobsReport,
        "description": "The database is unreachable or a task is dead (same body as 200).",
    }
}


@dataclass(frozen=True)
class _Options:
    """What a router's read-only handlers were configured with."""

    include_task_data: bool
    timeout: float


def create_jobs_router(
    *,
    prefix: str = "/jobs",
    admin_dependency: Callable[..., Any] | params.Depends | None = None,
    include_task_data: bool = False,
    tags: Sequence[str | Enum] = ("jobs",),
    timeout: float = 5.0,
    dashboard: bool = True,
    dashboard_refresh: float = 5.0,
    cross_site_admin: bool = False,
) -> APIRouter:
    """The jobs routes under ``prefix``.

    ``admin_dependency`` (a dependency callable or ``Depends(...)``) authorizes the admin
    routes and mounts them; it should raise ``HTTPException(401/403)`` to refuse. When it
    returns a string, that names the admin in ``paused_by``.
    ``include_task_data`` shows each row's ``task_data`` (it may hold personal data).
    ``timeout`` bounds the read of the table, so a probe answers 503 rather than hanging.
    ``dashboard`` serves the HTML page ``GET {prefix}/-/ui``, refreshed every
    ``dashboard_refresh`` seconds (0: never). ``cross_site_admin`` lets browsers on other
    sites call the admin routes (refused by default, against CSRF).
    """
    router = APIRouter(prefix=prefix, tags=list(tags))
    guard: params.Depends | None = None
    if admin_dependency is not None:
        guard = (
            admin_dependency
            if isinstance(admin_dependency, params.Depends)
            else Depends(admin_dependency)
        )
    options = _Options(include_task_data, timeout)
    router.add_api_route(
        "",
        _list_jobs(options),
        methods=["GET"],
        response_model=JobsReport,
        responses=_UNHEALTHY,
        summary="Every task in the cluster, the live instances and this instance's scheduler",
    )
    if dashboard:
        add_dashboard_route(router, guard is not None, timeout, dashboard_refresh)
    router.add_api_route(
        "/{name}",
        _get_job(options),
        methods=["GET"],
        response_model=JobsReport,
        responses={**_UNHEALTHY, 404: error_response("No job or task of that name")},
        summary="The task instances of one job",
    )
    router.add_api_route(
        "/{name}/history",
        _job_history(options),
        methods=["GET"],
        response_model=HistoryPage,
        responses={
            404: error_response("No job, task or history of that name"),
            503: error_response(
                "The database is unreachable, or the operations tables are missing (the "
                "message names the migration)"
            ),
        },
        summary="The executions of one task, newest first",
    )
    if guard is not None:
        add_admin_routes(router, guard, timeout, cross_site=cross_site_admin)
    return router


def _list_jobs(options: _Options) -> Callable[..., Any]:
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
            include_task_data=options.include_task_data,
            timeout=options.timeout,
        )
        if not report.healthy:
            response.status_code = 503
        return report

    return list_jobs


def _get_job(options: _Options) -> Callable[..., Any]:
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
            include_task_data=options.include_task_data,
            timeout=options.timeout,
        )
        if (
            report.database_time is not None
            and not report.tasks
            and not report.paused
            and name not in state.jobs
        ):
            raise HTTPException(404, detail=f"no job or task named {name!r}")
        if not report.healthy:
            response.status_code = 503
        return report

    return get_job


def _job_history(options: _Options) -> Callable[..., Any]:
    async def job_history(
        name: Name,
        state: State,
        limit: HistoryLimit = 50,
        before_id: BeforeId = None,
    ) -> HistoryPage:
        """One page of executions, newest first. ``next_before_id`` pages to older ones.
        Records are kept for the history retention (default 7 days)."""
        async with translated_errors(options.timeout):
            records = await state.client.history(name, limit=limit, before_id=before_id)
            if not records and before_id is None and not await state.client.is_known(name):
                raise HTTPException(404, detail=f"no job, task or history named {name!r}")
        return HistoryPage(
            name=name,
            records=[history_record(r) for r in records],
            next_before_id=records[-1].id if len(records) == limit else None,
        )

    return job_history


jobs_router = create_jobs_router()
"""``GET /jobs``, ``GET /jobs/{name}``, its history and the dashboard, without admin routes."""
