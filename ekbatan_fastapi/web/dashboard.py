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

from ..client.read_model import describe_failure
from ..client.views import HistoryRecord, JobsReport
from ..domain.logs import library_logger
from ..domain.version import VERSION
from .dashboard_html import DashboardView, render_dashboard
from .reads import reads_of
from .route_params import ADMIN_CHECK_PATH, DASHBOARD_PATH, MAX_PAGE, State

__all__ = ["AdminCheck", "SignIn", "add_dashboard_route", "check_admin", "page_headers"]

log = library_logger(__name__)


_PASSED_HEADERS = frozenset({b"content-type", b"www-authenticate"})
_NONCE_SLOT = secrets.token_hex(16)
"""Where a cached page takes each response's own nonce (random: no task name can hold it)."""

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


def page_headers(nonce: str) -> dict[str, str]:
    """The headers of every dashboard page: a Content-Security-Policy that allows only the
    page's own style and script (by ``nonce``), requests to its own origin, and forms sent to
    it; never cached, framed or sniffed."""
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; style-src 'nonce-{nonce}'; "
            f"script-src 'nonce-{nonce}'; connect-src 'self'; img-src 'self' data:; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        ),
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


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

        base = request.url.path.removesuffix(DASHBOARD_PATH) or "/"
        reads = reads_of(state)

        async def data() -> tuple[JobsReport, dict[tuple[str, str], HistoryRecord]]:
            model = state.read_model()
            report = await model.report(limit=MAX_PAGE, timeout=timeout, registered=state.jobs)
            errors: dict[tuple[str, str], HistoryRecord] = {}
            if report.database_time is not None and not report.warnings:
                try:
                    async with asyncio.timeout(timeout):
                        errors = await model.last_errors(report.tasks)
                except Exception as error:  # the page still shows everything else
                    report.warnings.append(
                        f"the latest error messages could not be read: {describe_failure(error)}"
                    )
            return report, errors

        shown_refresh = default_refresh if refresh is None else refresh

        async def page() -> str:
            # Rendered once per cache interval (a page of 1,000 tasks takes some 20 ms), with
            # a placeholder where each response puts its own nonce.
            report, errors = await reads.read(("dashboard", timeout), data)
            view = DashboardView(
                report=report,
                last_errors=errors,
                admin_mounted=admin_mounted,
                admin=admin,
                refresh=shown_refresh,
                json_url=base,
                version=VERSION,
            )
            return render_dashboard(view, nonce=_NONCE_SLOT)

        key = ("dashboard-page", timeout, admin_mounted, admin, shown_refresh, base)
        html = await reads.read(key, page, gated=False)
        nonce = secrets.token_urlsafe(18)
        return HTMLResponse(html.replace(_NONCE_SLOT, nonce), headers=page_headers(nonce))
