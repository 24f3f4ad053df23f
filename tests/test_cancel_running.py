"""Stopping a running execution cluster-wide (``client.cancel_running``): the instance that runs
it cancels it within a heartbeat interval, the history says who asked and why, a recurring job
goes on with its next slot, a one-time task is removed. On every database, with real scheduler
processes."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    NotRunningError,
    OneTimeJob,
    Schedule,
    Schedules,
    TaskNotFoundError,
    job_registry,
)

from .conftest import Database
from .helpers import RegistryFactory, Worker, wait_until
from .proc_worker import LEDGERS, starts


async def _history(engine: AsyncEngine, name: str) -> list[tuple[str, str | None, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT outcome, error_class, error_message FROM ekbatan_execution_history "
                "WHERE task_name = :n ORDER BY id"
            ),
            {"n": name},
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def _cancelled(engine: AsyncEngine, name: str) -> tuple[str, str | None, str | None]:
    async def recorded() -> bool:
        return any(o == "cancelled" for o, _, _ in await _history(engine, name))

    await wait_until(recorded, timeout=20, what=f"a cancelled record of {name}")
    return next(r for r in await _history(engine, name) if r[0] == "cancelled")


class Endless(DistributedJob):
    """Runs until cancelled; remembers whether it saw its cancellation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.saw_cancel = False
        self.slots: list[object] = []

    def name(self) -> str:
        return "endless"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.saw_cancel = True
            raise


class Polling(DistributedJob):
    """A plain def job that polls ctx.cancel_requested."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped_by_request = False

    def name(self) -> str:
        return "polling"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    def execute(self, ctx: ExecutionContext) -> None:
        self.started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ctx.cancel_requested:
                self.stopped_by_request = True
                return
            time.sleep(0.01)


class OneOff(OneTimeJob):
    def __init__(self) -> None:
        self.started = asyncio.Event()

    def name(self) -> str:
        return "oneoff"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.started.set()
        await asyncio.sleep(3600)


def _control(engine: AsyncEngine, *jobs: object) -> object:
    """A registry that is never started: its client only (no scheduler in this 'process')."""
    return job_registry().connection_provider(engine).with_jobs(jobs).build()  # type: ignore[arg-type]


async def test_an_async_recurring_execution_is_cancelled_and_goes_on_with_its_next_slot(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Endless()
    registry = await any_registries.start(job, heartbeat=0.1)
    await asyncio.wait_for(job.started.wait(), 10)
    before = await registry.client.get("endless", "recurring")
    assert before is not None and before.picked
    control = _control(any_engine, Endless())
    asked = time.monotonic()
    runner = await control.client.cancel_running(  # type: ignore[attr-defined]
        "endless", reason="deploy in progress", requested_by="alice"
    )
    assert runner == registry.scheduler.name
    _, error_class, message = await _cancelled(any_engine, "endless")
    took = time.monotonic() - asked
    assert job.saw_cancel
    assert error_class == "ExecutionCancelled"
    assert message == "cancelled by alice: deploy in progress"
    assert took < 5, f"{took:.2f} s to cancel with a 0.1 s heartbeat"

    async def rescheduled() -> bool:
        row = await registry.client.get("endless", "recurring")
        return row is not None and not row.picked

    await wait_until(rescheduled, what="the next slot")
    after = await registry.client.get("endless", "recurring")
    assert after is not None
    assert after.execution_time > before.execution_time + timedelta(minutes=59)
    assert after.consecutive_failures == 0, "a cancel is not a failure"
    with pytest.raises(NotRunningError, match="is not running right now"):
        await control.client.cancel_running("endless")  # type: ignore[attr-defined]
    async with any_engine.connect() as conn:
        left = await conn.execute(text("SELECT COUNT(*) FROM ekbatan_cancel_requests"))
        assert left.scalar_one() == 0, "the request is deleted once acted on"


async def test_a_plain_def_job_sees_cancel_requested_and_is_recorded_cancelled(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Polling()
    registry = await any_registries.start(job, heartbeat=0.1)
    assert await asyncio.to_thread(job.started.wait, 10)
    await registry.client.cancel_running("polling", reason="stuck")
    _, _, message = await _cancelled(any_engine, "polling")
    assert job.stopped_by_request
    assert message is not None and message.endswith(": stuck")
    assert registry.scheduler.name in message, "who asked: this process's scheduler"


async def test_a_one_time_task_is_removed_and_not_running_ones_are_refused(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = OneOff()
    registry = await any_registries.start(job, heartbeat=0.1)
    client = registry.client
    with pytest.raises(NotRunningError, match="no such task instance is scheduled"):
        await client.cancel_running("oneoff", "nope")
    with pytest.raises(TaskNotFoundError):  # NotRunningError is one
        await client.cancel_running("oneoff", "nope")
    await client.schedule("oneoff", "later", datetime.now(UTC) + timedelta(hours=1))
    with pytest.raises(NotRunningError, match="oneoff/later is not running right now"):
        await client.cancel_running("oneoff", "later")
    await client.schedule("oneoff", "now", None)
    await asyncio.wait_for(job.started.wait(), 10)
    await client.cancel_running("oneoff", "now")
    await _cancelled(any_engine, "oneoff")

    async def removed() -> bool:
        return await client.get("oneoff", "now") is None

    await wait_until(removed, what="the cancelled one-time task removed")
    assert await client.get("oneoff", "later") is not None


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_a_peer_process_cancels_what_it_runs_when_asked_from_elsewhere(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Two scheduler processes run ``long`` (one of them holds it); this process, with no
    scheduler, asks: the holder stops it, records who and why, and goes on."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[starts])
    args = ["--dialect", any_database.override] if any_database.override else []
    workers = await asyncio.gather(
        *(Worker.start("long", any_database.url, "--heartbeat", "0.2", *args) for _ in range(2))
    )
    control = _control(any_engine, Endless())
    try:

        async def started() -> bool:
            async with any_engine.connect() as conn:
                return bool((await conn.execute(select(starts.c.pid))).all())

        await wait_until(started, timeout=30, what="long started in a worker")
        async with any_engine.connect() as conn:
            pid = (await conn.execute(select(starts.c.pid))).scalar_one()
        asked = time.monotonic()
        runner = await control.client.cancel_running(  # type: ignore[attr-defined]
            "long", reason="from the control process", requested_by="ops"
        )
        _, _, message = await _cancelled(any_engine, "long")
        took = time.monotonic() - asked
        assert message == "cancelled by ops: from the control process"
        assert str(pid) in runner
        assert took < 5, f"{took:.2f} s to cancel across processes with a 0.2 s heartbeat"
        row = await control.client.get("long", "recurring")  # type: ignore[attr-defined]
        assert row is not None and not row.picked
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0], "both workers stopped cleanly (the cancel did not hurt them)"
    async with any_engine.connect() as conn:
        assert len((await conn.execute(select(starts.c.pid))).all()) == 1, "ran once"


async def test_the_admin_route_stops_it_behind_the_admin_dependency_and_origin_checks(
    engine: AsyncEngine, database_url: str
) -> None:
    from ekbatan_fastapi.web import create_jobs_router

    from .test_jobs_routes import serving
    from .test_operations_routes import ADMIN, named_admin

    job = Endless()
    router = create_jobs_router(admin_dependency=named_admin)
    async with serving(database_url, job, router=router) as (client, state):
        await asyncio.wait_for(job.started.wait(), 10)
        assert (await client.post("/jobs/endless/cancel")).status_code == 401
        cross = {**ADMIN, "sec-fetch-site": "cross-site"}
        assert (await client.post("/jobs/endless/cancel", headers=cross)).status_code == 403
        missing = await client.post("/jobs/endless/cancel?instance=other", headers=ADMIN)
        assert missing.status_code == 404
        assert "not running" in missing.json()["detail"]
        response = await client.post(
            "/jobs/endless/cancel", json={"reason": "runaway"}, headers=ADMIN
        )
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["running_on"] == state.registry.status().name
        assert body["requested_by"] == "alice@example.com"
        assert body["reason"] == "runaway"
        _, _, message = await _cancelled(engine, "endless")
        assert message == "cancelled by alice@example.com: runaway"
        again = await client.post("/jobs/endless/cancel", headers=ADMIN)
        assert again.status_code == 404
        assert "is not running right now" in again.json()["detail"]


@pytest.mark.multiprocess
async def test_the_cli_verb_stops_it_and_says_when_nothing_runs(
    any_database: Database, any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    from .test_cli import cli, target

    job = Endless()
    registry = await any_registries.start(job, heartbeat=0.1)
    await asyncio.wait_for(job.started.wait(), 10)
    url = target(any_database)
    done = await cli(
        *url, "cancel", "endless", "--reason", "from the shell", "--by", "bob", "--json"
    )
    assert done.code == 0, done.stderr
    assert done.json["running_on"] == registry.scheduler.name
    _, _, message = await _cancelled(any_engine, "endless")
    assert message == "cancelled by bob: from the shell"

    async def rescheduled() -> bool:
        row = await registry.client.get("endless", "recurring")
        return row is not None and not row.picked

    await wait_until(rescheduled, what="the next slot")
    again = await cli(*url, "cancel", "endless")
    assert again.code == 3, again.stdout
    assert "endless/recurring is not running right now" in again.stderr
