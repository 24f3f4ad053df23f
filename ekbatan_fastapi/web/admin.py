"""The admin routes: run now, pause, resume, stop a running execution. Mounted only with an
authorization dependency.

Each route runs that dependency (it refuses by raising ``HTTPException(401/403)``). Requests
a browser sends from another origin's page are refused first (``refuse_cross_site``), so a
dependency that trusts a cookie or HTTP basic auth cannot be driven by a hostile page (CSRF).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, params
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field, ValidationError

from ..client.views import CancelRunningResult, PauseResult, ResumeResult, RunNowResult
from ..domain.job import RECURRING_INSTANCE
from ..domain.origins import origin_of
from ..domain.text import is_storable_text, storable
from .http_errors import error_response, translated_errors, unprocessable
from .reads import reads_of
from .route_params import ADMIN_CHECK_PATH, Instance, Name, State
from .state import STATE_KEY

__all__ = ["add_admin_routes"]

_PAUSED_BY_LIMIT = 200
_REASON_LIMIT = 1000
_SAME_SITE_VALUES = frozenset({"same-origin", "none"})


_FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
"""The content types an HTML form sends (a cross-site form needs no permission to send them)."""


def _storable_text(value: str | None) -> str | None:
    """Text a database column takes: no NUL (PostgreSQL refuses it), no lone surrogate (JSON's
    ``\\ud800`` decodes to one; it is not UTF-8)."""
    if value is not None and not is_storable_text(value):
        raise ValueError(
            "must be text a database can store: no NUL character (\\u0000) and no lone "
            "surrogate (\\ud800-\\udfff without its pair)"
        )
    return value


StoredText = Annotated[str | None, AfterValidator(_storable_text)]
_NO_NUL = r"^[^\u0000]*$"
"""The part of the rule a schema can say (a lone surrogate is no JSON or URL text anyway)."""


class PauseRequest(BaseModel):
    """The optional JSON body of ``POST /jobs/{name}/pause``."""

    reason: StoredText = Field(default=None, max_length=_REASON_LIMIT, pattern=_NO_NUL)


Reason = Annotated[
    StoredText,
    Query(max_length=_REASON_LIMIT, pattern=_NO_NUL, description="why (or in the JSON body)"),
]
SkipMissed = Annotated[
    bool,
    Query(description="move a recurring task's overdue slot to its next future slot"),
]
Force = Annotated[bool, Query(description="run a paused task once anyway (on this instance)")]


_BODY_LIMIT = 64 * 1024
"""Bytes of a pause body read at most: a reason is at most 1000 characters."""

_PAUSE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "description": '{"reason": "..."} (optional; or ?reason=)',
        "content": {"application/json": {"schema": PauseRequest.model_json_schema()}},
    }
}


async def _pause_body(request: Request) -> PauseRequest | None:
    """The optional JSON body of a pause, read here rather than by FastAPI so that every bad
    body gets the same documented 422 naming what is wrong, whatever FastAPI's version (it
    answered a body that is not UTF-8 with 400 or 422, and one with a lone surrogate with 500,
    rendering the offending text back)."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _BODY_LIMIT:
            raise unprocessable(f"the body is over {_BODY_LIMIT} bytes", ["body"])
    if not raw.strip():
        return None
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise unprocessable(
            f"the body must be JSON with Content-Type: application/json, got "
            f"{content_type[:60] or 'no Content-Type'!r}",
            ["body"],
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise unprocessable(
            f"the body is not UTF-8 (byte 0x{raw[error.start]:02x} at {error.start}): send "
            "JSON in UTF-8",
            ["body"],
        ) from None
    except json.JSONDecodeError as error:
        raise unprocessable(f"the body is not JSON: {error}", ["body"]) from None
    except RecursionError:
        raise unprocessable("the body is not JSON: nested too deep", ["body"]) from None
    try:
        return PauseRequest.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(
            [
                {"loc": ("body", *e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in error.errors(include_url=False, include_input=False)
            ]
        ) from None


def _origins(request: Request) -> tuple[str | None, frozenset[str]]:
    """The application's own origin (the request's scheme and ``Host``, as the server saw
    them) and every trusted one: it and ``ekbatan.jobs.admin-trusted-origins``."""
    own = origin_of(str(request.base_url))
    state: Any = getattr(request.state, STATE_KEY, None) or getattr(
        request.app.state, STATE_KEY, None
    )
    listed = state.settings.jobs.config.admin_trusted_origins if state is not None else []
    return own, frozenset([*listed, *([own] if own else [])])


def _refused(reason: str) -> HTTPException:
    return HTTPException(
        403,
        detail=(
            f"cross-site request refused: {reason}. Send admin actions from this application's "
            "pages or from a client that is no browser (no Origin or Referer header, and no "
            "form body); list another origin of yours in ekbatan.jobs.admin-trusted-origins "
            "(EKBATAN_JOBS__ADMIN_TRUSTED_ORIGINS)"
        ),
    )


def refuse_cross_site(request: Request) -> None:
    """403 for a state-changing request that a browser may have sent from another origin's
    page: ``Sec-Fetch-Site`` says another site; ``Origin`` (or, without it, ``Referer``) names
    an origin that is neither the application's own nor trusted; or a body an HTML form can
    send (form-encoded, multipart, ``text/plain``, also empty) comes without a trusted origin.
    Scripts and the CLI send none of these headers, and no body or JSON."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.lower() not in _SAME_SITE_VALUES:
        raise _refused(f"Sec-Fetch-Site: {site[:40]!r}")
    own, trusted = _origins(request)
    named: str | None = None
    header = "origin" if "origin" in request.headers else "referer"
    if (value := request.headers.get(header)) is not None:
        named = origin_of(value)
        if named not in trusted:
            shown = value[:200] if header == "origin" else (named or "null")
            raise _refused(
                f"{header.capitalize()} {shown!r} is neither this application's origin "
                f"({own or 'unknown'}) nor a trusted one"
            )
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if named is None and content_type in _FORM_TYPES:
        raise _refused(
            f"a {content_type} body without an Origin or Referer header (an HTML form on "
            "another site can send one): send no body, or JSON with Content-Type: "
            "application/json"
        )


def _paused_by(who: Any) -> str | None:
    """The dependency's result names the admin when it is a string; else the scheduler."""
    if isinstance(who, str) and who.strip():
        return storable(who, _PAUSED_BY_LIMIT)
    return None


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Not authenticated (the authorization dependency's refusal)"},
    403: {
        "description": "Refused by the authorization dependency, or a request a browser may "
        "have sent from another origin's page (Sec-Fetch-Site, Origin, Referer, a form body)"
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
        openapi_extra=_PAUSE_BODY,
        responses={
            **_ERRORS,
            422: {
                "description": "A bad name or reason, or a body that is not a JSON object in "
                "UTF-8 (the error's loc names what)",
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/HTTPValidationError"}
                    }
                },
            },
            409: error_response(
                "The task was resumed by someone else meanwhile, or changed concurrently"
            ),
        },
        summary="Pause a task cluster-wide",
    )
    router.add_api_route(
        "/{name}/cancel",
        _cancel_running(timeout, guard),
        methods=["POST"],
        response_model=CancelRunningResult,
        status_code=202,
        dependencies=same_site,  # the guard is a parameter: its result names the admin
        openapi_extra=_PAUSE_BODY,
        responses={
            **_ERRORS,
            404: error_response("No such task instance, or it is not running right now"),
            422: {
                "description": "A bad name, instance or reason, or a body that is not a JSON "
                "object in UTF-8 (the error's loc names what)",
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/HTTPValidationError"}
                    }
                },
            },
        },
        summary="Stop a running execution, wherever it runs",
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
        reads_of(state).forget()
        return RunNowResult(
            name=name, instance=instance, detail="due now; it runs at the next poll"
        )

    return run_now


def _pause(timeout: float, guard: params.Depends) -> Callable[..., Any]:
    async def pause(
        name: Name,
        state: State,
        request: Request,
        reason: Reason = None,
        who: Any = guard,
    ) -> PauseResult:
        """No instance claims the task until it is resumed; survives restarts. Executions
        already running finish. ``paused_by`` is the authorization dependency's result when
        it returns a string, else the answering scheduler's name. Pausing again updates the
        reason."""
        body = await _pause_body(request)
        why = body.reason if body is not None and body.reason is not None else reason
        async with translated_errors(timeout):
            await state.client.pause(name, why or None, paused_by=_paused_by(who))
            info = (await state.client.paused()).get(name)
        reads_of(state).forget()
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


def _cancel_running(timeout: float, guard: params.Depends) -> Callable[..., Any]:
    async def cancel_running(
        name: Name,
        state: State,
        request: Request,
        instance: Instance = RECURRING_INSTANCE,
        reason: Reason = None,
        who: Any = guard,
    ) -> CancelRunningResult:
        """Ask the scheduler instance that runs the execution to stop it: an ``async def``
        job is cancelled within one heartbeat interval; a plain ``def`` one cannot be
        interrupted (its ``ctx.cancel_requested`` turns true). The history then records
        ``cancelled`` with who (the authorization dependency's result when it returns a
        string, else the answering scheduler's name) and why; a recurring job goes on with
        its next slot, a one-time task is removed. 404 when it is not running."""
        body = await _pause_body(request)
        why = body.reason if body is not None and body.reason is not None else reason
        by = _paused_by(who)
        async with translated_errors(timeout):
            running_on = await state.client.cancel_running(
                name, instance, why or None, requested_by=by
            )
        reads_of(state).forget()
        return CancelRunningResult(
            name=name,
            instance=instance,
            running_on=running_on,
            requested_by=by,
            reason=why or None,
            detail=f"{running_on} was asked to stop it (within one heartbeat interval)",
        )

    return cancel_running


def _resume(timeout: float) -> Callable[..., Any]:
    async def resume(name: Name, state: State, skip_missed: SkipMissed = False) -> ResumeResult:
        """An overdue slot then runs once (missed slots coalesce), unless ``skip_missed``
        moves a recurring task to its next future slot. ``resumed`` is false when the task
        was not paused."""
        async with translated_errors(timeout, loc=("query", "skip_missed")):
            # moved while still paused, as client.resume(skip_missed=True) does
            skipped_to = await state.client.skip_missed(name) if skip_missed else None
            resumed = await state.client.resume(name)
        reads_of(state).forget()
        detail = "resumed" if resumed else "it was not paused"
        if skipped_to is not None:
            detail += f"; its overdue slot was skipped, next run {skipped_to.isoformat()}"
        return ResumeResult(
            name=name,
            resumed=resumed,
            skip_missed=skip_missed,
            detail=detail,
            next_execution_time=skipped_to,
        )

    return resume
