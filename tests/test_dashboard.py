"""GET /jobs/-/ui, the dashboard page, read over HTTP (the browser test drives it in Chromium)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.web import JobsReport, create_jobs_router
from ekbatan_fastapi.web.dashboard_html import (
    DashboardView,
    relative_time,
    render_dashboard,
)
from example_app.app import require_admin
from example_app.config import ExampleSettings, get_example_settings

from .helpers import RecordingJob, wait_until
from .test_jobs_routes import insert_row, require_token, serving

HOUR = timedelta(hours=1)
ADMIN = {"x-admin-token": "let-me-in"}
EVIL = "<script>alert('x')</script>\"&"


async def page(client: httpx.AsyncClient, **headers: str) -> httpx.Response:
    response = await client.get("/jobs/-/ui", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    return response


def actions(html: str) -> set[str]:
    return set(re.findall(r'data-action="([a-z-]+)"', html))


async def _failed(client: httpx.AsyncClient, name: str) -> bool:
    tasks = {t["name"]: t for t in (await client.get("/jobs")).json()["tasks"]}
    return bool(tasks.get(name, {}).get("state") == "failing")


async def test_dashboard_shows_tasks_errors_and_instances(
    engine: AsyncEngine, database_url: str
) -> None:
    bad = RecordingJob("bad-job", Schedules.fixed_delay(HOUR), fail=True)
    ok = RecordingJob("ok-job", Schedules.cron("0 3 * * *"))
    await insert_row(engine, EVIL, consecutive_failures=2, last_failure=datetime.now(UTC))
    async with serving(database_url, bad, ok) as (client, state):
        await wait_until(lambda: _failed(client, "bad-job"), what="the failure")
        await wait_until(lambda: _has_message(client), what="the failure in the history")
        response = await page(client)
        html = response.text
        assert 'data-name="bad-job"' in html and 'data-state="failing"' in html
        assert "RuntimeError: bad-job failed on purpose" in html
        assert 'data-name="ok-job"' in html and "CRON|0 3 * * *" in html
        assert 'class="badge st-failing">failing<' in html
        assert state.registry.status().name in html
        assert "(this page)" in html  # the instance list
        assert "Event-loop lag" in html
        # Hostile names are escaped everywhere: as text and inside attributes.
        assert EVIL not in html
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;&amp;" in html
        assert html.count("<script") == 1
        # Offline: nothing is loaded from elsewhere, and the CSP forbids it anyway.
        assert not re.search(r"(src|href)=\"(https?:)?//", html)
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        nonce = re.search(r"script-src 'nonce-([^']+)'", csp)
        assert nonce is not None and f'<script nonce="{nonce.group(1)}">' in html
        assert response.headers["cache-control"] == "no-store"
        # Read-only router: no buttons, no sign-in link.
        assert actions(html) == set()
        assert "sign in" not in html
        assert 'data-refresh="5"' in html
        assert 'data-refresh="0"' in (await client.get("/jobs/-/ui?refresh=0")).text


async def _has_message(client: httpx.AsyncClient) -> bool:
    return "failed on purpose" in (await client.get("/jobs/-/ui")).text


async def test_buttons_only_when_the_dependency_accepts_the_request(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, ok, router=router) as (client, state):
        await wait_until(lambda: _scheduled(client), what="first run")
        refused = (await page(client)).text
        assert actions(refused) == set()
        assert '<a href="ui?sign_in=1">sign in for actions</a>' in refused
        assert actions((await page(client, **{"x-admin-token": "guess"})).text) == set()
        allowed = (await page(client, **ADMIN)).text
        assert actions(allowed) == {"run", "pause"}
        assert "sign in" not in allowed
        from_a_link = await page(client, **ADMIN, **{"sec-fetch-site": "cross-site"})
        assert actions(from_a_link.text) == {"run", "pause"}  # only its POSTs are checked
        await state.client.pause("ok-job", "<b>why</b>")
        paused = (await page(client, **ADMIN)).text
        assert actions(paused) == {"resume", "resume-skip", "force"}
        assert "&lt;b&gt;why&lt;/b&gt;" in paused and "<b>why</b>" not in paused
        # The sign-in link answers with the dependency's refusal, or leads back to the page.
        sign_in = await client.get("/jobs/-/ui?sign_in=1")
        assert sign_in.status_code == 403
        assert sign_in.json() == {"detail": "admin token required"}
        signed_in = await client.get("/jobs/-/ui?sign_in=1", headers=ADMIN)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "ui"


async def _scheduled(client: httpx.AsyncClient) -> bool:
    tasks = {t["name"]: t for t in (await client.get("/jobs")).json()["tasks"]}
    return bool(tasks.get("ok-job", {}).get("state") == "scheduled")


class Sessions:
    """A cookie-based authorization with a sub-dependency, as an application might write it."""

    def __init__(self) -> None:
        self.valid = {"s3cret"}

    def __call__(self, request: Request) -> set[str]:
        return self.valid


sessions = Sessions()


async def cookie_admin(
    request: Request,
    valid: Annotated[set[str], Depends(sessions)],
    x_required: Annotated[str, Header()],  # required: a request without it fails validation
) -> str:
    if request.cookies.get("session") not in valid:
        raise HTTPException(401, headers={"WWW-Authenticate": 'Basic realm="jobs"'})
    return "cookie-admin"


async def test_dashboard_judges_any_dependency_as_fastapi_does(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=Depends(cookie_admin), prefix="/ops/jobs")
    async with serving(database_url, ok, router=router) as (client, _):
        ui = "/ops/jobs/-/ui"
        no_cookie = await client.get(ui, headers={"x-required": "1"})
        assert actions(no_cookie.text) == set()
        client.cookies.set("session", "s3cret")
        missing_header = await client.get(ui)
        assert missing_header.status_code == 200  # the check's 422 only hides the buttons
        assert actions(missing_header.text) == set()
        allowed = await client.get(ui, headers={"x-required": "1"})
        assert actions(allowed.text) == {"run", "pause"}
        assert 'href="/ops/jobs">JSON</a>' in allowed.text
        client.cookies.clear()
        challenge = await client.get(f"{ui}?sign_in=1", headers={"x-required": "1"})
        assert challenge.status_code == 401
        assert challenge.headers["www-authenticate"] == 'Basic realm="jobs"'  # as it raised


def test_relative_time() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert relative_time(now + timedelta(seconds=4), now) == "in 4 s"
    assert relative_time(now - timedelta(minutes=12), now) == "12 min ago"
    assert relative_time(now - timedelta(hours=3), now) == "3.0 h ago"
    assert relative_time(now + timedelta(days=2), now) == "in 2.0 d"
    assert relative_time(now, now) == "just now"
    assert relative_time(now, None) == "2026-01-01T12:00:00+00:00"


def test_an_unreachable_database_renders_the_problem() -> None:
    report = JobsReport.model_validate(
        {
            "healthy": False,
            "problems": ["database unreachable: <refused>"],
            "database_time": None,
            "scheduler": {
                "name": "node-1",
                "started_at": None,
                "ready": False,
                "stopping": False,
                "database_reachable": False,
                "last_error": "OSError: <refused>",
                "last_successful_poll": None,
                "polling_strategy": "fetch",
                "batch_size": 50,
                "loop_restarts": 0,
                "polling_interval": "PT10S",
                "heartbeat_interval": "PT10S",
                "dead_after": "PT1M",
                "jobs": [],
                "running": [],
            },
            "tasks": [],
        }
    )
    html = render_dashboard(DashboardView(report=report, refresh=0), nonce="n")
    assert "unhealthy" in html and "database unreachable: &lt;refused&gt;" in html
    assert "No tasks in the table." in html and "No instance has reported itself." in html
    assert "automatic refresh off" in html and 'http-equiv="refresh"' not in html


async def test_example_admin_accepts_the_token_or_basic_auth() -> None:
    app = FastAPI()

    @app.get("/who")
    async def who(user: Annotated[str, Depends(require_admin)]) -> str:
        return user

    settings = ExampleSettings(admin_token=SecretStr("s3cret"))
    app.dependency_overrides[get_example_settings] = lambda: settings
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        token = {"x-admin-token": "s3cret"}
        assert (await client.get("/who", headers=token)).json() == "admin (token)"
        assert (await client.get("/who", auth=("alice", "s3cret"))).json() == "alice"
        for wrong in (b"nope", "s3cret-ü".encode()):  # not a 500 for a non-ASCII header
            response = await client.get("/who", headers={b"x-admin-token": wrong})
            assert response.status_code == 401
        refused = await client.get("/who", auth=("alice", "wrong"))
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic ")
        settings = ExampleSettings()
        assert (await client.get("/who", auth=("alice", "s3cret"))).status_code == 403
