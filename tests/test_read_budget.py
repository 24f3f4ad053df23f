"""The read budget of the unauthenticated routes (issue 27, item 3): a flood of ``GET /jobs``
never stops the jobs.

The web reads have a pool of their own and a gate (``web-read-pool-size``); requests beyond
it get 429 with ``Retry-After`` at once; concurrent requests for one page share one read;
a page is at most ``MAX_PAGE`` rows; readiness follows the scheduler's own link to the
database. Slow reads are made by holding a connection of the pool the read goes through until
the test lets go (``HeldReads``), so the order of events is the test's, not the machine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules, scheduled_tasks
from ekbatan_fastapi.client import SchedulerClient
from ekbatan_fastapi.domain.errors import DatabaseUnavailable
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import EkbatanState, create_ekbatan_lifespan, create_jobs_router

from .fastapi_helpers import FAST_JOBS, running
from .helpers import RecordingJob, wait_until
from .test_jobs_routes import insert_row

HOUR = timedelta(hours=1)


class HeldReads:
    """``SchedulerClient.list`` that first takes a connection of the pool the client reads
    through and keeps it until ``release`` (as a slow read of a big table does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = asyncio.Event()
        self.holding = 0
        self.calls = 0
        original = SchedulerClient.list
        held = self

        async def slow_list(client: SchedulerClient, *args: Any, **kwargs: Any) -> Any:
            held.calls += 1
            async with client.store.db.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
                held.holding += 1
                try:
                    await held.release.wait()
                finally:
                    held.holding -= 1
            return await original(client, *args, **kwargs)

        monkeypatch.setattr(SchedulerClient, "list", slow_list)


class Blocking(RecordingJob):
    """Runs until released: its row is heartbeated all the while."""


@asynccontextmanager
async def app_with(
    url: str, *jobs: Any, timeout: float = 30.0, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, EkbatanState]]:
    config = EkbatanSettings(
        jobs={**FAST_JOBS, **settings},
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": url}}}]}]},
    )
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=config, jobs=jobs, discover=False))
    app.include_router(create_jobs_router(timeout=timeout))
    async with running(app) as client:
        state: EkbatanState = app.state.ekbatan
        assert await state.registry.wait_until_ready(10)
        yield client, state


async def heartbeat(engine: AsyncEngine, name: str) -> datetime | None:
    async with engine.connect() as conn:
        row = await conn.execute(
            select(scheduled_tasks.c.last_heartbeat).where(scheduled_tasks.c.task_name == name)
        )
        value: datetime | None = row.scalar_one_or_none()
        return value


# The app reads its database from the settings' URL, which cannot select mysql5.
@pytest.mark.parametrize(
    "any_database", ["postgresql-embedded", "postgresql", "mysql"], indirect=True
)
async def test_slow_readers_never_stop_claims_completions_or_heartbeats(
    any_engine: AsyncEngine, any_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight slow readers at once (each would hold a connection for as long as its read
    takes) against a read budget of one: the scheduler keeps claiming, completing and
    heartbeating, the readers beyond the budget are told to come back, and the probe never
    says the database is unreachable. Before the budget, the readers took the scheduler's
    five pooled connections and the jobs stopped until they let go."""
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    release = asyncio.Event()
    long = Blocking("long", Schedules.fixed_delay(HOUR), block=release)
    held: HeldReads | None = None
    try:
        async with app_with(any_database_url, tick, long, **{"web-read-pool-size": 1}) as (
            client,
            state,
        ):
            await long.started.wait()
            assert (await client.get("/jobs?limit=1")).status_code == 200  # the probe, once
            held = HeldReads(monkeypatch)
            readers = [asyncio.ensure_future(client.get(f"/jobs?offset={n}")) for n in range(8)]
            await wait_until(lambda: held is not None and held.holding >= 1, what="a reader")
            # The scheduler's loops go on while the readers hold what they hold.
            runs = len(tick.slots)
            beat = await heartbeat(any_engine, "long")
            await wait_until(lambda: len(tick.slots) >= runs + 5, what="tick's next runs")
            await wait_until(
                lambda: _newer_heartbeat(any_engine, beat), what="long's heartbeat to advance"
            )
            # Beyond the budget: 429 with Retry-After, never a wait for a connection.
            busy = [r for r in await _settled(readers) if r.status_code == 429]
            assert len(busy) == 7, [r.status_code for r in busy]
            for response in busy:
                assert response.headers["retry-after"] == "1"
                assert "web-read-pool-size" in response.json()["detail"]
            # The probe's page was read a moment ago: that answer serves while the gate is
            # full; a page never read is busy. Neither says the database is unreachable.
            probe = await client.get("/jobs?limit=1")
            assert probe.status_code == 200 and probe.json()["healthy"] is True, probe.text
            other = await client.get("/jobs?limit=2")
            assert other.status_code == 429 and "unreachable" not in other.text
            assert held.holding == 1  # the one read within the budget, on the reads' pool
            held.release.set()
            (served,) = [r for r in await asyncio.gather(*readers) if r.status_code != 429]
            assert served.status_code == 200, served.text
            assert (await client.get("/jobs?limit=2")).status_code == 200
            status = state.registry.status()
            assert status.condition == "ok" and status.loop_restarts == 0
    finally:
        if held is not None:
            held.release.set()
        release.set()


async def _newer_heartbeat(engine: AsyncEngine, than: datetime | None) -> bool:
    now = await heartbeat(engine, "long")
    return now is not None and (than is None or now > than)


async def _settled(readers: list[asyncio.Future[httpx.Response]]) -> list[Any]:
    """The readers answered so far, once all but the held one have answered."""
    await wait_until(lambda: sum(r.done() for r in readers) >= len(readers) - 1, what="429s")
    return [r.result() for r in readers if r.done()]


async def test_concurrent_requests_for_one_page_share_one_read(
    engine: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tick = RecordingJob("tick", Schedules.fixed_delay(HOUR))
    held = HeldReads(monkeypatch)
    async with app_with(database_url, tick, **{"web-report-cache": "PT30S"}) as (client, _):
        flood = [asyncio.ensure_future(client.get("/jobs")) for _ in range(20)]
        await wait_until(lambda: held.holding == 1, what="the one read")
        held.release.set()
        answers = await asyncio.gather(*flood)
        assert {r.status_code for r in answers} == {200}
        assert len({r.content for r in answers}) == 1  # one body, rendered once
        assert held.calls == 1
        # Within the cache interval the answer serves again; another page is another read.
        assert (await client.get("/jobs")).content == answers[0].content
        assert held.calls == 1
        assert (await client.get("/jobs?offset=1")).status_code == 200
        assert held.calls == 2


async def test_a_page_is_bounded_and_pages_on(engine: AsyncEngine, database_url: str) -> None:
    tick = RecordingJob("tick", Schedules.fixed_delay(HOUR))
    for n in range(150):
        await insert_row(engine, "other-service", task_instance=f"i-{n:03}")
    async with app_with(database_url, tick) as (client, _):
        await wait_until(lambda: _succeeded(client, "tick"), what="tick's row to settle")
        too_many = await client.get("/jobs?limit=10000")
        assert too_many.status_code == 422
        (error,) = too_many.json()["detail"]
        assert error["loc"] == ["query", "limit"] and "1000" in error["msg"]
        first = (await client.get("/jobs")).json()
        assert len(first["tasks"]) == 100 and first["next_offset"] == 100
        second = (await client.get(f"/jobs?offset={first['next_offset']}")).json()
        assert len(second["tasks"]) == 51 and second["next_offset"] is None
        names = [(t["name"], t["instance"]) for t in first["tasks"] + second["tasks"]]
        assert len(set(names)) == 151
        schema = (await client.get("/openapi.json")).json()
        limit = next(
            p for p in schema["paths"]["/jobs"]["get"]["parameters"] if p["name"] == "limit"
        )
        assert limit["schema"]["maximum"] == 1000 and limit["schema"]["default"] == 100
        assert "429" in schema["paths"]["/jobs"]["get"]["responses"]


async def _succeeded(client: httpx.AsyncClient, name: str) -> bool:
    tasks = (await client.get(f"/jobs/{name}")).json()["tasks"]
    return bool(tasks and tasks[0]["last_success"])


async def test_readiness_follows_the_schedulers_link_not_the_web_read(
    engine: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reads' own pool cannot reach the database (say, its connection limit) while the
    scheduler's connections work: the report says so, and the probe stays 200."""
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    async with app_with(database_url, tick) as (client, state):
        reads = state.reads
        assert reads is not None and reads.separate
        assert reads.client.store.db.engine is not state.registry.engine

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise DatabaseUnavailable("database unreachable at postgresql://db/app: refused")

        monkeypatch.setattr(reads.client, "list", refused)
        response = await client.get("/jobs?limit=1")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["healthy"] is True and body["tasks"] == []
        assert any("could not read the table" in w for w in body["warnings"]), body
        seen = len(tick.slots)
        await wait_until(lambda: len(tick.slots) > seen, what="the scheduler still runs")


async def test_over_budget_dashboard_and_history_answer_busy(
    engine: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tick = RecordingJob("tick", Schedules.fixed_delay(HOUR))
    held = HeldReads(monkeypatch)
    async with app_with(database_url, tick, **{"web-read-pool-size": 1}) as (client, _):
        first = asyncio.ensure_future(client.get("/jobs"))
        await wait_until(lambda: held.holding == 1, what="the read within the budget")
        for path in ("/jobs/-/ui", "/jobs/tick/history", "/jobs/tick"):
            response = await client.get(path)
            assert response.status_code == 429, (path, response.text)
            assert response.headers["retry-after"] == "1"
        held.release.set()
        assert (await first).status_code == 200
        assert (await client.get("/jobs/-/ui")).status_code == 200


@pytest.mark.parametrize("vouched", [False, True])
async def test_stuck_reads_never_serve_an_older_200_unless_the_scheduler_vouches(
    monkeypatch: pytest.MonkeyPatch, vouched: bool
) -> None:
    """A blackholed database (chaos db-restart, issue 27's read budget): the reads in the gate
    get no answer, so a page read before must not keep answering 200 for STALE_LIMIT seconds;
    it may while the scheduler's own connections get answers (a flood, not an outage)."""
    from ekbatan_fastapi.web import reads as reads_module

    monkeypatch.setattr(reads_module, "STUCK_AFTER", 0.05)
    monkeypatch.setattr(reads_module, "QUEUE_WAIT", 0.05)
    asked: list[float] = []

    def vouch(seconds: float) -> bool:
        asked.append(seconds)
        return vouched

    budget = reads_module.WebReads(
        SchedulerClient.__new__(SchedulerClient), 1, cache_seconds=0.0, vouch=vouch
    )
    release = asyncio.Event()

    async def page() -> str:
        return "read before"

    async def silent() -> str:
        await release.wait()
        return "late"

    assert await budget.read("page", page) == "read before"
    stuck = asyncio.ensure_future(budget.read("other", silent))  # holds the only place
    await asyncio.sleep(0.1)  # past STUCK_AFTER
    if vouched:
        assert await budget.read("page", page) == "read before"
    else:
        with pytest.raises(reads_module.ReadsStuck) as caught:
            await budget.read("page", page)
        assert caught.value.status_code == 503
        assert "no answer" in str(caught.value.detail)
    assert asked and asked[0] >= 0.05
    release.set()
    assert await stuck == "late"
    await budget.close()
