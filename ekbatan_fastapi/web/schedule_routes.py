"""Schedules as data over HTTP: ``GET {prefix}/{name}/schedules`` (read-only, through the read
budget), and with the admin dependency ``PUT``, ``PATCH`` and ``DELETE
{prefix}/{name}/schedules/{id}`` (behind the same cross-site checks as every admin route)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Response, params
from pydantic import BaseModel, ConfigDict, Field

from ..client.schedules import MAX_SEARCH, SCHEDULE_STATES
from ..domain.codec import TaskDataInvalid
from ..domain.errors import ScheduleError, UnknownJobError
from ..domain.text import MAX_NAME_LENGTH
from .admin import refuse_cross_site
from .http_errors import error_response, translated_errors, unprocessable
from .reads import reads_of
from .route_params import DEFAULT_PAGE, PATH_NAME_PATTERN, Limit, Name, Offset, State

__all__ = ["add_schedule_routes"]

ScheduleId = Annotated[
    str,
    Path(
        description="the schedule's id (its task_instance): 1 to 100 characters, no '/'",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=PATH_NAME_PATTERN,
    ),
]
Search = Annotated[
    str | None,
    Query(
        description=(
            "only schedules whose id contains this text, ignoring case ('%' and '_' match "
            f"themselves; empty: all): at most {MAX_SEARCH} characters"
        ),
        max_length=MAX_SEARCH,
        pattern=r"^[^\u0000]*$",
    ),
]
StateFilter = Annotated[
    str | None,
    Query(
        description=f"only schedules in this state: {', '.join(SCHEDULE_STATES)}",
        pattern="^(" + "|".join(SCHEDULE_STATES) + ")$",
    ),
]


class ScheduleView(BaseModel):
    """One schedule as ``GET /jobs/{name}/schedules`` shows it."""

    job: str
    instance_id: str
    schedule: str | None
    data: Any = Field(
        default=None,
        description="the schedule's data; in the list only when the router was made with "
        "include_task_data=True (it may hold personal data), else null",
    )
    state: str
    next_time: datetime | None
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    runs: int = 0
    paused: dict[str, Any] | None = None
    error: str | None = None
    picked_by: str | None = None
    last_success: datetime | None = None
    last_failure: datetime | None = None
    consecutive_failures: int = 0


class SchedulePage(BaseModel):
    """A page of a job's schedules, by next due time."""

    job: str
    schedules: list[ScheduleView]
    limit: int
    offset: int
    next_offset: int | None
    """The next page's ``offset`` (None: this is the last page)."""


class ScheduleBody(BaseModel):
    """``PATCH``: what changes (at least one field). ``PUT`` (``ScheduleReplace``): the whole
    schedule, created or replaced."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    schedule: str | None = Field(
        default=None,
        max_length=1000,
        description="db-scheduler's string form, e.g. 'CRON|0 8 * * 1-5|Europe/Berlin'",
    )
    data: Any = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = Field(default=None, ge=1)


class ScheduleReplace(ScheduleBody):
    """``PUT``: the whole schedule; its ``schedule`` is required."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={})

    schedule: str = Field(
        min_length=1,
        max_length=1000,
        description="db-scheduler's string form, e.g. 'CRON|0 8 * * 1-5|Europe/Berlin'",
    )


class ScheduleChanged(BaseModel):
    job: str
    instance_id: str
    created: bool
    schedule: ScheduleView
    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Not authenticated (the authorization dependency's refusal)"},
    403: {"description": "Refused by the authorization dependency, or a cross-site request"},
    404: error_response("No such schedule, or no PersistentScheduleJob of that name"),
    409: error_response("The schedule is running and cannot be replaced now; try again"),
    503: error_response("The database is unreachable"),
}
_WITH_BODY: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    400: error_response("The body could not be parsed (not JSON in UTF-8)"),
}
_PUT: dict[int | str, dict[str, Any]] = {
    **_WITH_BODY,
    409: error_response(
        "The schedule is running and cannot be replaced now (try again), or replace=false "
        "and it exists (left alone)"
    ),
}
_METHODS = "DELETE, PATCH, PUT"


@asynccontextmanager
async def _answered(timeout: float) -> AsyncIterator[None]:
    """The library's errors as HTTP answers; a bad schedule or data is a 422 naming the
    field; a name that is no PersistentScheduleJob a 404."""
    try:
        async with translated_errors(timeout):
            try:
                yield
            except UnknownJobError as error:
                raise HTTPException(404, detail=str(error)) from None
    except TaskDataInvalid as error:
        raise unprocessable(str(error), ["body", "data", *error.fields[:1]]) from None
    except ScheduleError as error:
        field = next(
            (f for f in ("start_at", "end_at", "max_runs") if str(error).startswith(f)),
            "schedule",
        )
        raise unprocessable(str(error), ["body", field]) from None


def _view(info: Any, *, data: bool = True) -> ScheduleView:
    view = ScheduleView.model_validate(info.to_json())
    if not data:
        view.data = None
    return view


def add_schedule_routes(
    router: APIRouter,
    guard: params.Depends | None,
    timeout: float,
    *,
    cross_site: bool,
    include_task_data: bool = False,
) -> None:
    """Add the schedule routes (the admin ones only with ``guard``). The list shows each
    schedule's data (it lives in ``task_data``) only with ``include_task_data``, as ``/jobs``
    shows ``task_data``; the admin routes answer with it."""
    router.add_api_route(
        "/{name}/schedules",
        _list(timeout, include_task_data),
        methods=["GET"],
        response_model=SchedulePage,
        responses={404: _ERRORS[404], 503: _ERRORS[503]},
        summary="A page of a PersistentScheduleJob's schedules",
    )
    if guard is None:
        return
    same_site = [] if cross_site else [Depends(refuse_cross_site)]
    guards = [*same_site, guard]
    router.add_api_route(
        "/{name}/schedules/{instance_id}",
        _put(timeout),
        methods=["PUT"],
        response_model=ScheduleChanged,
        dependencies=guards,
        responses=_PUT,
        summary="Create or replace a schedule",
    )
    router.add_api_route(
        "/{name}/schedules/{instance_id}",
        _patch(timeout),
        methods=["PATCH"],
        response_model=ScheduleChanged,
        dependencies=guards,
        responses=_WITH_BODY,
        summary="Change part of a schedule (from its next slot)",
    )
    router.add_api_route(
        "/{name}/schedules/{instance_id}",
        _delete(timeout),
        methods=["DELETE"],
        status_code=204,
        dependencies=guards,
        responses=_ERRORS,
        summary="Delete a schedule (a running slot finishes)",
    )
    # The three methods are three routes: Starlette's 405 for any other method would name only
    # the first one's in Allow; this one names all three.
    router.add_api_route(
        "/{name}/schedules/{instance_id}",
        _not_allowed,
        methods=["GET", "HEAD", "POST", "OPTIONS"],
        include_in_schema=False,
    )


async def _not_allowed() -> Response:
    return Response(
        '{"detail":"Method Not Allowed"}',
        status_code=405,
        media_type="application/json",
        headers={"Allow": _METHODS},
    )


def _list(timeout: float, include_task_data: bool) -> Callable[..., Any]:
    async def list_schedules(
        name: Name,
        state: State,
        limit: Limit = DEFAULT_PAGE,
        offset: Offset = 0,
        only: Annotated[StateFilter, Query(alias="state")] = None,
        search: Search = None,
    ) -> Response:
        """The schedules of one job by next due time; ``state`` filters by state, ``search``
        by a part of the id."""
        reads = reads_of(state)

        async def build() -> bytes:
            async with _answered(timeout):
                if name not in state.jobs:
                    state.client._schedule_job(name)  # 404 naming the ones there are
                found = await reads.client.list_schedules(
                    name, limit=limit, offset=offset, state=only, search=search
                )
            page = SchedulePage(
                job=name,
                schedules=[_view(s, data=include_task_data) for s in found],
                limit=limit,
                offset=offset,
                next_offset=offset + limit if len(found) == limit else None,
            )
            return page.model_dump_json().encode()

        key = ("schedules", name, limit, offset, only, search or None)
        body = await reads.read(key, build)
        return Response(body, media_type="application/json")

    return list_schedules


Replace = Annotated[
    bool,
    Query(
        description="false: only create it; answer 409 when it exists (and leave it alone)",
    ),
]


def _put(timeout: float) -> Callable[..., Any]:
    async def put_schedule(
        name: Name,
        instance_id: ScheduleId,
        state: State,
        body: Annotated[ScheduleReplace, Body()],
        replace: Replace = True,
    ) -> ScheduleChanged:
        """Create the schedule, or replace it whole (its next slot follows the new one; a
        running slot finishes first). ``replace=false`` only creates it: 409 when it exists
        (what the dashboard's *Create* sends)."""
        if body.schedule is None:
            raise unprocessable("a schedule is required (its string form)", ["body", "schedule"])
        create_only = not replace
        async with _answered(timeout):
            client = state.client
            client._schedule_job(name)  # 404 for a name that is no PersistentScheduleJob
            existed = await client.get_schedule(name, instance_id) is not None
            if existed and create_only:
                raise _exists(name, instance_id)
            written = await client.create_schedule(
                name,
                instance_id,
                body.schedule,
                body.data,
                replace=not create_only,
                start_at=body.start_at,
                end_at=body.end_at,
                max_runs=body.max_runs,
            )
            if not written:  # create only, and it was created meanwhile
                raise _exists(name, instance_id)
            info = await client.get_schedule(name, instance_id)
        reads_of(state).forget()
        if info is None:
            raise HTTPException(409, detail="it was deleted meanwhile; try again")
        return ScheduleChanged(
            job=name,
            instance_id=instance_id,
            created=not existed,
            schedule=_view(info),
            detail="replaced" if existed else "created",
        )

    return put_schedule


def _exists(name: str, instance_id: str) -> HTTPException:
    return HTTPException(
        409,
        detail=(
            f"the schedule {name}/{instance_id} exists already (nothing changed): edit it, or "
            "PUT without replace=false to replace it"
        ),
    )


def _patch(timeout: float) -> Callable[..., Any]:
    async def patch_schedule(
        name: Name, instance_id: ScheduleId, state: State, body: Annotated[ScheduleBody, Body()]
    ) -> ScheduleChanged:
        """Change the fields given; the rest stays. Takes effect from the next slot."""
        given = body.model_dump(exclude_unset=True)
        if not given:
            raise unprocessable("give at least one field to change", ["body"])
        async with _answered(timeout):
            info = await state.client.update_schedule(name, instance_id, **given)
        reads_of(state).forget()
        return ScheduleChanged(
            job=name,
            instance_id=instance_id,
            created=False,
            schedule=_view(info),
            detail="changed; it takes effect from the next slot",
        )

    return patch_schedule


def _delete(timeout: float) -> Callable[..., Any]:
    async def delete_schedule(name: Name, instance_id: ScheduleId, state: State) -> Response:
        """204; 404 when there is no such schedule."""
        async with _answered(timeout):
            deleted = await state.client.delete_schedule(name, instance_id)
        reads_of(state).forget()
        if not deleted:
            raise HTTPException(404, detail=f"no schedule {name}/{instance_id}")
        return Response(status_code=204)

    return delete_schedule
