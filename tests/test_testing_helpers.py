"""ekbatan_fastapi.testing: run_job, build_jobs and the TimeMachine, on real databases."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    CatchUp,
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    OneTimeJob,
    Schedule,
    Schedules,
)
from ekbatan_fastapi.testing import HeartbeatState, TimeMachine, build_jobs, run_job
from ekbatan_fastapi.web import create_ekbatan_lifespan

from .conftest import Database
from .helpers import db_now

SLOT = datetime(2026, 3, 11, 2, 0, tzinfo=UTC)


class Nightly(DistributedJob):
    """A daily job at 02:00 that remembers what it was told."""

    def __init__(self, catch_up: CatchUp | None = None, name: str = "nightly") -> None:
        self._name = name
        self._catch_up = catch_up or CatchUp.latest()
        self.seen: list[ExecutionContext] = []
        self.threads: list[str] = []

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return Schedules.daily(time(2, 0))

    def catch_up(self) -> CatchUp:
        return self._catch_up

    async def execute(self, ctx: ExecutionContext) -> None:
        self.seen.append(ctx)


class SyncJob(Nightly):
    def execute(self, ctx: ExecutionContext) -> None:  # type: ignore[override]
        self.seen.append(ctx)
        self.threads.append(threading.current_thread().name)


class Invoice(OneTimeJob):
    def __init__(self, fail_times: int = 0) -> None:
        self.seen: list[ExecutionContext] = []
        self.fail_times = fail_times

    def name(self) -> str:
        return "invoice"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.seen.append(ctx)
        if len(self.seen) <= self.fail_times:
            raise RuntimeError(f"attempt {len(self.seen)} failed")


class Broken(Nightly):
    async def execute(self, ctx: ExecutionContext) -> None:
        raise ValueError("the report service is down")


# -- run_job without a database ------------------------------------------------------------


async def test_run_job_gives_the_slot_data_and_instance() -> None:
    job = Nightly()
    ctx = await run_job(job, execution_time=SLOT, data={"tenant": 7})
    assert job.seen == [ctx]
    assert (ctx.task_name, ctx.task_instance, ctx.execution_time) == ("nightly", "recurring", SLOT)
    assert ctx.data == {"tenant": 7}
    assert ctx.idempotency_key == ("nightly", "recurring", SLOT)
    assert not ctx.is_shutting_down and not ctx.is_timed_out


async def test_run_job_one_time_instance_and_failures() -> None:
    job = Invoice()
    ctx = await run_job(job, data=[1, 2], consecutive_failures=3)
    assert (ctx.task_instance, ctx.data, ctx.consecutive_failures) == ("test", [1, 2], 3)
    ctx = await run_job(job, instance="order-42")
    assert ctx.task_instance == "order-42"
    assert ctx.execution_time.tzinfo is not None


async def test_run_job_shutdown_and_heartbeat_state_are_settable() -> None:
    flipped: list[bool] = []

    class Windown(Nightly):
        async def execute(self, ctx: ExecutionContext) -> None:
            flipped.append(ctx.is_shutting_down)
            stop.append(True)
            flipped.append(ctx.is_shutting_down)
            flipped.append(ctx.heartbeat_state.has_stale_heartbeat)

    stop: list[bool] = []
    heartbeat = HeartbeatState(timedelta(seconds=10), timedelta(seconds=60), failed_heartbeats=2)
    ctx = await run_job(
        Windown(), shutting_down=lambda: bool(stop), heartbeat=heartbeat, timed_out=True
    )
    assert flipped == [False, True, True]
    assert ctx.heartbeat_state is heartbeat and ctx.is_timed_out


async def test_run_job_runs_a_plain_def_in_a_worker_thread() -> None:
    job = SyncJob()
    await run_job(job, execution_time=SLOT)
    assert job.seen[0].execution_time == SLOT
    assert job.threads[0] != threading.current_thread().name


async def test_run_job_lets_the_jobs_exception_through() -> None:
    with pytest.raises(ValueError, match="report service is down"):
        await run_job(Broken())


async def test_run_job_without_database_says_transaction_needs_one() -> None:
    class Transactional(Nightly):
        async def execute(self, ctx: ExecutionContext) -> None:
            async with ctx.transaction():
                pass

    with pytest.raises(ConfigurationError, match=r"run_job\(job, database=\.\.\.\)") as error:
        await run_job(Transactional())
    assert "nightly/recurring" in str(error.value)


async def test_run_job_backfilled_slot_keeps_the_recurring_key() -> None:
    ctx = await run_job(Nightly(), execution_time=SLOT, is_backfill=True)
    assert ctx.is_backfill and ctx.task_instance.startswith("backfill:")
    assert ctx.idempotency_key == ("nightly", "recurring", SLOT)


async def test_run_job_refuses_a_naive_slot() -> None:
    with pytest.raises(ConfigurationError, match="aware datetime"):
        await run_job(Nightly(), execution_time=datetime(2026, 3, 11, 2, 0))


# -- run_job with a database ---------------------------------------------------------------


class Report(DistributedJob):
    """Writes one report row per slot inside ctx.transaction()."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def name(self) -> str:
        return "report"

    def schedule(self) -> Schedule:
        return Schedules.daily(time(2, 0))

    async def execute(self, ctx: ExecutionContext) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(
                text("INSERT INTO reports (slot) VALUES (:slot)"),
                {"slot": ctx.execution_time.isoformat()},
            )
            if self.fail:
                raise RuntimeError("rolled back")


async def _reports(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return [r[0] for r in await conn.execute(text("SELECT slot FROM reports"))]


@pytest.fixture
async def reports_engine(any_engine: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    async with any_engine.begin() as conn:
        await conn.execute(text("CREATE TABLE reports (slot VARCHAR(40) PRIMARY KEY)"))
    yield any_engine


async def test_run_job_transaction_commits_on_the_database(
    any_database: Database, reports_engine: AsyncEngine
) -> None:
    ctx = await run_job(
        Report(), execution_time=SLOT, database=any_database.url, dialect=any_database.override
    )
    assert await _reports(reports_engine) == [SLOT.isoformat()]
    assert ctx.version == 2  # the claim's (inserted as 1)
    async with reports_engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT picked, execution_time FROM scheduled_tasks WHERE task_name = 'report'"
                )
            )
        ).one()
        outcomes = [
            r[0] for r in await conn.execute(text("SELECT outcome FROM ekbatan_execution_history"))
        ]
    assert not row[0]
    next_time = row[1].replace(tzinfo=UTC)  # the next slot after now, at 02:00
    assert next_time > datetime.now(UTC) and (next_time.hour, next_time.minute) == (2, 0)
    assert outcomes == ["succeeded"]


async def test_run_job_transaction_rolls_back_and_raises(
    any_database: Database, reports_engine: AsyncEngine
) -> None:
    with pytest.raises(RuntimeError, match="rolled back"):
        await run_job(
            Report(fail=True),
            execution_time=SLOT,
            database=reports_engine,
            dialect=any_database.override,
        )
    assert await _reports(reports_engine) == []
    async with reports_engine.connect() as conn:
        failures = (
            await conn.execute(text("SELECT consecutive_failures, picked FROM scheduled_tasks"))
        ).one()
    assert tuple(failures) in ((1, False), (1, 0))


# -- build_jobs ----------------------------------------------------------------------------


class Greeter:
    def __init__(self, word: str) -> None:
        self.word = word


closed: list[str] = []


async def get_greeter() -> AsyncIterator[Greeter]:
    yield Greeter("real")


async def fake_greeter() -> AsyncIterator[Greeter]:
    yield Greeter("fake")
    closed.append("fake")


class Greet(DistributedJob):
    def __init__(self, greeter: Annotated[Greeter, Depends(get_greeter)]) -> None:
        self.greeter = greeter
        self.said: list[str] = []

    def name(self) -> str:
        return "greet"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.said.append(self.greeter.word)


async def test_build_jobs_applies_dependency_overrides_without_a_scheduler() -> None:
    app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[Greet], discover=False))
    app.dependency_overrides[get_greeter] = fake_greeter
    async with build_jobs(app) as jobs:
        assert list(jobs) == ["greet"]
        job = jobs["greet"]
        assert isinstance(job, Greet)
        await run_job(job)
        assert job.said == ["fake"]
        assert closed == []
    assert closed == ["fake"]  # the generator provider was torn down with the block


async def test_build_jobs_of_an_app_without_our_lifespan_takes_jobs() -> None:
    app = FastAPI()
    async with build_jobs(app, jobs=[Greet], discover=False) as jobs:
        job = jobs["greet"]
        assert isinstance(job, Greet) and job.greeter.word == "real"


async def test_build_jobs_refuses_two_jobs_of_one_name() -> None:
    app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[Nightly(), SyncJob()], discover=False))
    with pytest.raises(ConfigurationError, match="two jobs are named 'nightly'"):
        async with build_jobs(app):
            pass


# -- TimeMachine ---------------------------------------------------------------------------

START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


async def test_time_machine_runs_a_daily_slot_once_when_time_reaches_it(
    any_database: Database,
) -> None:
    job = Nightly()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        assert await db_now(tm.engine) == START  # the database's clock is the machine's
        assert await tm.run_due() == []
        await tm.advance(to=SLOT - timedelta(seconds=1))
        assert await tm.run_due() == []
        await tm.advance(to=SLOT)
        ran = await tm.run_due()
        assert [(r.task_name, r.execution_time, r.outcome) for r in ran] == [
            ("nightly", SLOT, "succeeded")
        ]
        assert [ctx.execution_time for ctx in job.seen] == [SLOT]
        assert await tm.run_due() == []
        history = await tm.client.history("nightly")
        assert [h.execution_time for h in history] == [SLOT]
        assert await db_now(tm.engine) == SLOT


async def test_time_machine_catch_up_policies_over_missed_days(any_database: Database) -> None:
    latest, every = Nightly(), Nightly(CatchUp.all(5), name="every")
    async with TimeMachine(
        [latest, every], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.advance(to=SLOT + timedelta(days=2, hours=1))
        ran = await tm.run_due()
        assert [r.execution_time for r in ran if r.task_name == "every"] == [
            SLOT,
            SLOT + timedelta(days=1),
            SLOT + timedelta(days=2),
        ]
        assert len([r for r in ran if r.task_name == "nightly"]) == 1


async def test_time_machine_one_time_task_runs_once_when_due(any_database: Database) -> None:
    job = Invoice()
    at = START + timedelta(hours=3)
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        assert await tm.schedule("invoice", "order-1", at, {"amount": 12})
        assert await tm.run_due() == []
        await tm.advance(by=timedelta(hours=2, minutes=59))
        assert await tm.run_due() == []
        await tm.advance(to=at)
        ran = await tm.run_due()
        assert [(r.task_instance, r.execution_time) for r in ran] == [("order-1", at)]
        assert job.seen[0].data == {"amount": 12}
        await tm.advance(by=timedelta(days=1))
        assert await tm.run_due() == []
        assert len(job.seen) == 1


async def test_time_machine_failed_one_time_task_retries_at_its_time(
    any_database: Database,
) -> None:
    job = Invoice(fail_times=1)
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.schedule("invoice", "order-2")
        ran = await tm.run_due()
        assert [r.outcome for r in ran] == ["failed"]
        assert isinstance(ran[0].error, RuntimeError)
        await tm.advance(by=timedelta(minutes=4, seconds=59))
        assert await tm.run_due() == []
        await tm.advance(by=timedelta(seconds=1))  # RetryLater(5 minutes), the default
        assert [r.outcome for r in await tm.run_due()] == ["succeeded"]


async def test_time_machine_revives_a_crashed_instances_execution(
    any_database: Database,
) -> None:
    job = Invoice()
    async with TimeMachine(
        [job], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        await tm.schedule("invoice", "order-3")
        store = tm.registry.store
        assert await store.tasks.claim_now("invoice", "order-3", "crashed-peer") is not None
        assert await tm.run_due() == []  # picked elsewhere, heartbeat fresh
        dead_after = tm.registry.config.dead_after
        await tm.advance(by=dead_after - timedelta(seconds=1))
        assert await tm.run_due() == []
        await tm.advance(by=timedelta(seconds=2))
        assert [(r.task_instance, r.outcome) for r in await tm.run_due()] == [
            ("order-3", "succeeded")
        ]
        assert [ctx.picked_by for ctx in job.seen] == ["time-machine"]


async def test_time_machine_runs_ctx_transaction_at_its_time(any_database: Database) -> None:
    async with TimeMachine(
        [Report()], any_database.url, start=START, dialect=any_database.override
    ) as tm:
        async with tm.engine.begin() as conn:
            await conn.execute(text("CREATE TABLE reports (slot VARCHAR(40) PRIMARY KEY)"))
        await tm.advance(to=SLOT)
        assert [r.outcome for r in await tm.run_due()] == ["succeeded"]
        assert await _reports(tm.engine) == [SLOT.isoformat()]
        history = await tm.client.history("report")
        assert [(h.execution_time, h.outcome) for h in history] == [(SLOT, "succeeded")]


async def test_time_machine_refuses_going_back_and_naive_times(database_url: str) -> None:
    async with TimeMachine([Nightly()], database_url, start=START) as tm:
        with pytest.raises(ConfigurationError, match="forward only"):
            await tm.advance(to=START - timedelta(seconds=1))
        with pytest.raises(ConfigurationError, match="aware"):
            await tm.advance(to=datetime(2026, 3, 11))
    with pytest.raises(ConfigurationError, match="database URL"):
        TimeMachine([Nightly()], create_async_engine(database_url), start=START)


async def test_time_machine_leaves_the_real_clock_to_other_connections(
    database_url: str,
) -> None:
    async with TimeMachine([Nightly()], database_url, start=START):
        other = create_async_engine(database_url)
        try:
            assert abs(await db_now(other) - datetime.now(UTC)) < timedelta(minutes=5)
        finally:
            await other.dispose()
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            schemas = await conn.execute(
                text("SELECT 1 FROM pg_namespace WHERE nspname = 'ekbatan_testing_clock'")
            )
            assert schemas.all() == []  # removed on exit
    finally:
        await engine.dispose()


def test_importing_testing_does_not_import_fastapi() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ekbatan_fastapi.testing; "
        "assert 'fastapi' not in sys.modules and 'starlette' not in sys.modules"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)


def test_docs_show_the_example_verbatim() -> None:
    root = Path(__file__).resolve().parent
    doc = (root.parent / "docs" / "testing.md").read_text()
    for name, imported in (
        ("docs_example_jobs.py", ("", "")),
        (
            "test_docs_testing_example.py",
            ("from .docs_example_jobs import", "from app.jobs import"),
        ),
    ):
        code = (root / name).read_text().split('"""', 2)[2].strip("\n")
        assert code.replace(*imported) in doc, f"docs/testing.md no longer shows tests/{name}"
