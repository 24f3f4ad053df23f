"""Helpers for the FastAPI integration tests: test-sized settings and a running app client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from ekbatan_fastapi.settings import EkbatanSettings

FAST_JOBS = {
    "polling-interval": "PT0.1S",
    "heartbeat-interval": "PT0.1S",
    # Dead after 2 s: a test machine under load must not see live executions as dead.
    "missed-heartbeats-limit": "20",
    "shutdown-max-wait": "PT2S",
    # Every read of /jobs reads the table: a test reads right after it changed something.
    # (Concurrent requests still share one read; tests/test_read_budget.py tests the cache.)
    "web-report-cache": "PT0S",
}
SLOT_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG"


def fast_settings(url: str, **jobs: Any) -> EkbatanSettings:
    """Settings for ``url``: 0.1 s polling and heartbeats, dead after 2 s, 2 s shutdown wait."""
    return EkbatanSettings(
        jobs={**FAST_JOBS, **jobs},
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": url}}}]}]},
    )


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and yield an HTTP client for it, all in this event loop."""
    async with (
        LifespanManager(app, startup_timeout=10, shutdown_timeout=15) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://testserver"
        ) as client,
    ):
        yield client
