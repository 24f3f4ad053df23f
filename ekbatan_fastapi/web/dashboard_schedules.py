"""``GET {prefix}/-/ui/schedules/{name}``: the dashboard's page of one ``PersistentScheduleJob``'s
schedules (paged, searched by id, filtered by state), with create, edit and delete forms for
the requests the authorization dependency accepts.

The page is read like the dashboard: through the read budget (``web/reads.py``), its buttons
decided by the dependency itself (``check_admin``), the same Content-Security-Policy. Its forms
call the admin routes (``PUT``/``PATCH``/``DELETE {prefix}/{name}/schedules/{id}``), so their
cross-site checks and the dependency guard every change; the page itself changes nothing.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from ..client.read_model import describe_failure
from ..client.schedules import SCHEDULE_STATES, ScheduleInfo
from ..domain.errors import UnknownJobError
from ..domain.version import VERSION
from .dashboard import SignIn, check_admin, page_headers
from .dashboard_schedules_html import SchedulesView, render_schedules
from .http_errors import translated_errors
from .reads import reads_of
from .route_params import ADMIN_CHECK_PATH, DASHBOARD_PATH, Name, Offset, State
from .schedule_routes import Search

__all__ = ["SCHEDULES_PAGE", "add_schedules_page_route"]

SCHEDULES_PAGE = DASHBOARD_PATH + "/schedules"
"""Under the router's prefix, followed by the job's name: four segments, which no job route
has."""
PAGE_DEFAULT = 50

PageState = Annotated[
    str | None,
    Query(
        description=f"only schedules in this state: {', '.join(SCHEDULE_STATES)} (empty: any)",
        pattern="^(" + "|".join(SCHEDULE_STATES) + ")?$",
    ),
]
"""The search form sends ``state=`` for *any*."""
PageLimit = Annotated[int, Query(ge=1, le=500, description="schedules per page (1 to 500)")]


def add_schedules_page_route(
    router: APIRouter, admin_mounted: bool, timeout: float, *, include_task_data: bool
) -> None:
    """The page; each schedule's data shows to admins, and to everyone with
    ``include_task_data`` (as ``/jobs`` shows ``task_data``)."""

    @router.get(SCHEDULES_PAGE + "/{name}", response_class=HTMLResponse, include_in_schema=False)
    async def schedules_page(
        request: Request,
        name: Name,
        state: State,
        limit: PageLimit = PAGE_DEFAULT,
        offset: Offset = 0,
        state_filter: Annotated[PageState, Query(alias="state")] = None,
        search: Search = None,
        sign_in: SignIn = False,
    ) -> Response:
        """The schedules page (HTML)."""
        only = state_filter or None
        admin = False
        if admin_mounted:
            path: str = request.scope["path"]
            dashboard = path[: path.rindex("/schedules/")]  # a name holds no "/"
            check = await check_admin(
                request, dashboard + ADMIN_CHECK_PATH.removeprefix(DASHBOARD_PATH)
            )
            admin = check.allowed
            if sign_in:
                if not admin:
                    return check.refusal()
                back = request.url.remove_query_params("sign_in").query
                return RedirectResponse(quote(name, safe="") + (f"?{back}" if back else ""), 303)

        try:
            state.client._schedule_job(name)
        except UnknownJobError as error:  # naming the PersistentScheduleJobs there are
            raise HTTPException(404, detail=str(error)) from None

        view: dict[str, Any] = {
            "job": name,
            "limit": limit,
            "offset": offset,
            "state": only,
            "search": search or "",
            "admin_mounted": admin_mounted,
            "admin": admin,
            "show_data": admin or include_task_data,
            "version": VERSION,
        }
        status = 200
        reads = reads_of(state)

        async def read() -> tuple[list[ScheduleInfo], Any]:
            async with translated_errors(timeout):
                found = await reads.client.list_schedules(
                    name, limit=limit, offset=offset, state=only, search=search
                )
                return found, await reads.client.database_time()

        try:
            key = ("schedules-page", name, limit, offset, only, search or None, timeout)
            view["schedules"], view["now"] = await reads.read(key, read)
        except HTTPException as error:  # busy (429), unreachable (503): said on the page
            status = error.status_code
            view["problems"] = [f"the schedules could not be read: {error.detail}"]
        except Exception as error:
            status = 503
            view["problems"] = [f"the schedules could not be read: {describe_failure(error)}"]
        nonce = secrets.token_urlsafe(18)
        html = render_schedules(SchedulesView(**view), nonce=nonce)
        return HTMLResponse(html, status_code=status, headers=page_headers(nonce))
