"""The operations routes: pause state and live instances on /jobs, the history route, pause and
resume (admin), and the cross-site guard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi import Header, HTTPException
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import Schedules, create_schema
from ekbatan_fastapi.store.tables import Tables
from ekbatan_fastapi.web import EkbatanState, create_jobs_router

from .helpers import RecordingJob, wait_until
from .test_jobs_routes import insert_row, require_token, serving

HOUR = timedelta(hours=1)
ADMIN = {"x-admin-token": "let-me-in"}


def named_admin(x_admin_token: str | None = Header(default=None)) -> str:
    """An authorization dependency that names the admin (it becomes ``paused_by``)."""
    if x_admin_token != "let-me-in":
        raise HTTPException(status_code=401, detail="who are you?")
    return "alice@example.com"


async def tasks_by_name(client: httpx.AsyncClient) -> dict[str, Any]:
    return {t["name"]: t for t in (await client.get("/jobs")).json()["tasks"]}


async def _state_is(client: httpx.AsyncClient, name: str, state: str) -> bool:
    return bool((await tasks_by_name(client)).get(name, {}).get("state") == state)


async def test_jobs_shows_pauses_instances_and_loop_lag(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    async with serving(database_url, ok) as (client, state):
        await wait_until(lambda: _state_is(client, "ok-job", "scheduled"), what="first run")
        await wait_until(lambda: _has_instances(client), what="the instance row")
        await state.client.pause("ok-job", "deploying v2", paused_by="ops")
        body = (await client.get("/jobs")).json()
        assert body["healthy"] is True and body["warnings"] == []
        task = {t["name"]: t for t in body["tasks"]}["ok-job"]
        assert task["state"] == "paused"
        assert task["paused"]["paused_by"] == "ops"
        assert task["paused"]["reason"] == "deploying v2"
        assert task["paused"]["paused_at"] is not None
        assert [p["name"] for p in body["paused"]] == ["ok-job"]
        (me,) = body["instances"]
        assert me["name"] == state.registry.status().name
        assert me["alive"] is True and me["this_instance"] is True
        assert me["pid"] > 0 and me["host"] and me["library_version"]
        assert 0 <= me["last_seen_age_seconds"] < 2
        scheduler = body["scheduler"]
        assert {"loop_lag_events", "max_loop_lag_seconds", "last_loop_lag_at"} <= set(scheduler)
        by_name = (await client.get("/jobs/ok-job")).json()
        assert by_name["tasks"][0]["state"] == "paused"
        assert [p["name"] for p in by_name["paused"]] == ["ok-job"]


async def _has_instances(client: httpx.AsyncClient) -> bool:
    return bool((await client.get("/jobs")).json()["instances"])


async def test_an_instance_gone_quiet_is_listed_as_not_alive(
    engine: AsyncEngine, database_url: str
) -> None:
    tables = Tables()
    long_ago = datetime.now(UTC) - HOUR
    async with engine.begin() as conn:
        await conn.execute(
            insert(tables.instances).values(
                name="node-9",
                host="gone.example",
                pid=42,
                started_at=long_ago,
                last_seen=long_ago,
                library_version="0.0.9",
            )
        )
    async with serving(database_url) as (client, _):
        await wait_until(lambda: _instance_count(client, 2), what="this instance's row")
        body = (await client.get("/jobs")).json()
        instances = {i["name"]: i for i in body["instances"]}
        assert instances["node-9"]["alive"] is False
        assert instances["node-9"]["last_seen_age_seconds"] > 3000
        assert body["healthy"] is True  # a quiet peer is not this instance's problem


async def _instance_count(client: httpx.AsyncClient, n: int) -> bool:
    return len((await client.get("/jobs")).json()["instances"]) == n


async def test_history_pages_newest_first(engine: AsyncEngine, database_url: str) -> None:
    bad = RecordingJob("bad-job", Schedules.fixed_delay(timedelta(milliseconds=50)), fail=True)
    async with serving(database_url, bad) as (client, _):
        await wait_until(lambda: _history_size(client, "bad-job", 3), what="three records")
        first = (await client.get("/jobs/bad-job/history?limit=2")).json()
        assert first["name"] == "bad-job"
        ids = [r["id"] for r in first["records"]]
        assert len(ids) == 2 and ids[0] > ids[1]
        assert first["next_before_id"] == ids[1]
        record = first["records"][0]
        assert record["outcome"] == "failed"
        assert record["error_class"] == "RuntimeError"
        assert record["error_message"] == "bad-job failed on purpose"
        assert record["task_instance"] == "recurring" and record["picked_by"]
        assert record["duration_seconds"] >= 0
        second = (await client.get(f"/jobs/bad-job/history?limit=2&before_id={ids[1]}")).json()
        assert all(r["id"] < ids[1] for r in second["records"])
        assert second["records"]
        everything = (await client.get("/jobs/bad-job/history?limit=1000")).json()
        assert everything["next_before_id"] is None


async def _history_size(client: httpx.AsyncClient, name: str, n: int) -> bool:
    return len((await client.get(f"/jobs/{name}/history")).json()["records"]) >= n


async def test_history_of_an_unknown_name_is_404(engine: AsyncEngine, database_url: str) -> None:
    idle = RecordingJob("idle", Schedules.disabled())
    await insert_row(engine, "other-service-job")
    async with serving(database_url, idle) as (client, _):
        missing = await client.get("/jobs/no-such-job/history")
        assert missing.status_code == 404
        assert "no-such-job" in missing.json()["detail"]
        for known in ("idle", "other-service-job"):  # registered, or a row: an empty page
            page = await client.get(f"/jobs/{known}/history")
            assert page.status_code == 200
            assert page.json() == {"name": known, "records": [], "next_before_id": None}
        assert (await client.get("/jobs/idle/history?limit=0")).status_code == 422
        assert (await client.get("/jobs/idle/history?limit=1001")).status_code == 422


async def test_missing_operations_tables_answer_503_with_the_fix(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        await create_schema(engine, operations=False)
    finally:
        await engine.dispose()
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, _):
        await wait_until(lambda: _state_is(client, "ok-job", "scheduled"), what="first run")
        listing = await client.get("/jobs")
        assert listing.status_code == 200  # the scheduler works; only the extras are off
        assert "V0002__ekbatan_operations" in listing.json()["warnings"][0]
        assert listing.json()["instances"] == []
        for response in (
            await client.get("/jobs/ok-job/history"),
            await client.post("/jobs/ok-job/pause", headers=ADMIN),
            await client.post("/jobs/ok-job/resume", headers=ADMIN),
        ):
            assert response.status_code == 503
            assert "create_schema" in response.json()["detail"]
        page = await client.get("/jobs/-/ui")
        assert page.status_code == 200
        assert "V0002__ekbatan_operations" in page.text


async def test_pause_and_resume_routes(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, state):
        await wait_until(lambda: _state_is(client, "ok-job", "scheduled"), what="first run")
        assert (await client.post("/jobs/ok-job/pause")).status_code == 403
        assert await state.client.paused() == {}

        paused = await client.post("/jobs/ok-job/pause?reason=db%20migration", headers=ADMIN)
        assert paused.status_code == 200
        body = paused.json()
        assert body["name"] == "ok-job" and body["reason"] == "db migration"
        assert body["paused_by"] == state.registry.status().name  # the dependency names no one
        assert await _state_is(client, "ok-job", "paused")
        refused = await client.post("/jobs/ok-job/run", headers=ADMIN)
        assert refused.status_code == 409

        again = await client.post(
            "/jobs/ok-job/pause", json={"reason": "new reason"}, headers=ADMIN
        )
        assert again.json()["reason"] == "new reason"
        too_long = await client.post(
            "/jobs/ok-job/pause", json={"reason": "x" * 1001}, headers=ADMIN
        )
        assert too_long.status_code == 422
        assert (await client.post("/jobs/nope/pause", headers=ADMIN)).status_code == 404
        assert (await client.post("/jobs/nope/resume", headers=ADMIN)).status_code == 404

        assert (await client.post("/jobs/ok-job/resume")).status_code == 403
        resumed = await client.post("/jobs/ok-job/resume", headers=ADMIN)
        assert resumed.status_code == 200
        assert resumed.json() == {
            "name": "ok-job",
            "resumed": True,
            "skip_missed": False,
            "detail": "resumed",
            "next_execution_time": None,
        }
        assert await _state_is(client, "ok-job", "scheduled")
        twice = await client.post("/jobs/ok-job/resume", headers=ADMIN)
        assert twice.json()["resumed"] is False


async def test_paused_by_is_the_admin_the_dependency_names(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=named_admin)
    async with serving(database_url, ok, router=router) as (client, state):
        assert (await client.post("/jobs/ok-job/pause")).status_code == 401
        response = await client.post("/jobs/ok-job/pause", headers=ADMIN)
        assert response.json()["paused_by"] == "alice@example.com"
        assert (await state.client.paused())["ok-job"].paused_by == "alice@example.com"


async def test_resume_runs_the_missed_slot_once_unless_skipped(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, state):
        await wait_until(lambda: _state_is(client, "ok-job", "scheduled"), what="first run")
        for skip in (True, False):
            await client.post("/jobs/ok-job/pause", headers=ADMIN)
            await _make_due(engine, "ok-job")
            runs = len(ok.slots)
            response = await client.post(
                f"/jobs/ok-job/resume?skip_missed={str(skip).lower()}", headers=ADMIN
            )
            assert response.json()["skip_missed"] is skip
            if skip:
                row = await state.client.get("ok-job", "recurring")
                assert row is not None and row.execution_time > datetime.now(UTC) + HOUR / 2
                moved = response.json()["next_execution_time"]
                assert datetime.fromisoformat(moved) == row.execution_time
            else:
                await wait_until(lambda: len(ok.slots) == runs + 1, what="the missed slot")  # noqa: B023
        assert len(ok.slots) == 2


async def _make_due(engine: AsyncEngine, name: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE scheduled_tasks SET execution_time = now() - interval '1 minute' "
                "WHERE task_name = :name"
            ),
            {"name": name},
        )


async def test_browsers_on_other_sites_cannot_act(engine: AsyncEngine, database_url: str) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    for allowed in (False, True):
        router = create_jobs_router(admin_dependency=require_token, cross_site_admin=allowed)
        async with serving(database_url, ok, router=router) as (client, state):
            for action in ("pause", "resume", "run"):
                response = await client.post(
                    f"/jobs/ok-job/{action}", headers={**ADMIN, "sec-fetch-site": "cross-site"}
                )
                if allowed:
                    # let through by the origin check; a 409 is the row's own state at that
                    # instant (the job's first slot running, or revived from the previous
                    # server's stop), not a refusal of the origin
                    assert response.status_code in (200, 202, 409), response.text
                    assert "cross-site" not in response.text
                else:
                    assert response.status_code == 403
                    assert "cross-site" in response.json()["detail"]
            await _resume(state)
            same = await client.post(
                "/jobs/ok-job/pause", headers={**ADMIN, "sec-fetch-site": "same-origin"}
            )
            assert same.status_code == 200
            await _resume(state)


async def _resume(state: EkbatanState) -> None:
    await state.client.resume("ok-job")


async def test_openapi_documents_the_operations_routes(
    engine: AsyncEngine, database_url: str
) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, router=router) as (client, _):
        spec = (await client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert set(paths) == {
        "/jobs",
        "/jobs/{name}",
        "/jobs/{name}/history",
        "/jobs/{name}/run",
        "/jobs/{name}/pause",
        "/jobs/{name}/resume",
        "/jobs/{name}/cancel",
        "/jobs/{name}/schedules",
        "/jobs/{name}/schedules/{instance_id}",
    }
    schemas = spec["components"]["schemas"]
    assert {"HistoryPage", "HistoryRecord", "InstanceView", "PauseView", "ResumeResult"} <= set(
        schemas
    )
    assert "paused" in schemas["TaskView"]["properties"]["state"]["enum"]
    pause = paths["/jobs/{name}/pause"]["post"]
    assert {p["name"] for p in pause["parameters"]} >= {"name", "reason"}
    assert "requestBody" in pause
    resume = paths["/jobs/{name}/resume"]["post"]
    assert {p["name"] for p in resume["parameters"]} >= {"skip_missed"}
