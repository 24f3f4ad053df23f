"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven over the DevTools
protocol by ``tests/cdp.py``).

A test app is served by uvicorn on 127.0.0.1 (a free port) against the test database. The
browser loads ``/jobs/-/ui``, finds the failing task with its error message, opens its history,
pauses a task with the button and sees it paused after a reload; at phone width the page does
not scroll sideways. No request may leave 127.0.0.1 and the console must stay free of errors
(a Content-Security-Policy violation would show there).

Skipped when Chromium is missing (``.ci/run`` installs it); no browser is downloaded.
``EKBATAN_TEST_SCREENSHOTS=docs`` also writes ``dashboard.png``, ``dashboard-phone.png`` and
``dashboard-schedules.png`` there (the docs' pictures).

The schedules page of a ``PersistentScheduleJob`` (``test_schedules_page_in_chromium``): sign in,
create a schedule with the form, find it listed and with the search box, edit its schedule and
its data, delete it, checking the database after each step; a bad cron, data that is not JSON
and an existing id are refused with a message that says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import time, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, Job, PersistentScheduleJob, Schedules
from ekbatan_fastapi.web import EkbatanState, create_ekbatan_lifespan, create_jobs_router

from .cdp import Browser, Page
from .fastapi_helpers import fast_settings
from .helpers import RecordingJob, RegistryFactory, wait_until
from .test_jobs_routes import insert_row

CHROMIUM = os.environ.get("EKBATAN_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
]
SCREENSHOTS = os.environ.get("EKBATAN_TEST_SCREENSHOTS")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (os.access(CHROMIUM, os.X_OK) or shutil.which(CHROMIUM)),
        reason=f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set "
        "EKBATAN_TEST_CHROMIUM to a Chromium executable)",
    ),
]

HOUR = timedelta(hours=1)
WAIT = 20.0
"""Generous: a loaded CI machine runs the database, the app and Chromium at once."""


def cookie_admin(request: Request) -> str:
    """The test app's authorization: an ``admin`` session cookie names the admin."""
    user = request.cookies.get("admin")
    if not user:
        raise HTTPException(status_code=403, detail="sign in first")
    return user


def dashboard_app(database_url: str, *jobs: Job) -> FastAPI:
    lifespan = create_ekbatan_lifespan(
        settings=fast_settings(database_url),
        jobs=jobs,
        discover=False,
        customize=lambda b: b.scheduler_name("web-1"),
    )
    app = FastAPI(lifespan=lifespan)
    app.include_router(create_jobs_router(admin_dependency=cookie_admin, dashboard_refresh=2))
    return app


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) in this event loop."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done(), what="uvicorn to start")
        assert not task.done(), "uvicorn stopped at startup"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
        sock.close()


def _element(selector: str, test: str) -> str:
    """A JavaScript expression: ``test`` on the first element matching ``selector`` (``e``)."""
    return f"(e => !!e && ({test}))(document.querySelector({json.dumps(selector)}))"


_TEXT = "e.textContent.replace(/\\s+/g, ' ').trim()"
"""An element's text with its whitespace collapsed."""


async def expect_text(page: Page, selector: str, text: str) -> None:
    await page.wait_for(_element(selector, f"{_TEXT} === {json.dumps(text)}"), selector)


async def expect_contains(page: Page, selector: str, text: str) -> None:
    test = f"{_TEXT}.includes({json.dumps(text)})"
    await page.wait_for(_element(selector, test), f"{text!r} in {selector}")


async def expect_count(page: Page, selector: str, count: int) -> None:
    expression = f"document.querySelectorAll({json.dumps(selector)}).length === {count}"
    await page.wait_for(expression, f"{count} x {selector}")


async def expect_visible(page: Page, selector: str) -> None:
    test = "e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden'"
    await page.wait_for(_element(selector, test), f"{selector} visible")


async def test_dashboard_in_chromium(
    engine: AsyncEngine, database_url: str, registries: RegistryFactory, tmp_path: Path
) -> None:
    release = asyncio.Event()
    bad = RecordingJob("nightly-export", Schedules.fixed_delay(HOUR), fail=True)
    ok = RecordingJob("hourly-cleanup", Schedules.cron("0 * * * *"))
    busy = RecordingJob("sync-invoices", Schedules.fixed_delay(HOUR), block=release)
    report = RecordingJob("daily-report", Schedules.daily(time(2, 0)))
    app = dashboard_app(database_url, bad, ok, busy, report)
    profile = tmp_path / "chromium"
    try:
        async with served(app) as base, Browser.launch(CHROMIUM, CHROMIUM_ARGS, profile) as browser:
            state: EkbatanState = app.state.ekbatan
            # A second scheduler instance of the cluster (same process: it needs its own name).
            await registries.start(customize=lambda b: b.scheduler_name("web-2"))
            await wait_until(lambda: bool(bad.slots and busy.slots), 20, what="the first runs")
            await state.client.run_now("hourly-cleanup")
            await wait_until(lambda: _failure_recorded(state), 20, what="the failure's record")
            await wait_until(lambda: _instances(state, 2), 20, what="both instances")

            page = await browser.new_page(1280, 900)
            page.timeout = WAIT
            await page.set_cookie("admin", "ops-alice", base)
            await page.goto(f"{base}/jobs/-/ui?refresh=0")  # no reload between the clicks

            failing = 'tr.task[data-name="nightly-export"]'
            await expect_text(page, f"{failing} .badge", "failing")
            await expect_contains(
                page, f"{failing} .error", "RuntimeError: nightly-export failed on purpose"
            )
            await expect_text(page, 'tr.task[data-name="sync-invoices"] .badge', "running")
            await expect_count(page, "table.instances tbody tr", 2)

            # The history, on click.
            await page.click(f"{failing} button.history-toggle")
            history = "tr.history:not([hidden]) tr.record"
            await expect_contains(page, history, "failed")
            await expect_contains(page, history, "failed on purpose")

            # Pause with the button: a prompt asks for the reason.
            page.answer_prompt("db upgrade")
            report_row = 'tr.task[data-name="daily-report"]'
            await page.click(f'{report_row} button[data-action="pause"]')
            await wait_until(lambda: _paused(state, "daily-report"), 20, what="the pause")
            await page.reload()
            await expect_text(page, f"{report_row} .badge", "paused")
            await expect_contains(page, report_row, "by ops-alice")
            await expect_contains(page, report_row, "db upgrade")
            await expect_visible(page, f'{report_row} button[data-action="resume"]')

            # Stop a running execution with the button: a prompt asks for the reason.
            page.answer_prompt("stuck on a lock")
            busy_row = 'tr.task[data-name="sync-invoices"]'
            await page.click(f'{busy_row} button[data-action="cancel"]')
            await wait_until(lambda: _stopped(state, "sync-invoices"), 20, what="the stop")
            await page.reload()
            await page.click(f"{busy_row} button.history-toggle")
            await expect_contains(page, history, "cancelled by ops-alice: stuck on a lock")
            await page.click(f"{busy_row} button.history-toggle")

            # A row named ".." (written by other means: the library refuses the name): its
            # button says why it cannot act, and posts nothing (encodeURIComponent keeps dots,
            # so "../.." + "/run" would have gone to the application's root).
            await insert_row(engine, "..", task_instance="recurring")
            await page.reload()
            await page.click('tr.task[data-name=".."] button[data-action="run"]')
            await expect_contains(page, "#flash", "cannot be part of a URL")
            assert not [u for u in page.urls if not u.startswith(base + "/jobs/")], page.urls

            await page.click(f"{failing} button.history-toggle")  # for the picture
            await expect_visible(page, history)
            await page.screenshot(tmp_path / "dashboard.png")

            # Phone width: cards, no sideways scrolling.
            small = await browser.new_page(390, 844, scale=2, mobile=True)
            small.timeout = WAIT
            await small.goto(f"{base}/jobs/-/ui?refresh=1")
            async with small.next_load():
                pass  # it reloads itself
            await expect_visible(small, 'tr.task[data-name="nightly-export"] .error')
            overflow = await small.evaluate(
                "document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"the page scrolls sideways by {overflow}px at phone width"
            assert (
                await small.evaluate("document.querySelectorAll('button[data-action]').length") == 0
            )  # not signed in
            await small.screenshot(tmp_path / "dashboard-phone.png")

            for seen in (page, small):
                assert seen.errors == []
                assert all(u.startswith(base + "/") for u in seen.urls), seen.urls
            if SCREENSHOTS:
                for name in ("dashboard.png", "dashboard-phone.png"):
                    shutil.copy(tmp_path / name, Path(SCREENSHOTS) / name)
            release.set()
    finally:
        release.set()


async def _failure_recorded(state: EkbatanState) -> bool:
    return any(r.outcome == "failed" for r in await state.client.history("nightly-export"))


async def _instances(state: EkbatanState, n: int) -> bool:
    return len(await state.client.instances()) == n


async def _stopped(state: EkbatanState, name: str) -> bool:
    return any(r.outcome == "cancelled" for r in await state.client.history(name))


async def _paused(state: EkbatanState, name: str) -> bool:
    return name in await state.client.paused()


class Digest(PersistentScheduleJob):
    def name(self) -> str:
        return "digest"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


async def fill(page: Page, name: str, value: str) -> None:
    """Type ``value`` into the schedule form's field ``name``."""
    field = f"document.querySelector('#schedule-form [name={name}]')"
    await page.evaluate(f"{field}.value = {json.dumps(value)}")


async def submitted(page: Page, selector: str) -> None:
    """Click ``selector`` and wait for the page it leads to (a form or a link)."""
    async with page.next_load():
        await page.click(selector)


async def test_schedules_page_in_chromium(
    engine: AsyncEngine, database_url: str, tmp_path: Path
) -> None:
    """Sign in, create a schedule with the form, find it listed and by the search box, edit
    its schedule and its data, delete it; the database after each step. A bad cron and a
    duplicate id are refused with the route's message naming why, and write nothing."""
    app = dashboard_app(database_url, Digest())
    try_id = "ops <i>'x\"&amp;"  # markup in an id is text
    async with (
        served(app) as base,
        Browser.launch(CHROMIUM, CHROMIUM_ARGS, tmp_path / "chromium") as browser,
    ):
        state: EkbatanState = app.state.ekbatan
        client = state.client
        await client.create_schedule("digest", "user-7", "DAILY|09:00", {"user_id": 7})
        page = await browser.new_page(1280, 900)
        page.timeout = WAIT
        await page.goto(f"{base}/jobs/-/ui?refresh=0")
        await submitted(page, "a.schedules-link")  # from the main page's Jobs section
        assert page.urls[-1] == f"{base}/jobs/-/ui/schedules/digest", page.urls[-1]
        await expect_count(page, "tr.schedule", 1)
        await expect_count(page, "#schedule-form", 0)  # not signed in: no forms
        await expect_contains(page, "header", "sign in to create, edit and delete")

        # Sign in (the test app's dependency reads an "admin" cookie).
        await page.set_cookie("admin", "ops-alice", base)
        await page.reload()
        await expect_visible(page, "#schedule-form")

        # Create.
        await fill(page, "instance_id", "user-42")
        await fill(page, "schedule", "DAILY|07:30|Europe/Berlin")
        await fill(page, "data", '{"user_id": 42}')
        async with page.next_load():  # it reloads itself after the answer
            await page.click('#schedule-form button[type="submit"]')
        made = await client.get_schedule("digest", "user-42")
        assert made is not None and made.schedule == "DAILY|07:30|Europe/Berlin"
        assert made.data == {"user_id": 42} and made.state == "scheduled"
        await expect_count(page, "tr.schedule", 2)
        row = 'tr.schedule[data-id="user-42"]'
        await expect_contains(page, row, "DAILY|07:30|Europe/Berlin")
        await expect_contains(page, row, '{"user_id":42}')

        # A bad cron: the route's 422 names the field; nothing is written.
        await fill(page, "instance_id", "user-43")
        await fill(page, "schedule", "CRON|61 * * * *")
        await page.click('#schedule-form button[type="submit"]')
        await expect_contains(page, "#flash.bad", "user-43: schedule:")
        assert await client.get_schedule("digest", "user-43") is None
        # Data that is not JSON: said before anything is sent.
        await fill(page, "schedule", "DAILY|08:00")
        await fill(page, "data", "{user_id: 43")
        await page.click('#schedule-form button[type="submit"]')
        await expect_contains(page, "#flash.bad", "data: not JSON")
        assert await client.get_schedule("digest", "user-43") is None
        # An id that exists: Create does not replace it (409).
        await fill(page, "instance_id", "user-7")
        await fill(page, "data", "")
        await page.click('#schedule-form button[type="submit"]')
        await expect_contains(page, "#flash.bad", "user-7: the schedule digest/user-7 exists")
        kept = await client.get_schedule("digest", "user-7")
        assert kept is not None and kept.schedule == "DAILY|09:00"
        # Markup in an id is text, in the table and in the messages.
        await fill(page, "instance_id", try_id)
        await fill(page, "schedule", "DAILY|06:00")
        async with page.next_load():
            await page.click('#schedule-form button[type="submit"]')
        assert await client.get_schedule("digest", try_id) is not None
        await expect_count(page, "tr.schedule i", 0)
        await expect_text(page, f"tr.schedule[data-id={json.dumps(try_id)}] .sid", try_id)
        await page.click('tr.schedule[data-id="user-7"] button[data-edit]')  # for the picture
        await expect_text(page, "#editor-title", "Edit user-7")
        await page.screenshot(tmp_path / "dashboard-schedules.png")
        await page.click("#cancel-edit")

        # Search (a GET form): by a part of the id, in any case.
        await page.evaluate("document.querySelector('form.search [name=search]').value = 'USER-4'")
        await submitted(page, 'form.search button[type="submit"]')
        assert "search=USER-4" in page.urls[-1], page.urls[-1]
        await expect_count(page, "tr.schedule", 1)
        await expect_count(page, row, 1)

        # Edit the schedule, then the data: each from the next slot.
        await page.click(f"{row} button[data-edit]")
        await expect_text(page, "#editor-title", "Edit user-42")
        await fill(page, "schedule", "CRON|0 8 * * 1-5|Europe/Berlin")
        async with page.next_load():
            await page.click('#schedule-form button[type="submit"]')
        edited = await client.get_schedule("digest", "user-42")
        assert edited is not None and edited.schedule == "CRON|0 8 * * 1-5|Europe/Berlin"
        assert edited.data == {"user_id": 42}  # unchanged: not sent
        await expect_contains(page, row, "CRON|0 8 * * 1-5|Europe/Berlin")
        await page.click(f"{row} button[data-edit]")
        await fill(page, "data", '{"user_id": 42, "lang": "de"}')
        async with page.next_load():
            await page.click('#schedule-form button[type="submit"]')
        edited = await client.get_schedule("digest", "user-42")
        assert edited is not None and edited.data == {"user_id": 42, "lang": "de"}
        assert edited.schedule == "CRON|0 8 * * 1-5|Europe/Berlin"

        # Delete (a confirm() asks first).
        page.answer_prompt("")
        async with page.next_load():
            await page.click(f"{row} button[data-delete]")
        assert await client.get_schedule("digest", "user-42") is None
        await expect_count(page, "tr.schedule", 0)
        await expect_contains(page, "main", "No schedule matches.")
        remaining = sorted(s.instance_id for s in await client.list_schedules("digest"))
        assert remaining == sorted([try_id, "user-7"])

        # Only the two refusals asked for above (Chromium logs a 4xx answer as an error);
        # nothing else, no Content-Security-Policy violation.
        refused = [f"status of {code} " for code in (422, 409)]
        assert len(page.errors) == 2, page.errors
        assert all(r in e for r, e in zip(refused, page.errors, strict=True)), page.errors

        # Phone width, signed in: cards and the form, no sideways scrolling.
        small = await browser.new_page(390, 844, scale=2, mobile=True)
        small.timeout = WAIT
        await small.set_cookie("admin", "ops-alice", base)
        await small.goto(f"{base}/jobs/-/ui/schedules/digest")
        await expect_visible(small, "#schedule-form")
        await expect_count(small, "tr.schedule", 2)
        overflow = await small.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow}px at phone width"
        assert small.errors == []
        assert all(u.startswith(base + "/jobs/") for u in page.urls + small.urls), page.urls
        if SCREENSHOTS:
            shutil.copy(tmp_path / "dashboard-schedules.png", Path(SCREENSHOTS))
