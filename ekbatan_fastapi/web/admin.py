"""The admin routes: run now, pause, resume. Mounted only with an authorization dependency.

Each route runs that dependency first (it refuses by raising ``HTTPException(401/403)``).
Browsers' cross-site requests are refused as well (``Sec-Fetch-Site``), so a dependency that
trusts a cookie or HTTP basic auth cannot be driven by another site's page (CSRF).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request, Response, params
from pydantic import BaseModel, Field

from ..domain.job import RECURRING_INSTANCE
from .http_errors import error_response, translated_errors
from .route_params import ADMIN_CHECK_PATH, Instance, Name, State
from .views import PauseResult, ResumeResult, RunNowResult

__all__ = ["add_admin_routes"]

_PAUSED_BY_LIMIT = 200
_REASON_LIMIT = 1000
_SAME_SITE_VALUES = frozenset({"same-origin", "none"})


class PauseRequest(BaseModel):
    """The optional JSON body of ``POST /jobs/{name}/pause``."""

    reason: str | None = Field(default=None, max_length=_REASON_LIMIT)


Reason = Annotated[
    str | None, Query(max_length=_REASON_LIMIT, description="why (or in the JSON body)")
]
PauseBody = Annotated[PauseRequest | None, Body(description='{"reason": "..."} (optional)')]
SkipMissed = Annotated[
    bool,
    Query(description="move a recurring task's overdue slot to its next future slot"),
]
Force = Annotated[bool, Query(description="run a paused task once anyway (on this instance)")]


def refuse_cross_site(request: Request) -> None:
    """403 for a browser request sent by another site's page (``Sec-Fetch-Site: cross-site``
    or ``same-site``); clients that are not browsers do not send the header."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.lower() not in _SAME_SITE_VALUES:
        raise HTTPException(
            403,
            detail=(
                f"cross-site request refused (Sec-Fetch-Site: {site}): send admin actions from "
                "this application's pages or from a non-browser client, or create the router "
                "with cross_site_admin=True"
            ),
        )


def _paused_by(who: Any) -> str | None:
    """The dependency's result names the admin when it is a string; else the scheduler."""
    if isinstance(who, str) and who.strip():
        return who[:_PAUSED_BY_LIMIT]
    return None


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Not authenticated (the authorization dependency's refusal)"},
    403: {
        "description": "Refused by the authorization dependency, or a browser's cross-site "
        "request (Sec-Fetch-Site)"
    },
    404: error_response("No task of that name"),
    503: error_response("The database is unreachable, or the operations tables are missing"),
}


def add_admin_routes(
    router: APIRouter, guard: params.Depends, timeout: float, *, cross_site: bool
) -> None:
    """Add the admin routes to ``router``, each behind ``guard``."""
    same_site = [] if cross_site else [Depends(refuse_cross_site)]
    guards = [*same_site, guard]
    # Without the cross-site check: it changes nothing, and the dashboard may have been
    # opened from a link on another site; its buttons' requests are same-origin anyway.
    router.add_api_route(
        ADMIN_CHECK_PATH,
        _admin_check,
        methods=["GET"],
        dependencies=[guard],
        include_in_schema=False,
    )
    router.add_api_route(
        "/{name}/run",
        _run_now(timeout),
        methods=["POST"],
        response_model=RunNowResult,
        status_code=202,
        dependencies=guards,
        responses={
            **_ERRORS,
            409: error_response("The instance is running right now, or the task is paused"),
        },
        summary="Run a task instance now",
    )
    router.add_api_route(
        "/{name}/pause",
        _pause(timeout, guard),
        methods=["POST"],
        response_model=PauseResult,
        dependencies=same_site,  # the guard is a parameter: its result names the admin
        responses={
            **_ERRORS,
            400: error_response("The body is not JSON (not even UTF-8)"),
            409: error_response(
                "The task was resumed by someone else meanwhile, or changed concurrently"
            ),
        },
        summary="Pause a task cluster-wide",
    )
    router.add_api_route(
        "/{name}/resume",
        _resume(timeout),
        methods=["POST"],
        response_model=ResumeResult,
        dependencies=guards,
        responses={
            **_ERRORS,
            409: error_response("The task was being changed concurrently; try again"),
        },
        summary="Resume a paused task",
    )


async def _admin_check() -> Response:
    """204: the authorization dependency accepts this request."""
    return Response(status_code=204)


def _run_now(timeout: float) -> Callable[..., Any]:
    async def run_now(
        name: Name,
        state: State,
        instance: Instance = RECURRING_INSTANCE,
        force: Force = False,
    ) -> RunNowResult:
        """Make the instance due now (the database's clock), keeping its failure counters.
        A paused task answers 409 unless ``force``."""
        async with translated_errors(timeout):
            await state.client.run_now(name, instance, force=force, force_hint="?force=true")
        return RunNowResult(
            name=name, instance=instance, detail="due now; it runs at the next poll"
        )

    return run_now


def _pause(timeout: float, guard: params.Depends) -> Callable[..., Any]:
    async def pause(
        name: Name,
        state: State,
        reason: Reason = None,
        body: PauseBody = None,
        who: Any = guard,
    ) -> PauseResult:
        """No instance claims the task until it is resumed; survives restarts. Executions
        already running finish. ``paused_by`` is the authorization dependency's result when
        it returns a string, else the answering scheduler's name. Pausing again updates the
        reason."""
        why = body.reason if body is not None and body.reason is not None else reason
        async with translated_errors(timeout):
            await state.client.pause(name, why or None, paused_by=_paused_by(who))
            info = (await state.client.paused()).get(name)
        if info is None:  # resumed by someone else in between
            raise HTTPException(409, detail=f"{name!r} was resumed meanwhile; pause it again")
        return PauseResult(
            name=name,
            paused_by=info.paused_by,
            paused_at=info.paused_at,
            reason=info.reason,
            detail="paused cluster-wide; no instance claims it until it is resumed",
        )

    return pause


def _resume(timeout: float) -> Callable[..., Any]:
    async def resume(name: Name, state: State, skip_missed: SkipMissed = False) -> ResumeResult:
        """An overdue slot then runs once (missed slots coalesce), unless ``skip_missed``
        moves a recurring task to its next future slot. ``resumed`` is false when the task
        was not paused."""
        async with translated_errors(timeout, loc=("query", "skip_missed")):
            resumed = await state.client.resume(name, skip_missed=skip_missed)
        return ResumeResult(
            name=name,
            resumed=resumed,
            skip_missed=skip_missed,
            detail="resumed" if resumed else "it was not paused",
        )

    return resume
