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

from fastapi import APIRouter, Depends, Response, params

from ..client.views import HistoryPage, JobsReport
from .admin import add_admin_routes
from .dashboard import add_dashboard_route
from .dashboard_schedules import add_schedules_page_route
from .http_errors import ErrorMessage, error_response, translated_errors
from .reads import reads_of
from .route_params import DEFAULT_PAGE, BeforeId, HistoryLimit, Limit, Name, Offset, State
from .schedule_routes import add_schedule_routes
from .state import EkbatanState

__all__ = ["create_jobs_router", "jobs_router"]

_BUSY: dict[int | str, dict[str, Any]] = {
    429: {
        **error_response(
            "The read budget is in use (ekbatan.jobs.web-read-pool-size reads at once): "
            "retry after the Retry-After header's seconds"
        ),
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    }
}
_UNHEALTHY: dict[int | str, dict[str, Any]] = {
    503: {
        "model": JobsReport,
        "description": "The scheduler cannot reach the database, or a task is dead (same "
        "body as 200).",
    },
    **_BUSY,
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
        add_schedules_page_route(
            router, guard is not None, timeout, include_task_data=include_task_data
        )
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
            **_BUSY,
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
    add_schedule_routes(
        router,
        guard,
        timeout,
        cross_site=cross_site_admin,
        include_task_data=include_task_data,
    )
    return router


@dataclass(frozen=True)
class _Answer:
    """A read's answer, rendered once and sent to every request it serves."""

    status: int
    body: bytes

    def response(self) -> Response:
        return Response(self.body, status_code=self.status, media_type="application/json")


async def _report_answer(
    state: EkbatanState, options: _Options, name: str | None, limit: int, offset: int
) -> _Answer:
    """``GET /jobs`` or ``/jobs/{name}`` through the read budget: one read per page per cache
    interval, whatever the number of requests."""
    reads = reads_of(state)

    async def build() -> _Answer:
        report = await state.read_model().report(
            name,
            limit=limit,
            offset=offset,
            include_task_data=options.include_task_data,
            timeout=options.timeout,
            registered=state.jobs,
        )
        if (
            name is not None
            and report.database_time is not None
            and not report.tasks
            and not report.paused
            and name not in state.jobs
        ):
            body = ErrorMessage(detail=f"no job or task named {name!r}")
            return _Answer(404, body.model_dump_json().encode())
        return _Answer(200 if report.healthy else 503, report.model_dump_json().encode())

    key = ("report", name, limit, offset, options.include_task_data, options.timeout)
    return await reads.read(key, build)


def _list_jobs(options: _Options) -> Callable[..., Any]:
    async def list_jobs(
        state: State,
        limit: Limit = DEFAULT_PAGE,
        offset: Offset = 0,
    ) -> Response:
        """200 when healthy; 503 (same body) when the scheduler cannot reach the database or a
        task is dead, so it can serve as a readiness probe. 429 with ``Retry-After`` when the
        read budget is in use (``ekbatan.jobs.web-read-pool-size``)."""
        return (await _report_answer(state, options, None, limit, offset)).response()

    return list_jobs


def _get_job(options: _Options) -> Callable[..., Any]:
    async def get_job(
        name: Name,
        state: State,
        limit: Limit = DEFAULT_PAGE,
        offset: Offset = 0,
    ) -> Response:
        """Like ``GET /jobs`` but for the rows of one task name; 404 when the name is neither
        a job of this instance nor in the table."""
        return (await _report_answer(state, options, name, limit, offset)).response()

    return get_job


def _job_history(options: _Options) -> Callable[..., Any]:
    async def job_history(
        name: Name,
        state: State,
        limit: HistoryLimit = 50,
        before_id: BeforeId = None,
    ) -> Response:
        """One page of executions, newest first. ``next_before_id`` pages to older ones.
        Records are kept for the history retention (default 7 days)."""
        reads = reads_of(state)

        async def build() -> _Answer:
            async with translated_errors(options.timeout):
                model = state.read_model()
                page = await model.history(name, limit=limit, before_id=before_id)
                if not page.records and before_id is None and not await model.client.is_known(name):
                    body = ErrorMessage(detail=f"no job, task or history named {name!r}")
                    return _Answer(404, body.model_dump_json().encode())
            return _Answer(200, page.model_dump_json().encode())

        key = ("history", name, limit, before_id, options.timeout)
        return (await reads.read(key, build)).response()

    return job_history


jobs_router = create_jobs_router()
"""``GET /jobs``, ``GET /jobs/{name}``, its history and the dashboard, without admin routes."""
