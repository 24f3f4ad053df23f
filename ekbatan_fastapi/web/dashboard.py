"""``GET /jobs/-/ui``: the dashboard, one server-rendered page that works offline.

It shows the ``/jobs`` report, the latest error message of each failing task (from the
execution history) and, only when the router's authorization dependency accepts the request,
the action buttons. To know that, the page asks the dependency itself: it sends the request's
headers and cookies, in-process, to the hidden ``GET {prefix}/-/ui/admin`` route that the
dependency guards, so every form of dependency (sub-dependencies, overrides, ``yield``,
security classes) is judged exactly as FastAPI judges it on the admin routes.

``GET /jobs/-/ui?sign_in=1`` answers with the dependency's own refusal (e.g. a 401 with
``WWW-Authenticate: Basic``, so the browser asks for credentials for ``/jobs/``), or leads
back to the page once it accepts.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from ..domain.logs import library_logger
from ..domain.records import Outcome
from ..domain.version import VERSION
from .dashboard_html import DashboardView, render_dashboard
from .report import build_report, describe_failure, history_record
from .route_params import ADMIN_CHECK_PATH, DASHBOARD_PATH, State
from .state import EkbatanState
from .views import HistoryRecord, JobsReport

__all__ = ["AdminCheck", "add_dashboard_route", "check_admin"]

log = library_logger(__name__)

_MAX_FAILING_NAMES = 50
_HISTORY_DEPTH = 20

_PASSED_HEADERS = frozenset({b"content-type", b"www-authenticate"})

Refresh = Annotated[
    float | None,
    Query(ge=0, le=86_400, description="seconds between refreshes (0: off)"),
]
SignIn = Annotated[bool, Query(description="ask for credentials (the dependency's refusal)")]


@dataclass
class AdminCheck:
    """The answer of the authorization dependency to this request's headers."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    @property
    def allowed(self) -> bool:
        return 200 <= self.status < 400

    def refusal(self) -> Response:
        """The dependency's refusal as it would answer an admin route (e.g. 401 with
        ``WWW-Authenticate``), for the browser to act on."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        return Response(self.body, status_code=self.status or 403, headers=headers)


async def check_admin(request: Request, check_path: str) -> AdminCheck:
    """GET ``check_path`` with this request's headers and cookies, in-process through the
    app's router (without its middleware): the authorization dependency guards that route.
    A refusal the app has no exception handler for counts as a refusal too."""
    scope: MutableMapping[str, Any] = dict(request.scope)
    scope.update(
        method="GET",
        path=check_path,
        raw_path=quote(check_path).encode(),
        query_string=b"",
    )
    check = AdminCheck()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            check.status = int(message["status"])
            check.headers = [
                (k.lower(), v)
                for k, v in message.get("headers", [])
                if k.lower() in _PASSED_HEADERS
            ]
        elif message["type"] == "http.response.body":
            check.body += message.get("body", b"")

    try:
        await request.app.router(scope, receive, send)
    except Exception as error:  # a refusal without an exception handler, or a broken dependency
        log.debug("the admin dependency refused the dashboard's request: %r", error)
        return AdminCheck(status=403, body=b'{"detail":"refused"}')
    return check


async def last_errors(
    state: EkbatanState, report: JobsReport
) -> dict[tuple[str, str], HistoryRecord]:
    """The latest failed execution of each failing task instance, from the history."""
    names = list(dict.fromkeys(t.name for t in report.tasks if t.last_failure is not None))
    wanted = {(t.name, t.instance) for t in report.tasks if t.last_failure is not None}
    found: dict[tuple[str, str], HistoryRecord] = {}
    for name in names[:_MAX_FAILING_NAMES]:
        for record in await state.client.history(name, limit=_HISTORY_DEPTH):
            key = (record.task_name, record.task_instance)
            failed = record.outcome in (Outcome.FAILED, Outcome.PARKED)
            if failed and key in wanted and key not in found:
                found[key] = history_record(record)
    return found


def add_dashboard_route(
    router: APIRouter, admin_mounted: bool, timeout: float, default_refresh: float
) -> None:
    @router.get(DASHBOARD_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def dashboard(
        request: Request, state: State, refresh: Refresh = None, sign_in: SignIn = False
    ) -> Response:
        """The dashboard page (HTML)."""
        admin = False
        if admin_mounted:
            check = await check_admin(
                request, request.scope["path"] + ADMIN_CHECK_PATH.removeprefix(DASHBOARD_PATH)
            )
            admin = check.allowed
            if sign_in:
                return RedirectResponse("ui", status_code=303) if admin else check.refusal()

        report = await build_report(state, timeout=timeout)
        errors: dict[tuple[str, str], HistoryRecord] = {}
        if report.database_time is not None and not report.warnings:
            try:
                async with asyncio.timeout(timeout):
                    errors = await last_errors(state, report)
            except Exception as error:  # the page still shows everything else
                report.warnings.append(
                    f"the latest error messages could not be read: {describe_failure(error)}"
                )
        base = request.url.path.removesuffix(DASHBOARD_PATH) or "/"
        view = DashboardView(
            report=report,
            last_errors=errors,
            admin_mounted=admin_mounted,
            admin=admin,
            refresh=default_refresh if refresh is None else refresh,
            json_url=base,
            version=VERSION,
        )
        nonce = secrets.token_urlsafe(18)
        return HTMLResponse(
            render_dashboard(view, nonce=nonce),
            headers={
                "Content-Security-Policy": (
                    f"default-src 'none'; style-src 'nonce-{nonce}'; "
                    f"script-src 'nonce-{nonce}'; connect-src 'self'; img-src 'self' data:; "
                    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
                ),
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )
