"""Execution control: per-job timeouts, cluster-wide concurrency limits (counted on the
database, across OS processes) and ``try_cluster_lock``. On every database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    OneTimeJob,
    RetryLater,
    Schedule,
    Schedules,
    job_registry,
    try_cluster_lock,
)
from ekbatan_fastapi.store.locks import release_locks, take_locks

from .conftest import Database, sibling_database
from .helpers import RegistryFactory, Worker, wait_until
from .proc_worker import LEDGERS, spans

ROOT = Path(__file__).resolve().parent.parent


async def _outcomes(engine: AsyncEngine, name: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT outcome FROM ekbatan_execution_history WHERE task_name = :n ORDER BY id"),
            {"n": name},
        )
        return [r[0] for r in rows]


async def _outcomes_of(engine: AsyncEngine, name: str, count: int) -> list[str]:
    async def written() -> bool:
        return len(await _outcomes(engine, name)) >= count

    await wait_until(written, what=f"{count} history records of {name}")
    return await _outcomes(engine, name)


# -- timeouts ------------------------------------------------------------------------------------


class Slow(DistributedJob):
    """Sleeps past its timeout; cleans up when cancelled (or, ``stubborn``, refuses to)."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.stubborn = stubborn
        self.cleanups: list[tuple[bool, bool]] = []
        self.runs = 0
        self.client: Any = None

    def name(self) -> str:
        return "slow"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    def timeout(self) -> timedelta:
        return timedelta(milliseconds=300)

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs += 1
        if self.runs > 1:
            return  # a revived rerun finishes at once
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            row = await self.client.get("slow", "recurring")
            self.cleanups.append((ctx.is_timed_out, row.picked))
            if self.stubborn:
                await asyncio.sleep(3)  # ignores its cancellation past the grace period
            raise


async def test_an_async_job_is_cancelled_at_its_timeout_and_fails_as_timed_out(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Slow()
    registry = any_registries.build(job)
    job.client = registry.client
    await registry.start()
    await wait_until(lambda: bool(job.cleanups), what="the cancellation")
    assert job.cleanups == [(True, True)], "timed out, and the row still picked while cleaning"
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    row = await registry.client.get("slow", "recurring")
    assert row is not None and not row.picked and row.consecutive_failures == 1
    assert row.execution_time > row.last_failure  # type: ignore[operator]
    assert await _outcomes_of(any_engine, "slow", 1) == ["timed_out"]


async def test_a_job_that_ignores_its_cancellation_is_abandoned_and_revived(
    any_registries: RegistryFactory, any_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    job = Slow(stubborn=True)
    registry = any_registries.build(job)
    job.client = registry.client
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        await wait_until(lambda: bool(job.cleanups), what="the cancellation")
        # the row stays picked, unheartbeated: revived after the dead window, run again
        await wait_until(lambda: job.runs == 2, timeout=15, what="the rerun after revival")
    assert any("slow/recurring ignored its cancellation" in r.getMessage() for r in caplog.records)


class SlowSync(OneTimeJob):
    def __init__(self) -> None:
        self.saw_timeout = False

    def name(self) -> str:
        return "slow-sync"

    def timeout(self) -> timedelta:
        return timedelta(milliseconds=200)

    def failure_handler(self) -> RetryLater:
        return RetryLater(timedelta(hours=1))

    def execute(self, ctx: ExecutionContext) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if ctx.is_timed_out:
                self.saw_timeout = True
                return
            time.sleep(0.01)


async def test_a_sync_job_sees_is_timed_out_and_is_recorded_timed_out(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = SlowSync()
    registry = await any_registries.start(job)
    await registry.client.schedule("slow-sync", "a")
    await wait_until(lambda: job.saw_timeout, what="ctx.is_timed_out")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    task = await registry.client.get("slow-sync", "a")
    assert task is not None and task.consecutive_failures == 1, "a timeout is a failure"
    assert await _outcomes_of(any_engine, "slow-sync", 1) == ["timed_out"]


# -- concurrency limits ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_three_processes_never_run_more_than_the_limit(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """30 instances, at most 2 at once across 3 processes, 0.3 s each: never 3 overlapping,
    all complete, and not serialized to one at a time."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[spans])
    args = ["--dialect", any_database.override] if any_database.override else []
    # A 2 s dead window: a spurious revival on a loaded machine would let a stale execution
    # run beside its rerun, which the limit does not count (it counts picked rows).
    workers = await asyncio.gather(
        *(
            Worker.start("limited", any_database.url, "--poll", "0.2", "--heartbeat", "0.5", *args)
            for _ in range(3)
        )
    )
    control = job_registry().connection_provider(any_engine).with_job(Export()).build()
    try:
        began = time.monotonic()
        await control.client.schedule_many("export", [(f"e{i:02d}", None, None) for i in range(30)])

        async def finished() -> bool:
            async with any_engine.connect() as conn:
                return len((await conn.execute(select(spans.c.instance))).all()) >= 30

        await wait_until(finished, timeout=60, what="30 exports")
        wall = time.monotonic() - began
    finally:
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0]
    async with any_engine.connect() as conn:
        rows = (await conn.execute(select(spans.c.instance, spans.c.started, spans.c.ended))).all()
    assert sorted(r.instance for r in rows) == [f"e{i:02d}" for i in range(30)], "ran twice"
    events = sorted([(r.started, 1) for r in rows] + [(r.ended, -1) for r in rows])
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    assert most <= 2, f"{most} exports ran at once"
    assert most == 2, "the limit was never used"
    assert wall < 30 * 0.3, f"serialized: {wall:.1f} s for 30 x 0.3 s at 2 at a time"


class Export(OneTimeJob):
    def name(self) -> str:
        return "export"

    async def execute(self, ctx: ExecutionContext) -> None:  # runs in the workers only
        raise AssertionError("the control registry never runs jobs")


class Tenant(OneTimeJob):
    """At most one per tenant at once (the key is the part before ':')."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.done = 0

    def name(self) -> str:
        return "tenant"

    def max_concurrency(self) -> int:
        return 1

    def concurrency_key(self, task_instance: str) -> str:
        return task_instance.split(":")[0]

    async def execute(self, ctx: ExecutionContext) -> None:
        key = ctx.task_instance.split(":")[0]
        self.running[key] = self.running.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.running[key])
        await asyncio.sleep(0.05)
        self.running[key] -= 1
        self.done += 1


async def test_a_limit_per_key_lets_other_keys_run(any_registries: RegistryFactory) -> None:
    job = Tenant()
    a = await any_registries.start(job)
    await any_registries.start(job)
    instances = [(f"{tenant}:{n}", None, None) for tenant in "abc" for n in range(4)]
    await a.client.schedule_many("tenant", instances)
    await wait_until(lambda: job.done == 12, timeout=20, what="every tenant's work")
    assert job.most == {"a": 1, "b": 1, "c": 1}


async def test_a_revived_dead_execution_frees_its_place(
    any_registries: RegistryFactory, any_engine: AsyncEngine, any_database: Database
) -> None:
    class One(OneTimeJob):
        def __init__(self) -> None:
            self.ran: list[str] = []

        def name(self) -> str:
            return "one"

        def max_concurrency(self) -> int:
            return 1

        async def execute(self, ctx: ExecutionContext) -> None:
            self.ran.append(ctx.task_instance)

    now = "UTC_TIMESTAMP(6)" if any_database.is_mysql else "now()"
    old = (
        "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
        if any_database.is_mysql
        else "now() - interval '1 hour'"
    )
    async with any_engine.begin() as conn:  # a dead instance holds the only place
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                f"picked_by, last_heartbeat, version, priority) VALUES ('one', 'held', {now}, "
                f"true, 'gone', {old}, 3, 0)"
            )
        )
    job = One()
    registry = await any_registries.start(job)
    await registry.client.schedule("one", "next")
    await wait_until(lambda: sorted(job.ran) == ["held", "next"], timeout=15, what="both ran")


def test_limits_and_overrides_are_checked_at_build() -> None:
    class Recurring(DistributedJob):
        def name(self) -> str:
            return "r"

        def schedule(self) -> Schedule:
            return Schedules.fixed_delay(timedelta(minutes=1))

        def execute(self, ctx: ExecutionContext) -> None:
            pass

    class Bad(OneTimeJob):
        def name(self) -> str:
            return "bad"

        def max_concurrency(self) -> int:
            return 0

        def execute(self, ctx: ExecutionContext) -> None:
            pass

    url = "postgresql+asyncpg://nobody@127.0.0.1:1/nowhere"
    with pytest.raises(ConfigurationError, match=r"Bad.max_concurrency\(\) must be a positive"):
        job_registry().connection_provider(url).with_job(Bad()).build()
    with pytest.raises(ConfigurationError, match=r"names 'nope'.*registered jobs: r"):
        (
            job_registry()
            .connection_provider(url)
            .with_job(Recurring())
            .customize_scheduler(lambda b: b.job_override("nope", timeout=timedelta(seconds=1)))
            .build()
        )
    with pytest.raises(ConfigurationError, match="r is a recurring job"):
        (
            job_registry()
            .connection_provider(url)
            .with_job(Recurring())
            .customize_scheduler(lambda b: b.job_override("r", max_concurrency=2))
            .build()
        )
    registry = (
        job_registry()
        .connection_provider(url)
        .with_job(Recurring())
        .customize_scheduler(lambda b: b.job_override("r", timeout=timedelta(seconds=5)))
        .build()
    )
    assert registry.scheduler.limits["r"].timeout == timedelta(seconds=5)


# -- try_cluster_lock ----------------------------------------------------------------------------


async def test_try_cluster_lock_is_held_by_one_caller_at_a_time(any_database: Database) -> None:
    engine = create_async_engine(any_database.url)
    try:
        async with try_cluster_lock(engine, "nightly-reindex") as first:
            async with try_cluster_lock(engine, "nightly-reindex") as second:
                assert (first, second) == (True, False)
            async with try_cluster_lock(engine, "another-name") as other:
                assert other is True
        async with try_cluster_lock(engine, "nightly-reindex") as again:
            assert again is True, "released at the end of the block"
    finally:
        await engine.dispose()


async def test_a_cluster_lock_belongs_to_its_database(
    any_database: Database, request: pytest.FixtureRequest
) -> None:
    """Two applications on one server, each in its own database, never hold each other's
    locks: PostgreSQL's advisory locks are the database's, and MySQL/MariaDB's lock names (the
    server's) carry the database. Before, two databases of one MariaDB server shared
    ``ekbatan:<name>``: the racing test below, run on two databases at once, saw both of its
    racers refused."""
    async with sibling_database(request, any_database) as other_url:
        here, there = create_async_engine(any_database.url), create_async_engine(other_url)
        try:
            async with (
                try_cluster_lock(here, "nightly-reindex") as first,
                try_cluster_lock(there, "nightly-reindex") as elsewhere,
            ):
                assert (first, elsewhere) == (True, True)
            if any_database.is_mysql:  # the locks that count a limited job's executions
                async with here.connect() as a, there.connect() as b:
                    held = await take_locks(a, ["scheduled_tasks:job"], seconds=0)
                    elsewhere_held = await take_locks(b, ["scheduled_tasks:job"], seconds=0)
                    assert elsewhere_held != []
                    await release_locks(b, elsewhere_held)
                    await release_locks(a, held)
        finally:
            await here.dispose()
            await there.dispose()


_RACER = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from ekbatan_fastapi import try_cluster_lock

async def main():
    engine = create_async_engine(sys.argv[1])
    async with engine.connect():  # the pool keeps it: the race starts connected
        pass
    print("READY", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # GO
    async with try_cluster_lock(engine, "race") as acquired:
        print("ACQUIRED" if acquired else "REFUSED", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # held until both racers answered
    await engine.dispose()

asyncio.run(main())
"""


@pytest.mark.multiprocess
def test_two_processes_racing_on_one_name_exactly_one_acquires(any_database: Database) -> None:
    """Two processes, both connected, are told GO together; whichever wins holds the lock
    until both have answered, so exactly one ACQUIRED however the two are scheduled."""
    with contextlib.ExitStack() as stack:
        racers = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", _RACER, any_database.url],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=ROOT,
                    text=True,
                )
            )
            for _ in range(2)
        ]
        stack.callback(lambda: [racer.kill() for racer in racers if racer.poll() is None])
        pipes = [(racer.stdin, racer.stdout) for racer in racers]
        for _, out in pipes:
            assert out is not None and out.readline().strip() == "READY"
        for into, _ in pipes:
            assert into is not None
            into.write("GO\n")
            into.flush()
        answers = sorted(out.readline().strip() for _, out in pipes if out is not None)
        for into, _ in pipes:
            assert into is not None
            into.write("END\n")
            into.flush()
        assert [racer.wait(timeout=60) for racer in racers] == [0, 0]
    assert answers == ["ACQUIRED", "REFUSED"]
