"""The dashboard's schedules page (``/jobs/-/ui/schedules/{name}``) and the search of
``GET /jobs/{name}/schedules`` over HTTP, on embedded PostgreSQL and on MySQL/MariaDB
(``EKBATAN_TEST_MYSQL_URL``); the browser test drives the page's forms in Chromium.

The search is a LIKE with ``/`` as its escape character: ``%``, ``_``, ``/`` and the
backslash match themselves, in every SQL mode of MySQL/MariaDB."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import ConfigurationError, ExecutionContext, PersistentScheduleJob, Schedules
from ekbatan_fastapi.store.migrate import create_schema
from ekbatan_fastapi.store.schedules import contains_pattern
from ekbatan_fastapi.web import create_jobs_router
from ekbatan_fastapi.web.dashboard_html import page_head
from ekbatan_fastapi.web.dashboard_schedules_html import SchedulesView, render_schedules

from .conftest import _fresh_postgres_database, fresh_mysql_database
from .helpers import RecordingJob
from .test_dashboard import actions
from .test_jobs_routes import insert_row, require_token, serving
from .test_mysql_sql_modes import MODES, in_mode

ADMIN = {"x-admin-token": "let-me-in"}
EVIL_ID = "<script>alert('id')</script>"
EVIL_DATA = {"note": "</code></td><script>alert('data')</script>", "n": 1}
HOSTILE_IDS = [
    "a%b",
    "a_b",
    "axb",
    "ab",
    "A/B",
    "back\\slash",
    "quote'x",
    'dq"x',
    "User-42",
    "user-7",
    EVIL_ID,
]


class Digest(PersistentScheduleJob):
    def name(self) -> str:
        return "digest"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


@pytest.fixture(params=["postgresql-embedded", "mysql"])
async def web_database_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh database with the schema on embedded PostgreSQL, and on MySQL/MariaDB."""
    if request.param == "mysql":
        async with fresh_mysql_database(request.getfixturevalue("mysql_server_url")) as url:
            engine = create_async_engine(url)
            try:
                await create_schema(engine)
            finally:
                await engine.dispose()
            yield url
        return
    server = request.getfixturevalue("postgres_server_url")
    async with _fresh_postgres_database(server, schema=True) as url:
        yield url


async def ids(client: httpx.AsyncClient, query: dict[str, Any]) -> list[str]:
    response = await client.get("/jobs/digest/schedules", params=query)
    assert response.status_code == 200, response.text
    return sorted(s["instance_id"] for s in response.json()["schedules"])


def test_the_pattern_escapes_every_wildcard_and_its_escape() -> None:
    assert contains_pattern("a%b_c/d\\e") == "%a/%b/_c//d\\e%"
    assert contains_pattern("") == "%%"


async def test_search_finds_ids_that_contain_it_literally(web_database_url: str) -> None:
    async with serving(web_database_url, Digest()) as (client, state):
        far = "DAILY|03:00"
        await state.client.create_schedules("digest", [(i, far, {"i": i}) for i in HOSTILE_IDS])
        await state.client.pause("digest", instance_id="user-7")
        listed = (await client.get("/jobs/digest/schedules")).json()["schedules"]
        assert [s["data"] for s in listed] == [None] * len(HOSTILE_IDS)  # no include_task_data
        assert await ids(client, {"search": "%"}) == ["a%b"]
        assert await ids(client, {"search": "_"}) == ["a_b"]
        assert await ids(client, {"search": "/"}) == [EVIL_ID, "A/B"]
        assert await ids(client, {"search": "\\"}) == ["back\\slash"]
        assert await ids(client, {"search": "'"}) == sorted(["quote'x", EVIL_ID])
        assert await ids(client, {"search": '"'}) == ['dq"x']
        assert await ids(client, {"search": "_b"}) == ["a_b"]  # not any character and b
        assert await ids(client, {"search": "%b"}) == ["a%b"]
        assert await ids(client, {"search": "USER"}) == ["User-42", "user-7"]  # any case
        assert await ids(client, {"search": "user", "state": "paused"}) == ["user-7"]
        assert await ids(client, {"search": "<script>"}) == [EVIL_ID]
        assert len(await ids(client, {"search": ""})) == len(HOSTILE_IDS)  # empty: all
        first = await ids(client, {"search": "a", "limit": 2})
        rest = await ids(client, {"search": "a", "limit": 2, "offset": 2})
        assert len(first) == 2 and not set(first) & set(rest)
        # bounded: an id is at most 100 characters, so is a search for a part of one
        long = await client.get("/jobs/digest/schedules", params={"search": "x" * 101})
        assert long.status_code == 422
        error = long.json()["detail"][0]
        assert error["loc"] == ["query", "search"] and "100 characters" in error["msg"]
        nul = await client.get("/jobs/digest/schedules", params={"search": "a\x00"})
        assert nul.status_code == 422
        with pytest.raises(ConfigurationError, match="at most 100 characters"):
            await state.client.list_schedules("digest", search="x" * 101)


SEARCH_MODES = {
    **MODES,
    # CHAR columns read padded: the table has none, and a search must not start to need one
    "pad-char-and-both": "PAD_CHAR_TO_FULL_LENGTH,NO_BACKSLASH_ESCAPES,ANSI_QUOTES",
}


@pytest.fixture(params=list(SEARCH_MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return SEARCH_MODES[request.param]


async def test_search_means_the_same_in_each_mysql_sql_mode(
    mysql_server_url: str, mode: str
) -> None:
    """``NO_BACKSLASH_ESCAPES`` changes what a backslash in a literal means, ``ANSI_QUOTES``
    what a double quote means: the search finds the same ids in each."""
    async with fresh_mysql_database(mysql_server_url) as plain:
        url = in_mode(plain, mode)
        engine = create_async_engine(url)
        try:
            await create_schema(engine)
        finally:
            await engine.dispose()
        async with serving(url, Digest()) as (client, state):
            await state.client.create_schedules(
                "digest", [(i, "DAILY|03:00", None) for i in HOSTILE_IDS]
            )
            assert await ids(client, {"search": "\\"}) == ["back\\slash"]
            assert await ids(client, {"search": "k\\s"}) == ["back\\slash"]
            assert await ids(client, {"search": "%"}) == ["a%b"]
            assert await ids(client, {"search": "_"}) == ["a_b"]
            assert await ids(client, {"search": "'"}) == sorted(["quote'x", EVIL_ID])
            assert await ids(client, {"search": '"'}) == ['dq"x']
            assert await ids(client, {"search": "/"}) == [EVIL_ID, "A/B"]


def _shows(html: str) -> list[str]:
    return re.findall(r'<tr class="schedule" data-id="([^"]*)"', html)


async def test_the_page_lists_pages_and_escapes_schedules(web_database_url: str) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    other = RecordingJob("plain-job", Schedules.cron("0 3 * * *"))
    async with serving(web_database_url, Digest(), other, router=router) as (client, state):
        await state.client.create_schedules(
            "digest",
            [(f"user-{i:02}", "CRON|0 8 * * 1-5|Europe/Berlin", {"i": i}) for i in range(12)],
        )
        long = {"text": "y" * 500}
        await state.client.create_schedule("digest", EVIL_ID, "DAILY|07:30", EVIL_DATA)
        await state.client.create_schedule("digest", "long-data", "DAILY|07:31", long)
        ui = "/jobs/-/ui/schedules/digest"

        response = await client.get(ui, params={"limit": 5})
        assert response.status_code == 200
        html = response.text
        assert len(_shows(html)) == 5
        assert 'rel="next" href="?limit=5&amp;offset=5"' in html and 'rel="prev"' not in html
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "form-action 'self'" in csp
        nonce = re.search(r"script-src 'nonce-([^']+)'", csp)
        assert nonce is not None and f'<script nonce="{nonce.group(1)}">' in html
        assert response.headers["cache-control"] == "no-store"
        # Not signed in: no forms, no buttons; a sign-in link.
        assert 'id="schedule-form"' not in html and "data-edit" not in html
        assert "sign_in=1" in html
        # ... and the data (it lives in task_data) is hidden, as /jobs hides task_data.
        assert '{"i":0}' not in html and '<span class="meta">hidden</span>' in html

        last = (await client.get(ui, params={"limit": 5, "offset": 10})).text
        assert len(_shows(last)) == 4 and 'rel="prev" href="?limit=5&amp;offset=5"' in last
        assert 'rel="next"' not in last

        # Hostile ids and data are text: escaped in cells and attributes, never markup.
        found = (await client.get(ui, params={"search": "<scr"}, headers=ADMIN)).text
        assert EVIL_ID not in found and "alert('data')" not in found
        assert found.count("<script") == 1
        escaped_id = "&lt;script&gt;alert(&#x27;id&#x27;)&lt;/script&gt;"
        assert _shows(found) == [escaped_id]
        assert 'value="&lt;scr"' in found  # the search box keeps the query, escaped
        assert "&lt;/code&gt;&lt;/td&gt;&lt;script&gt;" in found
        # Signed in: the forms, and each row's values for the edit form.
        assert 'id="schedule-form"' in found
        assert 'data-schedule="DAILY|07:30"' in found
        assert "data-json=" in found and "data-edit" in found and "data-delete" in found
        assert actions(found) == set()  # the main page's task buttons are not here

        # Data is cut for the table (the edit form gets it whole).
        cut = (await client.get(ui, params={"search": "long-data"}, headers=ADMIN)).text
        assert "y" * 200 not in cut.split("data-json")[0].split('class="data"')[-1]
        assert "\u2026" in cut and 'data-json="{&quot;text&quot;:&quot;' + "y" * 500 in cut

        # The state filter, the JSON link, the way back.
        paused = (await client.get(ui, params={"state": "paused"})).text
        assert "No schedule matches." in paused and '<option value="paused" selected>' in paused
        assert 'href="../../../digest/schedules?limit=50&amp;offset=0&amp;state=paused"' in paused
        assert 'href="../../ui"' in paused

        # The main dashboard links to the page.
        main = (await client.get("/jobs/-/ui")).text
        assert 'href="ui/schedules/digest">14 schedules</a>' in main

        # Not a PersistentScheduleJob: 404 naming the ones there are; bad parameters: 422.
        missing = await client.get("/jobs/-/ui/schedules/plain-job")
        assert missing.status_code == 404 and "digest" in missing.json()["detail"]
        assert (await client.get(ui, params={"search": "x" * 101})).status_code == 422
        assert (await client.get(ui, params={"state": "bogus"})).status_code == 422
        any_state = await client.get(ui, params={"state": "", "search": "", "limit": 50})
        assert any_state.status_code == 200 and len(_shows(any_state.text)) == 14

        # Sign in: the dependency's refusal, or back to the same page.
        assert (await client.get(ui, params={"sign_in": 1, "limit": 5})).status_code == 403
        back = await client.get(ui, params={"sign_in": 1, "limit": 5}, headers=ADMIN)
        assert back.status_code == 303 and back.headers["location"] == "digest?limit=5"


async def test_a_read_only_router_shows_no_forms(database_url: str, engine: AsyncEngine) -> None:
    router = create_jobs_router(include_task_data=True)
    async with serving(database_url, Digest(), router=router) as (client, state):
        await state.client.create_schedule("digest", "u1", "DAILY|03:00", {"u": 1})
        html = (await client.get("/jobs/-/ui/schedules/digest")).text
        assert _shows(html) == ["u1"]
        assert 'id="schedule-form"' not in html and "sign_in=1" not in html
        assert '<code class="data">{&quot;u&quot;:1}</code>' in html  # include_task_data
        listed = (await client.get("/jobs/digest/schedules")).json()["schedules"]
        assert listed[0]["data"] == {"u": 1}


async def test_put_with_replace_false_only_creates(web_database_url: str) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    plain = RecordingJob("plain-job", Schedules.cron("0 3 * * *"))
    async with serving(web_database_url, Digest(), plain, router=router) as (client, state):
        url = "/jobs/digest/schedules/u1"
        create = {"replace": "false"}
        made = await client.put(url, json={"schedule": "DAILY|03:00"}, params=create, headers=ADMIN)
        assert made.status_code == 200 and made.json()["created"] is True
        again = await client.put(
            url, json={"schedule": "DAILY|04:00"}, params=create, headers=ADMIN
        )
        assert again.status_code == 409 and "exists already" in again.json()["detail"]
        info = await state.client.get_schedule("digest", "u1")
        assert info is not None and info.schedule == "DAILY|03:00"  # left alone
        replaced = await client.put(url, json={"schedule": "DAILY|04:00"}, headers=ADMIN)
        assert replaced.status_code == 200 and replaced.json()["created"] is False
        # the dashboard's error for a bad cron names the field
        cron = await client.put(
            "/jobs/digest/schedules/u2",
            json={"schedule": "CRON|61 * * * *"},
            params=create,
            headers=ADMIN,
        )
        assert cron.status_code == 422 and cron.json()["detail"][0]["loc"] == ["body", "schedule"]
        # the row of a job that is no PersistentScheduleJob: 404, whether or not it exists
        await state.registry.wait_until_ready(10)
        other = await client.put(
            "/jobs/plain-job/schedules/recurring",
            json={"schedule": "DAILY|04:00"},
            params=create,
            headers=ADMIN,
        )
        assert other.status_code == 404 and "digest" in other.json()["detail"]


def test_a_failed_read_and_a_hostile_job_name_render_as_text() -> None:
    view = SchedulesView(job="<b>job</b>", problems=["database unreachable: <refused>"])
    html = render_schedules(view, nonce="n0nce")
    assert "<b>job</b>" not in html and "&lt;b&gt;job&lt;/b&gt;" in html
    assert "database unreachable: &lt;refused&gt;" in html and "No schedules here." in html
    assert 'href="../../../%3Cb%3Ejob%3C%2Fb%3E/schedules?limit=50&amp;offset=0"' in html
    assert html.count("<script") == 1 and '<script nonce="n0nce">' in html


async def test_an_unreadable_schedule_names_its_data_kind_never_its_content(
    database_url: str, engine: AsyncEngine
) -> None:
    """A schedule row whose task_data is JSON but no object (written by other means) is shown
    as unreadable; its error names what the data is, not what it holds: the list and the
    page show the error to readers that the data itself is hidden from (review3)."""
    secret = "alice@example.com"
    await insert_row(engine, "digest", task_instance="u1", task_data=json.dumps([secret]).encode())
    await insert_row(engine, "digest", task_instance="u2", task_data=json.dumps(secret).encode())
    async with serving(database_url, Digest()) as (client, _state):
        listed = await client.get("/jobs/digest/schedules")
        page = await client.get("/jobs/-/ui/schedules/digest")
    assert listed.status_code == 200 and page.status_code == 200
    for body in (listed.text, page.text):
        assert secret not in body
    errors = {s["instance_id"]: s["error"] for s in listed.json()["schedules"]}
    assert "a JSON object is expected, got an array (1 item)" in errors["u1"]
    assert f"a JSON object is expected, got a string ({len(secret)} characters)" in errors["u2"]
    assert "client.update_schedule" in errors["u1"]  # and the fix


def test_both_dashboard_pages_start_with_the_same_head() -> None:
    """One head for the dashboard's pages (``page_head``): the same meta tags, the style under
    the nonce, the title escaped."""
    html = render_schedules(SchedulesView(job="<j>"), nonce="n0nce")
    assert html.startswith(page_head("Schedules of <j>", "n0nce"))
    assert "<title>Schedules of &lt;j&gt;</title>" in html
    assert '<style nonce="n0nce">' in html
    assert '<meta name="referrer" content="no-referrer">' in html
