"""GET /jobs (states, health, 503), GET /jobs/{name}, and the admin routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Header, HTTPException
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, Job, OneTimeJob, Schedules, scheduled_tasks
from ekbatan_fastapi.client import ScheduledTask
from ekbatan_fastapi.web import (
    EkbatanState,
    create_ekbatan_lifespan,
    create_jobs_router,
    derive_state,
    jobs_router,
)

from .fastapi_helpers import fast_settings, running
from .helpers import RecordingJob, wait_until

HOUR = timedelta(hours=1)


def require_token(x_admin_token: str | None = Header(default=None)) -> None:
    """The application's authorization dependency."""
    if x_admin_token != "let-me-in":
        raise HTTPException(status_code=403, detail="admin token required")


class DataJob(OneTimeJob):
    def name(self) -> str:
        return "with-data"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


def make_app(database_url: str, *jobs: Job, router: Any = None, url: str | None = None) -> FastAPI:
    lifespan = create_ekbatan_lifespan(
        settings=fast_settings(url or database_url), jobs=jobs, discover=False
    )
    app = FastAPI(lifespan=lifespan)
    app.include_router(router if router is not None else jobs_router)
    return app


@asynccontextmanager
async def serving(
    database_url: str, *jobs: Job, router: Any = None
) -> AsyncIterator[tuple[httpx.AsyncClient, EkbatanState]]:
    app = make_app(database_url, *jobs, router=router)
    async with running(app) as client:
        state = app.state.ekbatan
        assert await state.registry.wait_until_ready(10)
        yield client, state


async def insert_row(engine: AsyncEngine, name: str, **values: Any) -> None:
    row = {
        "task_name": name,
        "task_instance": "recurring",
        "execution_time": datetime.now(UTC) + HOUR,
        "picked": False,
        "version": 1,
        "consecutive_failures": 0,
        "priority": 0,
        **values,
    }
    async with engine.begin() as conn:
        await conn.execute(insert(scheduled_tasks).values(row))


async def tasks_by_name(client: httpx.AsyncClient, path: str = "/jobs") -> dict[str, Any]:
    return {t["name"]: t for t in (await client.get(path)).json()["tasks"]}


async def test_jobs_shows_every_task_with_its_derived_state(
    engine: AsyncEngine, database_url: str
) -> None:
    release = asyncio.Event()
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    bad = RecordingJob("bad-job", Schedules.fixed_delay(HOUR), fail=True)
    busy = RecordingJob("busy-job", Schedules.fixed_delay(HOUR), block=release)
    await insert_row(engine, "other-service-job")
    try:
        async with serving(database_url, ok, bad, busy) as (client, state):
            await wait_until(lambda: bool(ok.slots and bad.slots and busy.slots), what="runs")
            await wait_until(
                lambda: _states(client, {"ok-job": "scheduled", "bad-job": "failing"}),
                what="results recorded",
            )
            response = await client.get("/jobs")
            assert response.status_code == 200
            body = response.json()
            assert body["healthy"] is True and body["problems"] == []
            tasks = {t["name"]: t for t in body["tasks"]}
            assert {n: t["state"] for n, t in tasks.items()} == {
                "ok-job": "scheduled",
                "bad-job": "failing",
                "busy-job": "running",
                "other-service-job": "unresolved",
            }
            me = state.registry.status().name
            assert tasks["busy-job"]["picked_by"] == me
            assert 0 <= tasks["busy-job"]["fraction_dead"] < 1
            assert tasks["busy-job"]["heartbeat_age_seconds"] is not None
            assert tasks["bad-job"]["consecutive_failures"] == 1
            assert tasks["bad-job"]["last_failure"] is not None
            assert tasks["ok-job"]["last_success"] is not None
            assert tasks["ok-job"]["schedule"] == "FIXED_DELAY|PT1H"
            assert tasks["ok-job"]["kind"] == "recurring"
            assert tasks["other-service-job"]["kind"] == "unknown"
            assert tasks["other-service-job"]["schedule"] is None
            scheduler = body["scheduler"]
            assert scheduler["name"] == me and scheduler["ready"] is True
            assert scheduler["database_reachable"] is True
            assert scheduler["last_successful_poll"] is not None
            assert scheduler["polling_interval"] == "PT0.1S"
            assert scheduler["dead_after"] == "PT2S"
            assert scheduler["jobs"] == ["bad-job", "busy-job", "ok-job"]
            assert [r["task_name"] for r in scheduler["running"]] == ["busy-job"]
            assert body["database_time"] is not None
            release.set()  # let shutdown find nothing running
    finally:
        release.set()


async def _states(client: httpx.AsyncClient, expected: dict[str, str]) -> bool:
    tasks = await tasks_by_name(client)
    return all(tasks.get(name, {}).get("state") == s for name, s in expected.items())


async def test_dead_task_makes_jobs_answer_503(engine: AsyncEngine, database_url: str) -> None:
    stale = datetime.now(UTC) - HOUR
    await insert_row(
        engine,
        "crashed-elsewhere",
        picked=True,
        picked_by="node-7",
        last_heartbeat=stale,
        execution_time=stale,
    )
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    async with serving(database_url, ok) as (client, _):
        response = await client.get("/jobs")
        assert response.status_code == 503
        body = response.json()
        assert body["healthy"] is False
        assert "crashed-elsewhere/recurring is dead: picked by node-7" in body["problems"][0]
        dead = {t["name"]: t for t in body["tasks"]}["crashed-elsewhere"]
        assert dead["state"] == "dead" and dead["fraction_dead"] > 1
        assert (await client.get("/jobs/crashed-elsewhere")).status_code == 503
        assert (await client.get("/jobs/ok-job")).status_code == 200


NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def task(**values: Any) -> ScheduledTask:
    fields: dict[str, Any] = {
        "task_name": "t",
        "task_instance": "recurring",
        "execution_time": NOW + HOUR,
        "picked": False,
        "picked_by": None,
        "last_success": None,
        "last_failure": None,
        "consecutive_failures": 0,
        "last_heartbeat": None,
        "version": 1,
        "priority": 0,
        "task_data": None,
    }
    return ScheduledTask(**{**fields, **values})


@pytest.mark.parametrize(
    ("row", "known", "expected"),
    [
        (task(), True, "scheduled"),
        (task(execution_time=NOW - timedelta(seconds=1)), True, "scheduled"),  # within grace
        (task(execution_time=NOW - timedelta(seconds=30)), True, "overdue"),
        (task(consecutive_failures=2), True, "failing"),
        (task(consecutive_failures=2, execution_time=NOW - HOUR), True, "overdue"),
        (task(picked=True, last_heartbeat=NOW - timedelta(seconds=5)), True, "running"),
        (task(picked=True, last_heartbeat=NOW - timedelta(seconds=61)), True, "dead"),
        (task(picked=True, last_heartbeat=None), True, "dead"),
        (task(), False, "unresolved"),
        (task(picked=True, last_heartbeat=NOW), False, "running"),
    ],
)
def test_derived_state(row: ScheduledTask, known: bool, expected: str) -> None:
    state = derive_state(
        row,
        NOW,
        known=known,
        dead_after=timedelta(seconds=60),
        overdue_after=timedelta(seconds=20),
    )
    assert state == expected


async def test_task_data_is_hidden_unless_enabled(engine: AsyncEngine, database_url: str) -> None:
    for include in (False, True):
        router = create_jobs_router(include_task_data=include)
        async with serving(database_url, DataJob(), router=router) as (client, state):
            await state.client.schedule(
                "with-data", f"i-{include}", datetime.now(UTC) + HOUR, {"email": "a@b.c"}
            )
            shown = (await client.get("/jobs/with-data")).json()["tasks"]
            assert [t["task_data"] for t in shown if t["instance"] == f"i-{include}"] == [
                {"email": "a@b.c"} if include else None
            ]
            if not include:
                assert "a@b.c" not in (await client.get("/jobs")).text


async def test_job_by_name(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    off = RecordingJob("off-job", Schedules.disabled())
    await insert_row(engine, "ghost")
    async with serving(database_url, ok, off) as (client, _):
        body = (await client.get("/jobs/ok-job")).json()
        assert [t["name"] for t in body["tasks"]] == ["ok-job"]
        assert (await client.get("/jobs/off-job")).json()["tasks"] == []  # known, no row
        assert (await client.get("/jobs/ghost")).json()["tasks"][0]["state"] == "unresolved"
        missing = await client.get("/jobs/no-such-job")
        assert missing.status_code == 404
        assert "no-such-job" in missing.json()["detail"]


async def test_admin_routes_do_not_exist_without_a_dependency(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    async with serving(database_url, ok) as (client, _):
        for action in ("run", "pause", "resume"):
            response = await client.post(f"/jobs/ok-job/{action}")
            assert response.status_code in (404, 405)
        paths = (await client.get("/openapi.json")).json()["paths"]
        assert set(paths) == {
            "/jobs",
            "/jobs/{name}",
            "/jobs/{name}/history",
            "/jobs/{name}/schedules",  # read-only; its admin verbs need the dependency
        }


async def test_admin_dependency_refuses(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, state):
        await wait_until(lambda: _states(client, {"ok-job": "scheduled"}), what="first run")

        async def first_run_recorded() -> bool:  # "scheduled" is also the row before its run
            task = await state.client.get("ok-job", "recurring")
            return task is not None and task.last_success is not None

        await wait_until(first_run_recorded, what="the first run's result")
        before = await state.client.get("ok-job", "recurring")
        refused = await client.post("/jobs/ok-job/run")
        assert refused.status_code == 403
        refused = await client.post("/jobs/ok-job/run", headers={"x-admin-token": "guess"})
        assert refused.status_code == 403
        assert await state.client.get("ok-job", "recurring") == before
        assert "/jobs/{name}/run" in (await client.get("/openapi.json")).json()["paths"]


async def test_run_now_makes_the_job_run_again(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, _):
        await wait_until(lambda: len(ok.slots) == 1, what="first run")
        await wait_until(lambda: _states(client, {"ok-job": "scheduled"}), what="recorded")
        response = await client.post("/jobs/ok-job/run", headers={"x-admin-token": "let-me-in"})
        assert response.status_code == 202
        assert response.json()["name"] == "ok-job"
        await wait_until(lambda: len(ok.slots) == 2, what="second run")


async def test_run_now_keeps_failure_counters(engine: AsyncEngine, database_url: str) -> None:
    failed_at = datetime.now(UTC) - timedelta(minutes=5)
    await insert_row(engine, "flaky", consecutive_failures=3, last_failure=failed_at)
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, router=router) as (client, state):
        response = await client.post("/jobs/flaky/run", headers={"x-admin-token": "let-me-in"})
        assert response.status_code == 202
        row = await state.client.get("flaky", "recurring")
        assert row is not None
        async with engine.connect() as conn:
            db_now = (await conn.execute(select(func.now()))).scalar_one()
        assert row.execution_time <= db_now
        assert (row.consecutive_failures, row.last_failure) == (3, failed_at)


async def test_run_now_answers_409_while_running_and_404_when_unknown(
    engine: AsyncEngine, database_url: str
) -> None:
    release = asyncio.Event()
    busy = RecordingJob("busy-job", Schedules.fixed_delay(HOUR), block=release)
    router = create_jobs_router(admin_dependency=require_token)
    headers = {"x-admin-token": "let-me-in"}
    try:
        async with serving(database_url, busy, router=router) as (client, _):
            await busy.started.wait()
            conflict = await client.post("/jobs/busy-job/run", headers=headers)
            assert conflict.status_code == 409
            assert "running right now" in conflict.json()["detail"]
            missing = await client.post("/jobs/nope/run", headers=headers)
            assert missing.status_code == 404
            release.set()
    finally:
        release.set()


async def test_run_now_of_a_paused_task_needs_force(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    headers = {"x-admin-token": "let-me-in"}
    async with serving(database_url, ok, router=router) as (client, state):
        await wait_until(lambda: _states(client, {"ok-job": "scheduled"}), what="first run")
        await state.client.pause("ok-job", "maintenance")
        refused = await client.post("/jobs/ok-job/run", headers=headers)
        assert refused.status_code == 409
        assert "paused" in refused.json()["detail"]
        forced = await client.post("/jobs/ok-job/run?force=true", headers=headers)
        assert forced.status_code == 202
        await wait_until(lambda: len(ok.slots) == 2, what="forced run")


async def test_unreachable_database_answers_503_on_every_route(database_url: str) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    app = make_app(database_url, router=router, url="postgresql+asyncpg://u:pw@127.0.0.1:1/x")
    async with running(app) as client:
        listing = await client.get("/jobs")
        assert listing.status_code == 503
        assert listing.json()["tasks"] == []
        assert (await client.get("/jobs/anything")).status_code == 503
        run = await client.post("/jobs/x/run", headers={"x-admin-token": "let-me-in"})
        assert run.status_code == 503
        assert "pw@" not in listing.text + run.text


async def test_missing_table_answers_503_with_the_fix(database_url: str) -> None:
    app = make_app(database_url)  # a fresh database: no scheduled_tasks table
    async with running(app) as client:
        response = await client.get("/jobs")
    assert response.status_code == 503
    assert "create_schema" in response.json()["problems"][0]


async def test_jobs_without_the_lifespan_explains_itself() -> None:
    app = FastAPI()
    app.include_router(jobs_router)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        response = await client.get("/jobs")
    assert response.status_code == 500
    assert "ekbatan_lifespan" in response.json()["detail"]


async def test_openapi_documents_the_report(engine: AsyncEngine, database_url: str) -> None:
    async with serving(database_url) as (client, _):
        spec = (await client.get("/openapi.json")).json()
    responses = spec["paths"]["/jobs"]["get"]["responses"]
    assert set(responses) >= {"200", "503"}
    schemas = spec["components"]["schemas"]
    assert {"JobsReport", "TaskView", "SchedulerView"} <= set(schemas)
    assert "dead" in schemas["TaskView"]["properties"]["state"]["enum"]
