"""Schedules as data over HTTP: the paged list (read-only), and the admin PUT/PATCH/DELETE
behind the authorization dependency and the cross-site checks."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, PersistentScheduleJob
from ekbatan_fastapi.web import (
    create_ekbatan_lifespan,
    create_jobs_router,
    jobs_router,
    metrics_router,
)

from .fastapi_helpers import fast_settings, running
from .test_jobs_routes import require_token, serving

ADMIN = {"x-admin-token": "let-me-in"}


class Report(BaseModel):
    tenant: str


class TenantReport(PersistentScheduleJob[Report]):
    def name(self) -> str:
        return "report"

    async def execute(self, ctx: ExecutionContext[Report]) -> None:
        pass


async def test_list_pages_through_schedules_by_state(
    database_url: str, engine: AsyncEngine
) -> None:
    async with serving(database_url, TenantReport()) as (client, state):
        await state.client.create_schedules(
            "report", [(f"t{i:02}", "DAILY|03:00", {"tenant": f"t{i}"}) for i in range(25)]
        )
        await state.client.pause("report", "audit", instance_id="t07")
        page = (await client.get("/jobs/report/schedules?limit=10")).json()
        assert len(page["schedules"]) == 10 and page["next_offset"] == 10
        rest = (await client.get("/jobs/report/schedules?limit=10&offset=20")).json()
        assert len(rest["schedules"]) == 5 and rest["next_offset"] is None
        paused = (await client.get("/jobs/report/schedules?state=paused")).json()
        assert [s["instance_id"] for s in paused["schedules"]] == ["t07"]
        assert paused["schedules"][0]["paused"]["reason"] == "audit"
        first = page["schedules"][0]
        assert first["schedule"] == "DAILY|03:00" and first["state"] == "scheduled"
        assert (await client.get("/jobs/report/schedules?state=bogus")).status_code == 422
        missing = await client.get("/jobs/nothing/schedules")
        assert missing.status_code == 404 and "report" in missing.json()["detail"]
        # no admin routes without the dependency
        assert (await client.delete("/jobs/report/schedules/t01")).status_code in (404, 405)


async def test_admin_put_patch_delete(database_url: str, engine: AsyncEngine) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, TenantReport(), router=router) as (client, state):
        body = {"schedule": "CRON|0 8 * * 1-5|Europe/Berlin", "data": {"tenant": "acme"}}
        assert (await client.put("/jobs/report/schedules/acme", json=body)).status_code == 403
        made = await client.put("/jobs/report/schedules/acme", json=body, headers=ADMIN)
        assert made.status_code == 200, made.text
        assert made.json()["created"] is True
        assert made.json()["schedule"]["schedule"] == "CRON|0 8 * * 1-5|Europe/Berlin"
        again = await client.put("/jobs/report/schedules/acme", json=body, headers=ADMIN)
        assert again.json()["created"] is False
        patched = await client.patch(
            "/jobs/report/schedules/acme", json={"data": {"tenant": "acme-2"}}, headers=ADMIN
        )
        assert patched.status_code == 200, patched.text
        view = patched.json()["schedule"]
        assert view["data"] == {"tenant": "acme-2"} and view["schedule"].startswith("CRON")
        # bad input: 422 naming the field, nothing written
        bad = await client.patch(
            "/jobs/report/schedules/acme", json={"data": {"tenant": 5}}, headers=ADMIN
        )
        assert bad.status_code == 422 and "tenant" in bad.text
        bad = await client.put(
            "/jobs/report/schedules/x", json={"schedule": "CRON|nope"}, headers=ADMIN
        )
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "schedule"]
        missing = await client.patch(
            "/jobs/report/schedules/nobody", json={"data": {"tenant": "a"}}, headers=ADMIN
        )
        assert missing.status_code == 404
        # a page on another site cannot drive it
        hostile = {**ADMIN, "origin": "https://evil.example"}
        assert (
            await client.delete("/jobs/report/schedules/acme", headers=hostile)
        ).status_code == 403
        assert (
            await client.delete("/jobs/report/schedules/acme", headers=ADMIN)
        ).status_code == 204
        assert (
            await client.delete("/jobs/report/schedules/acme", headers=ADMIN)
        ).status_code == 404
        assert await state.client.get_schedule("report", "acme") is None


async def test_jobs_counts_schedules_by_state_and_metrics_export_them(
    database_url: str, engine: AsyncEngine
) -> None:
    settings = fast_settings(database_url, metrics=True)
    lifespan = create_ekbatan_lifespan(settings=settings, jobs=[TenantReport()], discover=False)
    app = FastAPI(lifespan=lifespan)
    app.include_router(jobs_router)
    app.include_router(metrics_router)
    async with running(app) as client:
        state = app.state.ekbatan
        assert await state.registry.wait_until_ready(10)
        await state.client.create_schedules(
            "report", [(f"t{i}", "DAILY|03:00", {"tenant": f"t{i}"}) for i in range(5)]
        )
        await state.client.pause("report", instance_id="t1")
        jobs = {j["name"]: j for j in (await client.get("/jobs")).json()["jobs"]}
        assert jobs["report"]["schedules"] == {"scheduled": 4, "paused": 1}
        text = (await client.get("/metrics")).text
        assert 'ekbatan_schedules{state="scheduled",task="report"} 4.0' in text
        assert 'ekbatan_schedules{state="paused",task="report"} 1.0' in text
        assert 'ekbatan_schedules{state="parked",task="report"} 0.0' in text
