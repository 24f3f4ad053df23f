"""Dead-man's-switch check-ins (issue 30, item 6): a real HTTP server receives Healthchecks.io's
protocol from a running scheduler; a monitor that hangs or is down never delays a job."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.checkin import CheckIns
from ekbatan_fastapi.domain.errors import ConfigurationError

from .helpers import RecordingJob, RegistryFactory, wait_until


@dataclass
class Monitor:
    """A tiny HTTP/1.1 server on 127.0.0.1 recording each request line and body."""

    status: int = 200
    hang: asyncio.Event | None = None
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path with query, body)"""
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method, target, _ = head.split("\r\n", 1)[0].split(" ", 2)
                length = 0
                for line in head.split("\r\n")[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = (await reader.readexactly(length)).decode() if length else ""
                self.requests.append((method, target, body))
                if self.hang is not None:
                    await self.hang.wait()
                writer.write(f"HTTP/1.1 {self.status} X\r\ncontent-length: 2\r\n\r\nOK".encode())
                await writer.drain()
        writer.close()

    def paths(self) -> list[str]:
        return [f"{m} {t.split('?')[0]}" for m, t, _ in self.requests]


@contextlib.asynccontextmanager
async def monitor(**options: object) -> AsyncIterator[Monitor]:
    m = Monitor(**options)  # type: ignore[arg-type]
    server = await asyncio.start_server(m.handle, "127.0.0.1", 0)
    m.port = server.sockets[0].getsockname()[1]
    try:
        yield m
    finally:
        server.close()
        if m.hang is not None:
            m.hang.set()


def test_bad_urls_are_refused_naming_the_job() -> None:
    with pytest.raises(ConfigurationError, match=r"job 'nightly'.*https://hc-ping\.com"):
        CheckIns({"nightly": "ftp://example.com/x"})
    with pytest.raises(ConfigurationError, match=r"job 'nightly'.*without spaces"):
        CheckIns({"nightly": "https://hc-ping.com/a b"})
    with pytest.raises(ConfigurationError, match="mapping"):
        CheckIns({})
    with pytest.raises(ConfigurationError) as caught:
        CheckIns({"nightly": "gopher://user:hunter2@example.com/"})
    assert "hunter2" not in str(caught.value)


async def test_start_success_and_failure_are_pinged_with_one_run_id(
    registries: RegistryFactory,
) -> None:
    async with monitor() as m:
        base = f"http://127.0.0.1:{m.port}/ping"
        checkins = CheckIns({"ok-job": f"{base}/ok", "bad-job": f"{base}/bad"}, retry_delay=0.01)
        every = Schedules.fixed_delay(timedelta(seconds=30))
        ok, bad = RecordingJob("ok-job", every), RecordingJob("bad-job", every, fail=True)
        registry = await registries.start(
            ok, bad, RecordingJob("quiet", every), customize=lambda b: b.observer(checkins)
        )
        await wait_until(lambda: checkins.sent >= 4, what="four pings")
        await registry.stop()
        paths = m.paths()
        assert sorted(paths) == sorted(
            ["GET /ping/ok/start", "GET /ping/ok", "GET /ping/bad/start", "POST /ping/bad/fail"]
        )
        fail = next(r for r in m.requests if r[1].startswith("/ping/bad/fail"))
        assert "RuntimeError: bad-job failed on purpose" in fail[2]
        rids = {t.split("rid=")[1] for _, t, _ in m.requests if "/ping/ok" in t}
        assert len(rids) == 1  # the start and the end of one run pair up
        assert checkins.failed == 0 and checkins.dropped == 0


async def test_a_hanging_monitor_never_delays_a_job_and_a_full_queue_drops(
    registries: RegistryFactory,
) -> None:
    async with monitor(hang=asyncio.Event()) as m:
        checkins = CheckIns(
            {"ok-job": f"http://127.0.0.1:{m.port}/p"}, queue_size=1, timeout=30, attempts=1
        )
        job = RecordingJob("ok-job", Schedules.fixed_delay(timedelta(milliseconds=50)))
        registry = await registries.start(job, customize=lambda b: b.observer(checkins))
        # the first ping hangs in the server; the queue holds one more; the rest are dropped,
        # and the job goes on at its pace
        await wait_until(lambda: len(job.slots) >= 5, what="five runs while the monitor hangs")
        assert checkins.dropped >= 3 and checkins.sent == 0
        await registry.stop()  # gives the queue the shutdown's wait, then gives up


async def test_a_monitor_that_is_down_costs_a_warning_not_a_run(
    registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with monitor(status=503) as m:
        checkins = CheckIns(
            {"ok-job": f"http://user:s3cret@127.0.0.1:{m.port}/p"}, start=False, retry_delay=0.01
        )
        job = RecordingJob("ok-job", Schedules.fixed_delay(timedelta(seconds=30)))
        registry = await registries.start(job, customize=lambda b: b.observer(checkins))
        await wait_until(lambda: checkins.failed == 1, what="the ping given up")
        await registry.stop()
    assert len(m.requests) == 3  # attempts
    assert len(job.slots) == 1
    warning = [r.getMessage() for r in caplog.records if "check-in" in r.getMessage()]
    assert warning and "HTTP 503" in warning[0] and "s3cret" not in warning[0]
