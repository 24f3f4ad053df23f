"""A small Chrome DevTools Protocol client for the dashboard's browser test: it starts the
system Chromium (Debian's ``chromium``) headless and drives it over its DevTools websocket
with the ``websockets`` package (2 MB), instead of Playwright (165 MB with its own driver).

Only what the test uses: pages in their own browser contexts (cookies, viewport, phone
emulation), navigation, JavaScript evaluation, waiting for a condition in the page, clicks,
prompt dialogs, the page's requests and console errors, screenshots. Commands and their events
are Chromium's own (https://chromedevtools.github.io/devtools-protocol/, stable domains only).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO

import websockets

Listener = Callable[[dict[str, Any]], None]


class CDPError(Exception):
    """Chromium answered a command with an error."""


class Browser:
    """One headless Chromium process and its DevTools connection."""

    def __init__(self, connection: Any, process: asyncio.subprocess.Process) -> None:
        self._connection = connection
        self._process = process
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: dict[tuple[str | None, str], list[Listener]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(
        cls,
        executable: str,
        args: list[str],
        profile: Path,
        timeout: float = 30.0,
        attempts: int = 2,
    ) -> AsyncIterator[Browser]:
        """Start Chromium with a fresh profile in ``profile``; its output goes to
        ``profile/chromium.log``. The DevTools port is the one Chromium chose (port 0).

        A start that writes no DevTools port within ``timeout`` is killed and tried again on an
        empty profile, ``attempts`` times in all: once in a CI run, on a loaded machine, a
        Chromium started and never wrote it. The error names each try and ends its log."""
        failures: list[str] = []
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                shutil.rmtree(profile, ignore_errors=True)
            try:
                process, log, url = await _start(executable, args, profile, timeout)
            except _NoPort as error:
                failures.append(f"try {attempt}: {error}")
                continue
            try:
                connection = await websockets.connect(url, max_size=None, ping_interval=None)
                browser = cls(connection, process)
                try:
                    yield browser
                finally:
                    await browser._close()
            finally:
                await _end(process, log)
            return
        raise AssertionError("\n".join(failures))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its result."""
        message: dict[str, Any] = {"id": next(self._ids), "method": method}
        message["params"] = params or {}
        if session is not None:
            message["sessionId"] = session
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message["id"]] = answer
        await self._connection.send(json.dumps(message))
        return await asyncio.wait_for(answer, 30)

    def on(self, session: str | None, event: str, listener: Listener) -> None:
        self._listeners.setdefault((session, event), []).append(listener)

    def off(self, session: str | None, event: str, listener: Listener) -> None:
        self._listeners.get((session, event), []).remove(listener)

    async def new_page(
        self, width: int, height: int, scale: float = 1, mobile: bool = False
    ) -> Page:
        """A tab in a browser context of its own (its own cookies), at that viewport."""
        context = (await self.send("Target.createBrowserContext"))["browserContextId"]
        target = await self.send(
            "Target.createTarget", {"url": "about:blank", "browserContextId": context}
        )
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "Network", "Log"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": scale, "mobile": mobile},
        )
        if mobile:
            await page.send("Emulation.setTouchEmulationEnabled", {"enabled": True})
        return page

    async def _read(self) -> None:
        async for raw in self._connection:
            message = json.loads(raw)
            if "id" in message:
                answer = self._pending.pop(message["id"], None)
                if answer is None or answer.done():
                    continue
                if "error" in message:
                    answer.set_exception(CDPError(f"{message['error']}"))
                else:
                    answer.set_result(message.get("result", {}))
                continue
            key = (message.get("sessionId"), message.get("method", ""))
            for listener in list(self._listeners.get(key, ())):
                listener(message.get("params", {}))

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send("Browser.close"), 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._process.wait(), 10)
        await self._connection.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


def _log_file(profile: Path) -> BinaryIO:
    profile.mkdir(parents=True, exist_ok=True)
    return (profile / "chromium.log").open("wb")


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


async def _start(
    executable: str, args: list[str], profile: Path, timeout: float
) -> tuple[asyncio.subprocess.Process, BinaryIO, str]:
    """One Chromium on ``profile`` and its DevTools URL; ended again if it gives none."""
    log = _log_file(profile)
    process = await asyncio.create_subprocess_exec(
        executable,
        "--headless=new",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        *args,
        "about:blank",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        return process, log, await _devtools_url(profile, process, timeout)
    except BaseException:
        await _end(process, log)
        raise


async def _end(process: asyncio.subprocess.Process, log: BinaryIO) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()
    log.close()


class _NoPort(Exception):
    """Chromium wrote no DevTools port in time (its log's end is the message)."""


async def _devtools_url(profile: Path, process: asyncio.subprocess.Process, timeout: float) -> str:
    """Chromium writes its DevTools port and browser path to ``DevToolsActivePort``."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise AssertionError(f"chromium exited with {process.returncode}:\n{_tail(profile)}")
        lines = active.read_text().split() if active.exists() else []
        if len(lines) == 2:
            return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        await asyncio.sleep(0.05)
    raise _NoPort(f"chromium wrote no {active} within {timeout} s; its log ends:\n{_tail(profile)}")


def _tail(profile: Path) -> str:
    return (profile / "chromium.log").read_text(errors="replace")[-3000:]


class Page:
    """One attached tab: what it requested, its console errors, and the test's actions."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.urls: list[str] = []
        self.errors: list[str] = []
        self.timeout = 20.0
        self._tasks: set[asyncio.Future[dict[str, Any]]] = set()
        browser.on(session, "Network.requestWillBeSent", self._request)
        browser.on(session, "Runtime.consoleAPICalled", self._console)
        browser.on(session, "Runtime.exceptionThrown", self._exception)
        browser.on(session, "Log.entryAdded", self._log)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    def _request(self, params: dict[str, Any]) -> None:
        self.urls.append(params["request"]["url"])

    def _console(self, params: dict[str, Any]) -> None:
        if params.get("type") == "error":
            args = params.get("args", [])
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in args))

    def _exception(self, params: dict[str, Any]) -> None:
        details = params.get("exceptionDetails", {})
        self.errors.append(str(details.get("exception", {}).get("description", details)))

    def _log(self, params: dict[str, Any]) -> None:
        entry = params.get("entry", {})
        if entry.get("level") == "error":  # a CSP violation, a failed load, ...
            self.errors.append(str(entry.get("text")))

    async def set_cookie(self, name: str, value: str, url: str) -> None:
        await self.send("Network.setCookie", {"name": name, "value": value, "url": url})

    @contextlib.asynccontextmanager
    async def next_load(self) -> AsyncIterator[None]:
        """Wait, on leaving the block, for a page load that began inside it (or after)."""
        loaded = asyncio.Event()

        def listener(params: dict[str, Any]) -> None:
            loaded.set()

        self.browser.on(self.session, "Page.loadEventFired", listener)
        try:
            yield
            await asyncio.wait_for(loaded.wait(), self.timeout)
        finally:
            self.browser.off(self.session, "Page.loadEventFired", listener)

    async def goto(self, url: str) -> None:
        async with self.next_load():
            await self.send("Page.navigate", {"url": url})

    async def reload(self) -> None:
        async with self.next_load():
            await self.send("Page.reload")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str) -> Any:
        """Poll ``expression`` until it is truthy (the page updates itself asynchronously)."""
        deadline = time.monotonic() + self.timeout
        value = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"timed out after {self.timeout} s waiting for {what} (last: {value!r})"
        )

    async def click(self, selector: str) -> None:
        """Click the first element matching ``selector`` once it exists. Dispatched after this
        call returns, so that a ``prompt()`` in the handler does not block the evaluation."""
        await self.wait_for(f"!!document.querySelector({json.dumps(selector)})", selector)
        await self.evaluate(
            f"setTimeout(() => document.querySelector({json.dumps(selector)}).click(), 0)"
        )

    def answer_prompt(self, text: str) -> None:
        """Accept the next JavaScript dialog (``prompt``/``confirm``) with ``text``."""

        def listener(params: dict[str, Any]) -> None:
            self.browser.off(self.session, "Page.javascriptDialogOpening", listener)
            answer = {"accept": True, "promptText": text}
            task = asyncio.ensure_future(self.send("Page.handleJavaScriptDialog", answer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self.browser.on(self.session, "Page.javascriptDialogOpening", listener)

    async def screenshot(self, path: Path) -> None:
        """The whole page, not only the viewport."""
        size = (await self.send("Page.getLayoutMetrics"))["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = await self.send(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        _write(path, base64.b64decode(shot["data"]))
