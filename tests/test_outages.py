"""The engine around database outages (issue 31): an instance never revives what it runs
itself; after an outage no row is judged dead before its owner has had a heartbeat interval
of a working database; and no loop spins while the database is away (the documented backoff,
50 ms up to the polling interval, holds whatever the due times and poll requests say).

Real databases behind ``tests.chaos.cluster.Proxy`` (a TCP proxy that can cut connections and
refuse new ones) or with the heartbeat statement made to fail, as a partition does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.outage import Attempts
from ekbatan_fastapi import ExecutionContext, JobRegistry, OneTimeJob, Schedules
from ekbatan_fastapi.store.tables import scheduled_tasks
from tests.chaos.cluster import Proxy

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, wait_until

pytestmark = pytest.mark.slow  # outages longer than the dead window: seconds each


class Holds(OneTimeJob):
    """Runs until released; counts its starts."""

    def __init__(self, name: str = "holds") -> None:
        self._name = name
        self.starts: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def name(self) -> str:
        return self._name

    async def execute(self, ctx: ExecutionContext) -> None:
        self.starts.append(ctx.task_instance)
        self.started.set()
        await self.release.wait()


async def _picked_row(engine: AsyncEngine) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(select(scheduled_tasks))).one()


async def test_an_instance_never_revives_what_it_runs_after_its_heartbeats_failed(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """Its heartbeats fail for twice the dead window (a partition, a switchover's read-only
    seconds, a Galera eviction) while its other statements get through: the row looks dead,
    but this instance runs it. It revived it and ran it a second time, beside the first."""
    job = Holds()
    registry = await any_registries.start(job)
    await registry.client.schedule("holds", "one")
    await asyncio.wait_for(job.started.wait(), 10)
    claimed = await _picked_row(any_engine)
    tasks = registry.store.tasks

    async def partitioned(*_args: object, **_kwargs: object) -> set[tuple[str, str]]:
        raise OSError("the heartbeat did not get through")

    tasks.heartbeat = partitioned  # type: ignore[method-assign,assignment]
    try:
        await asyncio.sleep(2 * registry.config.dead_after.total_seconds())
    finally:
        del tasks.heartbeat
    await asyncio.sleep(5 * registry.config.heartbeat_interval.total_seconds())
    assert job.starts == ["one"], "the instance revived its own execution and ran it again"
    row = await _picked_row(any_engine)
    assert row.picked and row.picked_by == registry.config.scheduler_name
    assert row.version == claimed.version, "revived meanwhile"
    job.release.set()
    await wait_until(lambda: not registry.scheduler.running, what="the result recorded")


async def test_a_round_whose_heartbeat_failed_revives_nothing(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """A peer's row dead by its heartbeat, and this instance's own heartbeat failing: while
    it fails, nothing is revived (the outage that stopped it may have stopped the peer's)."""
    job = Holds()
    owner = await any_registries.start(job)
    await owner.client.schedule("holds", "one")
    await asyncio.wait_for(job.started.wait(), 10)
    judge_job = Holds("judge-own")
    judge = await any_registries.start(Holds(), judge_job)
    await judge.client.schedule("judge-own", "its own")
    await asyncio.wait_for(judge_job.started.wait(), 10)

    async def partitioned(*_args: object, **_kwargs: object) -> set[tuple[str, str]]:
        raise OSError("the heartbeat did not get through")

    # Both cut off for heartbeats; the judge's other statements still get through.
    owner.store.tasks.heartbeat = partitioned  # type: ignore[method-assign,assignment]
    judge.store.tasks.heartbeat = partitioned  # type: ignore[method-assign,assignment]
    try:
        await asyncio.sleep(2 * owner.config.dead_after.total_seconds())
        assert job.starts == ["one"]
        row = await owner.client.get("holds", "one")
        assert row is not None and row.picked, "revived by a judge whose heartbeat failed"
    finally:
        del owner.store.tasks.heartbeat, judge.store.tasks.heartbeat
        job.release.set()
        judge_job.release.set()
    await wait_until(
        lambda: not owner.scheduler.running and not judge.scheduler.running, what="recorded"
    )


async def _revive_calls(registry: JobRegistry, loop_time: Callable[[], float]) -> list[float]:
    """Record when ``registry``'s dead-execution checks got their answer (loop time)."""
    calls: list[float] = []
    tasks = registry.store.tasks
    revive: Callable[..., Awaitable[Any]] = tasks.revive_dead

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        revival = await revive(*args, **kwargs)
        calls.append(loop_time())
        return revival

    tasks.revive_dead = recorded  # type: ignore[method-assign]
    return calls


async def test_after_an_outage_nothing_is_judged_dead_for_a_heartbeat_interval(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """The database went away (connections reset, new ones refused) for longer than the dead
    window: every row's heartbeat is stale when it comes back. The first dead-execution check
    that reached it judged them at once, before their owners' next round could heartbeat
    them; now the checks wait until the database has worked for one heartbeat interval."""
    proxy = Proxy(any_database.url)
    await proxy.start()
    factory = RegistryFactory(proxy.url, dialect=any_database.override)
    heartbeat = 0.4
    try:
        registry = await factory.start(
            Holds(), heartbeat=heartbeat, customize=lambda b: b.missed_heartbeats_limit(4)
        )
        loop_time = asyncio.get_running_loop().time
        await asyncio.sleep(2 * heartbeat)  # rounds that judged (nothing to judge)
        calls = await _revive_calls(registry, loop_time)
        await proxy.cut()
        await asyncio.sleep(registry.config.dead_after.total_seconds() + heartbeat)
        await proxy.start()
        back = loop_time()
        await wait_until(lambda: any(t > back for t in calls), timeout=10, what="a check")
        first = min(t for t in calls if t > back)
        assert first - back >= heartbeat, f"judged {first - back:.3f}s after the database came back"
    finally:
        await factory.close()
        await proxy.close()


async def test_a_database_restart_longer_than_the_dead_window_duplicates_nothing(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Two instances, one running a long execution; the database goes away for longer than
    the dead window and comes back for both at once. Whichever judged first after the
    restart used to revive the execution (a duplicate beside the original), the owner itself
    included."""
    proxy = Proxy(any_database.url)
    await proxy.start()
    factory = RegistryFactory(proxy.url, dialect=any_database.override)
    job = Holds()
    options: dict[str, Any] = {
        "heartbeat": 0.5,
        "customize": lambda b: b.missed_heartbeats_limit(4),
    }
    try:
        owner = await factory.start(job, **options)
        await owner.client.schedule("holds", "long")
        await asyncio.wait_for(job.started.wait(), 10)
        peers = [await factory.start(job, **options) for _ in range(2)]
        await asyncio.sleep(1.0)
        await proxy.cut()
        await asyncio.sleep(owner.config.dead_after.total_seconds() + 0.5)
        await proxy.start()
        await wait_until(
            lambda: all(r.status().condition == "ok" for r in [owner, *peers]),
            timeout=10,
            what="every instance back",
        )
        await asyncio.sleep(4 * 0.5)  # several rounds of every instance
        assert job.starts == ["long"], "revived after the restart"
        row = await _picked_row(any_engine)
        assert row.picked_by == owner.config.scheduler_name
    finally:
        job.release.set()
        await factory.close()
        await proxy.close()


async def test_the_loops_back_off_while_the_database_refuses_connections(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """The database stops (connections reset, new ones refused) once the poller knows the
    next slot of a job: when that due time passed, its wait after each failed poll returned
    at once, and it retried without pause (about 100 connection attempts a second on this
    machine, 600 where the outage was found). Every loop now backs off, 50 ms up to the
    polling interval, whatever the due times say."""
    proxy = Proxy(any_database.url)
    await proxy.start()
    factory = RegistryFactory(proxy.url, dialect=any_database.override)
    job = RecordingJob("every-300ms", Schedules.fixed_rate(timedelta(milliseconds=300)))
    try:
        registry = await factory.start(job, poll=0.5, heartbeat=0.5)
        await wait_until(lambda: len(job.slots) >= 2, what="two runs")
        await wait_until(lambda: not registry.scheduler.running, what="the result recorded")
        attempts = Attempts(asyncio.get_running_loop())
        await proxy.cut()
        await asyncio.sleep(3.0)  # the next slot passes 0.3 s into the outage
        during = attempts.count
        await proxy.start()
        runs = len(job.slots)
        await wait_until(lambda: len(job.slots) > runs, what="a run after the outage")
    finally:
        await factory.close()
        await proxy.close()
    # 31-34 here (the poller, housekeeper, maintenance and listener loops); 737-1224 before
    assert during <= 60, f"{during} connection attempts during a 3 s outage"
