"""``CheckIns``: dead-man's-switch check-ins for jobs, the protocol Healthchecks.io uses (and
Sentry's, Cronitor's and other cron monitors' HTTP ping endpoints accept in the same shape):

* ``GET {url}/start`` when an execution starts (optional),
* ``GET {url}`` when it succeeded,
* ``POST {url}/fail`` with the error's text when it failed or timed out,

each with ``rid=<uuid>`` (the same for the start and the end of one execution), so a monitor
pairs them and measures the run. The service alerts when a
ping does not come in its window: a job that stopped running anywhere in the cluster, which no
metric of a dead process can say.

A ping never delays a job or the scheduler: the hooks put it in a bounded queue (full: it is
dropped and counted) and one background task sends them through ``httpx`` with a timeout and
a few retries with backoff; a monitor that is down costs log lines (at most one a minute), not
executions. At the scheduler's stop what is queued gets the shutdown's remaining wait.

Register it like any observer::

    checkins = CheckIns({"nightly-report": "https://hc-ping.com/<uuid>"})
    registry = job_registry()...customize_scheduler(lambda b: b.observer(checkins)).build()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from .domain.errors import ConfigurationError
from .domain.logs import library_logger
from .domain.rows import Outcome
from .domain.text import mask_url
from .engine.observer import ExecutionFinished, SchedulerObserver

__all__ = ["CheckIns"]

log = library_logger(__name__)

_BODY_LIMIT = 10_000
"""Characters of the error text sent with a failure (monitors keep about that much)."""
_LOG_EVERY = 60.0


@dataclass(frozen=True, slots=True)
class _Ping:
    url: str
    rid: str
    body: str | None = None
    """Sent as a POST's body (a failure's error text); None: a GET."""


def _checked_url(job: str, url: str) -> str:
    if not isinstance(url, str) or any(c.isspace() for c in url):
        raise ConfigurationError(f"check-in URL of job {job!r} must be a URL without spaces")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"check-in URL of job {job!r} must be an http(s) URL such as "
            f"https://hc-ping.com/<uuid>, got {mask_url(url)!r}"
        )
    return url.rstrip("/")


class CheckIns(SchedulerObserver):
    """Pings a monitoring service for the jobs of ``urls`` (job name -> ping URL).

    ``start``: also ping ``/start`` when an execution starts. ``queue_size``: pings waiting
    at most (more are dropped and counted in ``dropped``). ``timeout``: seconds per request;
    ``attempts`` tries per ping, ``retry_delay`` seconds before the second, doubling.
    ``client``: an ``httpx.AsyncClient`` of your own (proxies, TLS); else one is made and
    closed at the scheduler's stop.
    """

    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        start: bool = True,
        queue_size: int = 1000,
        timeout: float = 5.0,
        attempts: int = 3,
        retry_delay: float = 1.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not isinstance(urls, Mapping) or not urls:
            raise ConfigurationError("CheckIns needs a mapping of job name -> ping URL")
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ConfigurationError(f"queue_size must be a positive count, got {queue_size!r}")
        if not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(f"attempts must be a positive count, got {attempts!r}")
        if not timeout > 0 or not retry_delay >= 0:
            raise ConfigurationError("timeout must be positive and retry_delay not negative")
        self.urls = {job: _checked_url(job, url) for job, url in urls.items()}
        self.start = start
        self.timeout = timeout
        self.attempts = attempts
        self.retry_delay = retry_delay
        self._queue_size = queue_size
        self._queue: asyncio.Queue[_Ping] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._client = client
        self._own_client = client is None
        self.sent = 0
        """Pings the service answered (any 2xx)."""
        self.failed = 0
        """Pings given up after ``attempts`` tries."""
        self.dropped = 0
        """Pings dropped because the queue was full."""
        self._last_logged = -1e9
        self._runs: dict[tuple[str, str], str] = {}
        """The run id of each execution of this process that started and has not finished."""

    # -- the hooks (on the scheduler's loop: never block) ----------------------------------

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        url = self.urls.get(task_name)
        if url is None:
            return
        rid = str(uuid.uuid4())
        self._runs[(task_name, task_instance)] = rid
        if self.start:
            self._put(_Ping(f"{url}/start", rid))

    def execution_finished(self, event: ExecutionFinished) -> None:
        url = self.urls.get(event.task_name)
        if url is None:
            return
        rid = self._runs.pop((event.task_name, event.task_instance), None) or str(uuid.uuid4())
        if event.outcome is Outcome.SUCCEEDED:
            self._put(_Ping(url, rid))
        elif event.outcome in (Outcome.FAILED, Outcome.TIMED_OUT):
            error = event.error
            text = f"{type(error).__name__}: {error}" if error is not None else event.outcome
            self._put(_Ping(f"{url}/fail", rid, str(text)[:_BODY_LIMIT]))

    async def scheduler_stopped(self, timeout: float) -> None:
        """Send what is queued within ``timeout`` seconds, then stop (and close our client)."""
        queue, worker = self._queue, self._worker
        if queue is not None and worker is not None and not worker.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queue.join(), timeout)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._worker = None
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the sender --------------------------------------------------------------------------

    def _put(self, ping: _Ping) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue(self._queue_size)
        try:
            self._queue.put_nowait(ping)
        except asyncio.QueueFull:
            self.dropped += 1
            self._warn("check-in queue full (%d waiting): a ping was dropped", self._queue_size)
            return
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._send_all())

    async def _send_all(self) -> None:
        assert self._queue is not None
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=True)
        while True:
            ping = await self._queue.get()
            try:
                await self._send(self._client, ping)
            finally:
                self._queue.task_done()

    async def _send(self, client: httpx.AsyncClient, ping: _Ping) -> None:
        delay = self.retry_delay
        problem = ""
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                if ping.body is None:
                    response = await client.get(ping.url, params={"rid": ping.rid})
                else:
                    response = await client.post(
                        ping.url, params={"rid": ping.rid}, content=ping.body.encode()
                    )
            except httpx.HTTPError as error:
                problem = f"{type(error).__name__}"
                continue
            if response.is_success:
                self.sent += 1
                return
            problem = f"HTTP {response.status_code}"
            if response.status_code < 500 and response.status_code != 429:
                break  # the monitor refuses this ping: retrying cannot help
        self.failed += 1
        self._warn(
            "check-in %s failed (%s); the job itself is not affected", mask_url(ping.url), problem
        )

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_logged >= _LOG_EVERY:
            self._last_logged = now
            log.warning(message + " (logged at most once a minute)", *args)
