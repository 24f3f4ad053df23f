"""Prometheus metrics: scraped after real executions, through the ASGI app and the router."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ConfigurationError, Schedules
from ekbatan_fastapi.metrics import EkbatanMetrics
from ekbatan_fastapi.web import create_ekbatan_lifespan, jobs_router, metrics_router

from .fastapi_helpers import fast_settings, running
from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def scrape(app: object, path: str = "/") -> Samples:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


async def test_scrape_after_real_executions(registries: RegistryFactory) -> None:
    metrics = EkbatanMetrics()
    release = asyncio.Event()
    ok = RecordingJob("ok", Schedules.fixed_delay(timedelta(hours=1)))
    bad = RecordingJob("bad", Schedules.fixed_delay(timedelta(hours=1)), fail=True)
    held = RecordingJob("held", Schedules.fixed_delay(timedelta(hours=1)), block=release)
    once = CountingJob()
    before = time.time()
    registry = await registries.start(ok, bad, held, once, customize=lambda b: b.observer(metrics))
    for instance in ("a", "b"):
        await registry.client.schedule("count", instance)
    await asyncio.wait_for(held.started.wait(), 5)
    await wait_until(lambda: sum(once.runs.values()) == 2 and bool(ok.slots and bad.slots))
    await wait_until(lambda: len(registry.scheduler.running) == 1, what="only held running")
    app = metrics.asgi_app()
    samples = await scrape(app)

    assert value(samples, "ekbatan_executions_total", task="ok", outcome="succeeded") == 1
    assert value(samples, "ekbatan_executions_total", task="bad", outcome="failed") == 1
    assert value(samples, "ekbatan_executions_total", task="count", outcome="succeeded") == 2
    assert value(samples, "ekbatan_executions_total", task="held", outcome="succeeded") is None
    assert value(samples, "ekbatan_execution_duration_seconds_count", task="count") == 2
    assert not value(samples, "ekbatan_execution_duration_seconds_count", task="held")
    # the lag is observed when an execution starts: held is counted while it still runs
    assert value(samples, "ekbatan_execution_slot_lag_seconds_count", task="held") == 1
    lag_sum = value(samples, "ekbatan_execution_slot_lag_seconds_sum", task="ok")
    assert lag_sum is not None and 0 <= lag_sum < 5
    last_ok = value(samples, "ekbatan_last_success_timestamp_seconds", task="ok")
    assert last_ok is not None and before - 1 < last_ok < time.time() + 1
    assert value(samples, "ekbatan_last_success_timestamp_seconds", task="bad") is None
    assert value(samples, "ekbatan_consecutive_failures", task="bad") == 1
    assert value(samples, "ekbatan_consecutive_failures", task="ok") == 0
    assert value(samples, "ekbatan_running_executions", task="held") == 1
    assert value(samples, "ekbatan_running_executions", task="ok") == 0
    polls = value(samples, "ekbatan_poll_duration_seconds_count")
    assert polls is not None and polls >= 1
    assert value(samples, "ekbatan_claimed_executions_total") == 5
    assert value(samples, "ekbatan_heartbeat_failures_total", task="held") is None

    release.set()
    await wait_until(lambda: registry.scheduler.running == {}, what="held to finish")
    samples = await scrape(app)
    assert value(samples, "ekbatan_executions_total", task="held", outcome="succeeded") == 1
    assert value(samples, "ekbatan_running_executions", task="held") == 0


async def test_each_instance_has_its_own_registry() -> None:
    first, second = EkbatanMetrics(), EkbatanMetrics()  # no "Duplicated timeseries" error
    first.polled(0.01, 3)
    assert value(parse(first.render()[0].decode()), "ekbatan_claimed_executions_total") == 3
    assert value(parse(second.render()[0].decode()), "ekbatan_claimed_executions_total") == 0
    body, content_type = first.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


async def test_settings_turn_metrics_on_and_the_router_serves_them(
    engine: AsyncEngine, database_url: str
) -> None:
    job = CountingJob()
    settings = fast_settings(database_url, metrics=True)
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=settings, jobs=[job], discover=False))
    app.include_router(jobs_router)
    app.include_router(metrics_router)
    async with running(app) as client:
        client_api = app.state.ekbatan.client
        await client_api.schedule("count", "a")
        await wait_until(lambda: job.runs["a"] == 1, what="the run")
        await wait_until(lambda: app.state.ekbatan.registry.scheduler.running == {})
        response = await client.get("/metrics")
        assert response.status_code == 200
        samples = parse(response.text)
    assert value(samples, "ekbatan_executions_total", task="count", outcome="succeeded") == 1


async def test_router_says_how_to_turn_metrics_on(engine: AsyncEngine, database_url: str) -> None:
    settings = fast_settings(database_url)
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=settings, jobs=[CountingJob()]))
    app.include_router(metrics_router)
    async with running(app) as client:
        response = await client.get("/metrics")
    assert response.status_code == 404
    assert "EKBATAN_JOBS__METRICS=true" in response.json()["detail"]


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"ekbatan-fastapi\[metrics\]"):
        EkbatanMetrics()


def test_the_core_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, ekbatan_fastapi, ekbatan_fastapi.metrics, ekbatan_fastapi.engine.observer; "
        "assert 'prometheus_client' not in sys.modules"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)
