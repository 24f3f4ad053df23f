"""Hostile requests and hostile rows against the web routes (issue 27).

Cross-site admin actions (the issue's curl, an auto-submitted form, ``Referer`` alone, a
trusted extra origin), bad text in an admin body, rows holding deeply nested or huge JSON,
the names ``.`` and ``..``, and a database login failure shown to unauthenticated readers.
Every request is a real one through the app (httpx), against a real database.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import OneTimeJob, Schedules, job_registry
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.domain.text import is_valid_name
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import EkbatanState, create_ekbatan_lifespan, create_jobs_router

from .fastapi_helpers import FAST_JOBS, running
from .helpers import RecordingJob, wait_until
from .test_jobs_routes import DataJob, insert_row

HOUR = timedelta(hours=1)
TOKEN = "s3cret-token"
SELF = "http://testserver"
DOTS = re.escape("not '.' or '..'")

basic = HTTPBasic(auto_error=False)


def basic_admin(
    credentials: Annotated[HTTPBasicCredentials | None, Depends(basic)],
) -> str:
    """HTTP basic auth, any user name with the token as password: a browser resends it to
    every request to the site, cross-site forms included (the issue's victim)."""
    if credentials is None or not secrets.compare_digest(credentials.password, TOKEN):
        raise HTTPException(401, headers={"WWW-Authenticate": "Basic"})
    return credentials.username


def settings_for(url: str, **jobs: Any) -> EkbatanSettings:
    return EkbatanSettings(
        jobs={**FAST_JOBS, **jobs},
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": url}}}]}]},
    )


@asynccontextmanager
async def app_client(
    url: str, *jobs: Any, router: Any = None, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, EkbatanState]]:
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(
            settings=settings_for(url, **settings), jobs=jobs, discover=False
        )
    )
    app.include_router(router or create_jobs_router(admin_dependency=basic_admin))
    async with running(app) as client:
        state: EkbatanState = app.state.ekbatan
        assert await state.registry.wait_until_ready(10)
        yield client, state


async def paused(state: EkbatanState) -> dict[str, Any]:
    return dict(await state.client.paused())


# -- item 2: cross-site admin actions ---------------------------------------------------------


async def test_the_issues_curl_and_a_cross_site_form_are_refused(
    engine: AsyncEngine, database_url: str
) -> None:
    """``curl -X POST -u a:TOKEN -H 'Origin: http://evil.example' --data '' .../pause`` and the
    shapes an auto-submitted form on a hostile page takes: refused, nothing paused."""
    job = RecordingJob("demo", Schedules.fixed_delay(HOUR))
    async with app_client(database_url, job) as (client, state):
        auth = ("a", TOKEN)
        form = {"content-type": "application/x-www-form-urlencoded"}
        attempts = [
            # the issue's curl: --data '' sends an empty form-encoded body
            {**form, "origin": "http://evil.example"},
            # a form under Referrer-Policy: no-referrer: the browser sends Origin: null
            {**form, "origin": "null"},
            # a browser that sends no Origin on forms, its Referer another site's page
            {**form, "referer": "http://evil.example/cats.html"},
            # ... or no Referer either (the hostile page suppressed it)
            form,
            {"content-type": "multipart/form-data; boundary=x"},
            {"content-type": "text/plain"},
            # a fetch() from the hostile page, any body
            {"origin": "http://evil.example", "content-type": "application/json"},
            # the same host on another port or scheme is another origin
            {"origin": "http://testserver:8080"},
            {"origin": "https://testserver"},
            # kept: what the browser says itself
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site", "origin": SELF},
        ]
        for headers in attempts:
            for action in ("pause", "run", "resume"):
                response = await client.post(
                    f"/jobs/demo/{action}", auth=auth, headers=headers, content=b""
                )
                assert response.status_code == 403, (headers, action, response.text)
                detail = response.json()["detail"]
                assert detail.startswith("cross-site request refused"), detail
                assert "admin-trusted-origins" in detail
        body = await client.post(
            "/jobs/demo/pause?reason=pwned",
            auth=auth,
            headers={"origin": "http://evil.example"},
            data={"reason": "pwned"},
        )
        assert body.status_code == 403
        assert (
            "'http://evil.example' is neither this application's origin" in (body.json()["detail"])
        )
        assert await paused(state) == {}


async def test_same_origin_scripts_and_trusted_origins_are_served(
    engine: AsyncEngine, database_url: str
) -> None:
    job = RecordingJob("demo", Schedules.fixed_delay(HOUR))
    trusted = "https://ops.example.com"
    async with app_client(database_url, job, admin_trusted_origins=[trusted]) as (client, state):
        auth = ("alice", TOKEN)
        ok = [
            {},  # a script: no Origin, no Referer, no body
            {"origin": SELF, "sec-fetch-site": "same-origin"},  # the dashboard's fetch()
            {"origin": "HTTP://TESTSERVER:80"},  # the same origin, spelled otherwise
            {"referer": f"{SELF}/jobs/-/ui"},  # Referer alone, our own page
            {"origin": trusted},
            {"origin": f"{trusted}:443"},
            {"sec-fetch-site": "none"},  # typed into the address bar
        ]
        for headers in ok:
            response = await client.post("/jobs/demo/pause", auth=auth, headers=headers)
            assert response.status_code == 200, (headers, response.text)
            assert response.json()["paused_by"] == "alice"
            resumed = await client.post("/jobs/demo/resume", auth=auth, headers=headers)
            assert resumed.status_code == 200, (headers, resumed.text)
        # JSON without any browser header, and a form body from a trusted origin
        scripted = await client.post("/jobs/demo/pause", auth=auth, json={"reason": "deploy"})
        assert scripted.status_code == 200 and scripted.json()["reason"] == "deploy"
        form = await client.post(
            "/jobs/demo/pause",
            auth=auth,
            headers={"origin": trusted, "content-type": "application/x-www-form-urlencoded"},
        )
        assert form.status_code == 200, form.text
        # a trusted origin on another port is another origin
        other_port = await client.post(
            "/jobs/demo/resume", auth=auth, headers={"origin": f"{trusted}:8443"}
        )
        assert other_port.status_code == 403
        assert "demo" in await paused(state)
        # the origin check comes before the credentials' and does not replace them
        assert (await client.post("/jobs/demo/resume", headers={"origin": SELF})).status_code == 401


async def test_cross_site_admin_true_turns_the_origin_check_off(
    engine: AsyncEngine, database_url: str
) -> None:
    job = RecordingJob("demo", Schedules.fixed_delay(HOUR))
    router = create_jobs_router(admin_dependency=basic_admin, cross_site_admin=True)
    async with app_client(database_url, job, router=router) as (client, _):
        response = await client.post(
            "/jobs/demo/pause", auth=("a", TOKEN), headers={"origin": "https://spa.example"}
        )
        assert response.status_code == 200, response.text


def test_trusted_origins_are_validated_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "EKBATAN_JOBS__ADMIN_TRUSTED_ORIGINS", "https://A.example.com:443, http://b:8080/"
    )
    assert EkbatanSettings().jobs.admin_trusted_origins == [
        "https://a.example.com",
        "http://b:8080",
    ]
    for bad in ["https://a.example.com/jobs", "ftp://a", "a.example.com", "https://u:p@a"]:
        with pytest.raises(ConfigurationError, match="admin-trusted-origins") as caught:
            EkbatanSettings(jobs={"admin-trusted-origins": [bad]})
        assert "EKBATAN_JOBS__ADMIN_TRUSTED_ORIGINS" in str(caught.value)
        assert "p@" not in str(caught.value) or "https://u:p@a" not in str(caught.value)


# -- item 7: bad text in an admin request -----------------------------------------------------


async def test_bad_text_in_an_admin_request_gets_a_422_naming_the_field(
    engine: AsyncEngine, database_url: str
) -> None:
    job = RecordingJob("demo", Schedules.fixed_delay(HOUR))
    async with app_client(database_url, job) as (client, state):
        auth = ("a", TOKEN)
        json_type = {"content-type": "application/json"}
        cases: list[tuple[str, bytes, dict[str, str], list[Any]]] = [
            ("", b'{"reason": "\\ud800"}', json_type, ["body", "reason"]),  # lone surrogate
            ("", b'{"reason": "a\\u0000b"}', json_type, ["body", "reason"]),  # NUL
            ("", b'{"reason": "caf\xe9"}', json_type, ["body"]),  # Latin-1, not UTF-8
            ("", b"\xff\xfe{}", json_type, ["body"]),
            ("", b'{"reason": ', json_type, ["body"]),  # not JSON
            ("", b"[" * 5000, json_type, ["body"]),  # nested too deep
            ("", b'["why"]', json_type, ["body"]),  # not an object
            ("", b'{"reason": "x"}', {"content-type": "text/csv"}, ["body"]),
            ("?reason=a%00b", b"", {}, ["query", "reason"]),
        ]
        for query, content, headers, loc in cases:
            response = await client.post(
                f"/jobs/demo/pause{query}", auth=auth, content=content, headers=headers
            )
            assert response.status_code == 422, (content, response.text)
            (error,) = response.json()["detail"]
            assert error["loc"] == loc, (content, error)
            assert error["msg"] and error["type"]
        assert await paused(state) == {}
        # the database is fine, and so is the scheduler
        assert state.registry.status().condition == "ok"
        fine = await client.post(
            "/jobs/demo/pause", auth=auth, json={"reason": "caf\u00e9 \U0001f600"}
        )
        assert fine.status_code == 200 and fine.json()["reason"] == "caf\u00e9 \U0001f600"


async def test_the_schema_documents_the_pause_body_and_its_422(
    engine: AsyncEngine, database_url: str
) -> None:
    async with app_client(database_url) as (client, _):
        spec = (await client.get("/openapi.json")).json()
    pause = spec["paths"]["/jobs/{name}/pause"]["post"]
    assert "400" not in pause["responses"]
    assert pause["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"
    }
    body = pause["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["reason"]["anyOf"][0]["pattern"] == "^[^\\u0000]*$"


# -- item 5: rows holding JSON nested deep, or huge --------------------------------------------


async def test_rows_with_deep_or_huge_json_never_make_the_report_fail(
    engine: AsyncEngine, database_url: str
) -> None:
    deep = ("[" * 5000 + "]" * 5000).encode()  # json.loads: RecursionError
    medium = ("[" * 300 + "]" * 300).encode()  # decodes; pydantic's encoder stops at ~255
    huge = json.dumps({"blob": "x" * 200_000}).encode()
    await insert_row(engine, "with-data", task_instance="deep", task_data=deep)
    await insert_row(engine, "with-data", task_instance="medium", task_data=medium)
    await insert_row(engine, "with-data", task_instance="huge", task_data=huge)
    await insert_row(engine, "with-data", task_instance="fine", task_data=b'{"a": [1, {"b": 2}]}')
    router = create_jobs_router(include_task_data=True)
    async with app_client(database_url, DataJob(), router=router) as (client, _):
        for path in ("/jobs", "/jobs/with-data", "/jobs/-/ui"):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:500])
        data = {t["instance"]: t["task_data"] for t in (await client.get("/jobs")).json()["tasks"]}
        assert data["deep"] == f"<{len(deep)} bytes, JSON nested too deep to show>"
        assert data["medium"] == f"<{len(medium)} bytes, JSON nested deeper than 64 levels>"
        assert data["huge"] == f"<{len(huge)} bytes, over the 65536 shown>"
        assert data["fine"] == {"a": [1, {"b": 2}]}
        assert (await client.get("/jobs?limit=1")).status_code == 200  # the probe


# -- item 6: the names "." and ".." -------------------------------------------------------------


class DotJob(OneTimeJob):
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    async def execute(self, ctx: Any) -> None:
        pass


async def test_dot_names_are_refused_everywhere(engine: AsyncEngine, database_url: str) -> None:
    for name in (".", ".."):
        assert not is_valid_name(name)
        with pytest.raises(ConfigurationError, match=DOTS):
            job_registry().connection_provider(database_url).with_job(DotJob(name)).build()
    assert is_valid_name("...") and is_valid_name(". ") and is_valid_name(".a")
    async with app_client(database_url, DataJob()) as (client, state):
        for name in (".", ".."):
            with pytest.raises(ConfigurationError, match=DOTS):
                await state.client.schedule("with-data", name)
        with pytest.raises(ConfigurationError, match=DOTS):
            await state.client.schedule("..", "x")
        # %2e is "." once decoded: the route refuses it as a name (never another route)
        for path in ("/jobs/%2e", "/jobs/%2E%2E", "/jobs/%2e/history"):
            response = await client.get(path)
            assert response.status_code == 422, (path, response.text)
            assert response.json()["detail"][0]["loc"] == ["path", "name"]
        run = await client.post(
            "/jobs/with-data/run?instance=..", auth=("a", TOKEN), headers={"origin": SELF}
        )
        assert run.status_code == 422
        assert run.json()["detail"][0]["loc"] == ["query", "instance"]


# -- item 12: a login failure, read by anyone ---------------------------------------------------


def test_database_user_names_are_hidden_from_readers() -> None:
    from ekbatan_fastapi.client.read_model import shown

    for message in [
        "(1045, \"Access denied for user 'root'@'10.1.2.3' (using password: YES)\")",
        "(1044, \"Access denied for user 'app'@'%' to database 'jobs'\")",
        'FATAL:  password authentication failed for user "app"',
        'FATAL:  role "app" does not exist',
    ]:
        text = shown(message)
        assert "root" not in text and "'app'" not in text and '"app"' not in text, text
        assert "(name hidden)" in text
    assert shown("no user sessions left") == "no user sessions left"


@asynccontextmanager
async def unready_client(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, EkbatanState]]:
    """The app running on ``url`` without waiting for its database (it refuses the login)."""
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=settings_for(url), discover=False))
    app.include_router(create_jobs_router())
    async with running(app) as client:
        yield client, app.state.ekbatan


async def test_jobs_hides_the_mysql_user_of_a_refused_login(mysql_server_url: str) -> None:
    """The issue's observation: ``Access denied for user 'root'@...`` on ``/jobs``."""
    url = make_url(mysql_server_url).set(username="root", password="not-the-password")
    async with unready_client(url.render_as_string(hide_password=False)) as (client, state):
        await wait_until(lambda: state.registry.status().last_error is not None, what="an error")
        await wait_until(lambda: _problems(client), what="the scheduler's problem on /jobs")
        for path, status in (("/jobs", 503), ("/jobs/-/ui", 200)):
            response = await client.get(path)
            assert response.status_code == status, response.text
            # the login-refused condition's own words, which never name the user (a raw
            # driver message would be shown as "Access denied for user (name hidden)")
            assert "refused the login of the configured user" in response.text, response.text
            assert "'root'" not in response.text and "not-the-password" not in response.text
            assert "root@" not in response.text, response.text


async def _problems(client: httpx.AsyncClient) -> bool:
    body = (await client.get("/jobs")).json()
    return bool(body["problems"]) and body["scheduler"]["last_error"] is not None
