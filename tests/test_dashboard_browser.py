"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

A test app is served by uvicorn on 127.0.0.1 (a free port) against the test database. The
browser loads ``/jobs/-/ui``, finds the failing task with its error message, opens its history,
pauses a task with the button and sees it paused after a reload; at phone width the page does
not scroll sideways. No request may leave 127.0.0.1 and the console must stay free of errors
(a Content-Security-Policy violation would show there).

Skipped when Chromium or Playwright is missing (``.ci/run`` installs Chromium). Never run
``playwright install``: the system Chromium is used through ``executable_path``.
``EKBATAN_TEST_SCREENSHOTS=docs`` also writes ``dashboard.png`` and ``dashboard-phone.png``
there (the README's pictures).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.web import EkbatanState, create_ekbatan_lifespan, create_jobs_router

from .fastapi_helpers import fast_settings
from .helpers import RecordingJob, RegistryFactory, wait_until

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM = os.environ.get("EKBATAN_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = os.environ.get("EKBATAN_TEST_SCREENSHOTS")

pytestmark = [
    pytest.mark.skipif(
        not (os.access(CHROMIUM, os.X_OK) or shutil.which(CHROMIUM)),
        reason=f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set "
        "EKBATAN_TEST_CHROMIUM to a Chromium executable)",
    ),
]
playwright_api = pytest.importorskip(
    "playwright.async_api", reason="playwright is not installed: pip install -e '.[dev]'"
)

HOUR = timedelta(hours=1)
WAIT_MS = 20_000
"""Generous: a loaded CI machine runs the database, the app and Chromium at once."""


def cookie_admin(request: Request) -> str:
    """The test app's authorization: an ``admin`` session cookie names the admin."""
    user = request.cookies.get("admin")
    if not user:
        raise HTTPException(status_code=403, detail="sign in first")
    return user


def dashboard_app(database_url: str, *jobs: RecordingJob) -> FastAPI:
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


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


class Watch:
    """Every request a page makes, and its console errors."""

    def __init__(self, page: Page) -> None:
        self.urls: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)


async def test_dashboard_in_chromium(
    engine: AsyncEngine, database_url: str, registries: RegistryFactory, tmp_path: Path
) -> None:
    playwright_api.expect.set_options(timeout=WAIT_MS)
    release = asyncio.Event()
    bad = RecordingJob("nightly-export", Schedules.fixed_delay(HOUR), fail=True)
    ok = RecordingJob("hourly-cleanup", Schedules.cron("0 * * * *"))
    busy = RecordingJob("sync-invoices", Schedules.fixed_delay(HOUR), block=release)
    report = RecordingJob("daily-report", Schedules.daily(time(2, 0)))
    app = dashboard_app(database_url, bad, ok, busy, report)
    try:
        async with served(app) as base, chromium() as browser:
            state: EkbatanState = app.state.ekbatan
            # A second scheduler instance of the cluster (same process: it needs its own name).
            await registries.start(customize=lambda b: b.scheduler_name("web-2"))
            await wait_until(lambda: bool(bad.slots and busy.slots), 20, what="the first runs")
            await state.client.run_now("hourly-cleanup")
            await wait_until(lambda: _failure_recorded(state), 20, what="the failure's record")
            await wait_until(lambda: _instances(state, 2), 20, what="both instances")

            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            await context.add_cookies([{"name": "admin", "value": "ops-alice", "url": base}])
            page = await context.new_page()
            page.set_default_timeout(WAIT_MS)
            watch = Watch(page)
            await page.goto(f"{base}/jobs/-/ui?refresh=0")  # no reload between the clicks

            failing = page.locator('tr.task[data-name="nightly-export"]')
            await playwright_api.expect(failing.locator(".badge")).to_have_text("failing")
            await playwright_api.expect(failing.locator(".error")).to_contain_text(
                "RuntimeError: nightly-export failed on purpose"
            )
            running = page.locator('tr.task[data-name="sync-invoices"] .badge')
            await playwright_api.expect(running).to_have_text("running")
            await playwright_api.expect(page.locator("table.instances tbody tr")).to_have_count(2)

            # The history, on click.
            await failing.locator("button.history-toggle").click()
            history = page.locator("tr.history:not([hidden]) tr.record")
            await playwright_api.expect(history.first).to_contain_text("failed")
            await playwright_api.expect(history.first).to_contain_text("failed on purpose")

            # Pause with the button: a prompt asks for the reason.
            page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept("db upgrade")))
            report_row = page.locator('tr.task[data-name="daily-report"]')
            await report_row.locator('button[data-action="pause"]').click()
            await wait_until(lambda: _paused(state, "daily-report"), 20, what="the pause")
            await page.reload()
            report_row = page.locator('tr.task[data-name="daily-report"]')
            await playwright_api.expect(report_row.locator(".badge")).to_have_text("paused")
            await playwright_api.expect(report_row).to_contain_text("by ops-alice")
            await playwright_api.expect(report_row).to_contain_text("db upgrade")
            await playwright_api.expect(
                report_row.locator('button[data-action="resume"]')
            ).to_be_visible()

            await failing.locator("button.history-toggle").click()  # for the picture
            await page.wait_for_timeout(300)
            await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

            # Phone width: cards, no sideways scrolling.
            phone = await browser.new_context(
                viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
            )
            small = await phone.new_page()
            small.set_default_timeout(WAIT_MS)
            small_watch = Watch(small)
            await small.goto(f"{base}/jobs/-/ui?refresh=1")
            async with small.expect_navigation(timeout=WAIT_MS):
                pass  # it reloads itself
            await playwright_api.expect(
                small.locator('tr.task[data-name="nightly-export"] .error')
            ).to_be_visible()
            overflow = await small.evaluate(
                "document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"the page scrolls sideways by {overflow}px at phone width"
            assert await small.locator("button[data-action]").count() == 0  # not signed in
            await small.screenshot(path=str(tmp_path / "dashboard-phone.png"), full_page=True)

            for seen in (watch, small_watch):
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


async def _paused(state: EkbatanState, name: str) -> bool:
    return name in await state.client.paused()
