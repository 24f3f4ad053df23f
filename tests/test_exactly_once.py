"""Exactly-once effects in the jobs database: ``ctx.transaction()`` commits the job's effects
with its slot's completion; a superseded execution commits nothing; ``client.schedule(...,
connection=)`` enqueues inside the caller's transaction. On every database."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    ExecutionSuperseded,
    OneTimeJob,
    RetryLater,
    Schedule,
    SchedulerObserver,
    Schedules,
)
from ekbatan_fastapi.domain.rows import TaskKey

from .conftest import Database
from .helpers import Polls, RegistryFactory, wait_until

effects_meta = MetaData()
effects = Table(
    "settlements",
    effects_meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_name", String(100), nullable=False),
    Column("task_instance", String(100), nullable=False),
    Column("slot", String(40), nullable=False),
    Column("version", Integer, nullable=False),
)


@pytest.fixture
async def effect_table(any_engine: AsyncEngine) -> AsyncEngine:
    async with any_engine.begin() as conn:
        await conn.run_sync(effects_meta.create_all)
    return any_engine


def _effect(ctx: ExecutionContext) -> Any:
    return insert(effects).values(
        task_name=ctx.task_name,
        task_instance=ctx.task_instance,
        slot=ctx.execution_time.isoformat(),
        version=ctx.fencing_token,
    )


async def _effect_rows(engine: AsyncEngine) -> list[tuple[str, str, str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(effects.c.task_name, effects.c.task_instance, effects.c.slot, effects.c.version)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def _history(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT task_instance, outcome FROM ekbatan_execution_history ORDER BY id")
        )
        return [(r[0], r[1]) for r in rows]


async def _history_of(engine: AsyncEngine, count: int) -> list[tuple[str, str]]:
    """The history once it holds ``count`` records (MySQL/MariaDB write it off the hot path,
    within about 100 ms)."""

    async def written() -> bool:
        return len(await _history(engine)) >= count

    await wait_until(written, what=f"{count} history records")
    return await _history(engine)


class Writes(SchedulerObserver):
    """Remembers the results the completer wrote (``ctx.transaction()`` writes none)."""

    def __init__(self) -> None:
        self.keys: list[TaskKey] = []

    def results_written(self, items: Any, recorded: Any, error: Any, seconds: float) -> None:
        self.keys += [i.owned.key for i in items]


@pytest.fixture
def writes() -> Writes:
    return Writes()


class Settle(OneTimeJob):
    """Writes one effect row per execution inside ``ctx.transaction()``; ``body`` runs in the
    block after the effect."""

    def __init__(
        self, body: Callable[[ExecutionContext, Any], Awaitable[None]] | None = None
    ) -> None:
        self.body = body
        self.outcomes: list[str] = []
        self.tokens: list[int] = []

    def name(self) -> str:
        return "settle"

    def failure_handler(self) -> RetryLater:
        return RetryLater(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.tokens.append(ctx.fencing_token)
        try:
            async with ctx.transaction() as conn:
                await conn.execute(_effect(ctx))
                if self.body is not None:
                    await self.body(ctx, conn)
        except ExecutionSuperseded:
            self.outcomes.append("superseded")
            raise
        except Exception:
            self.outcomes.append("failed")
            raise
        self.outcomes.append("committed")


async def test_effects_and_the_completion_commit_in_one_transaction(
    any_registries: RegistryFactory, effect_table: AsyncEngine, writes: Writes
) -> None:
    job = Settle()
    registry = await any_registries.start(job, customize=lambda b: b.observer(writes))
    await registry.client.schedule("settle", "inv-1")
    await wait_until(lambda: job.outcomes == ["committed"], what="the committed block")
    await wait_until(lambda: not registry.scheduler.running, what="settled")
    assert [(n, i) for n, i, _, _ in await _effect_rows(effect_table)] == [("settle", "inv-1")]
    assert await registry.client.get("settle", "inv-1") is None, "the one-time row is deleted"
    assert await _history(effect_table) == [("inv-1", "succeeded")]
    assert ("settle", "inv-1") not in writes.keys, "the completer wrote nothing more"


class Recurring(DistributedJob):
    def __init__(self) -> None:
        self.slots: list[datetime] = []

    def name(self) -> str:
        return "nightly"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(milliseconds=200))

    async def execute(self, ctx: ExecutionContext) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(_effect(ctx))
        self.slots.append(ctx.execution_time)


async def test_a_recurring_job_moves_to_its_next_slot_in_the_same_transaction(
    any_registries: RegistryFactory, effect_table: AsyncEngine
) -> None:
    job = Recurring()
    registry = await any_registries.start(job)
    await wait_until(lambda: len(job.slots) >= 3, what="three slots")
    await registry.stop()
    rows = await _effect_rows(effect_table)
    slots = [s for _, _, s, _ in rows]
    assert len(slots) == len(set(slots)) >= 3, "one effect per slot"
    row = await registry.client.get("nightly", "recurring")
    assert row is not None and not row.picked and row.consecutive_failures == 0
    assert row.last_success is not None
    assert row.execution_time > max(job.slots)


async def test_an_exception_in_the_block_rolls_back_and_fails_as_usual(
    any_registries: RegistryFactory, effect_table: AsyncEngine
) -> None:
    async def boom(ctx: ExecutionContext, conn: Any) -> None:
        raise RuntimeError("the invoice service said no")

    job = Settle(boom)
    registry = await any_registries.start(job)
    await registry.client.schedule("settle", "inv-2")
    await wait_until(lambda: job.outcomes == ["failed"], what="the failed block")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    assert await _effect_rows(effect_table) == [], "rolled back"
    task = await registry.client.get("settle", "inv-2")
    assert task is not None and task.consecutive_failures == 1 and not task.picked
    assert await _history_of(effect_table, 1) == [("inv-2", "failed")]


async def test_a_superseded_execution_commits_nothing_and_says_so(
    any_registries: RegistryFactory, effect_table: AsyncEngine, any_database: Database
) -> None:
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def wait(ctx: ExecutionContext, conn: Any) -> None:
        inside.set()
        await go_on.wait()

    job = Settle(wait)
    registry = await any_registries.start(job)
    await registry.client.schedule("settle", "inv-3")
    await asyncio.wait_for(inside.wait(), 10)
    # Another instance revives the row meanwhile (its claim bumps the version) and completes
    # the slot: the stale execution's guarded completion now matches nothing.
    async with effect_table.begin() as conn:
        await conn.execute(
            text(
                "UPDATE scheduled_tasks SET version = version + 1, picked_by = 'the-other' "
                "WHERE task_name = 'settle'"
            )
        )
    go_on.set()
    await wait_until(lambda: job.outcomes == ["superseded"], what="ExecutionSuperseded")
    await wait_until(lambda: not registry.scheduler.running, what="settled")
    assert await _effect_rows(effect_table) == [], "nothing of the stale execution committed"

    assert await _history_of(effect_table, 1) == [("inv-3", "superseded")]


class SessionSettle(OneTimeJob):
    def __init__(self, engine: AsyncEngine, *, session: bool) -> None:
        self.engine = engine
        self.session = session
        self.done = asyncio.Event()

    def name(self) -> str:
        return "session-settle"

    async def execute(self, ctx: ExecutionContext) -> None:
        if self.session:
            async with AsyncSession(self.engine) as session, ctx.transaction(session) as s:
                await s.execute(_effect(ctx))
        else:
            async with self.engine.connect() as conn, ctx.transaction(conn) as c:
                assert c is conn
                await c.execute(_effect(ctx))
        self.done.set()


@pytest.mark.parametrize("session", [True, False], ids=["AsyncSession", "AsyncConnection"])
async def test_the_applications_own_session_or_connection(
    any_registries: RegistryFactory,
    effect_table: AsyncEngine,
    any_database: Database,
    session: bool,
) -> None:
    app_engine = create_async_engine(any_database.url)  # the application's own pool
    try:
        job = SessionSettle(app_engine, session=session)
        registry = await any_registries.start(job)
        await registry.client.schedule("session-settle", "s1")
        await asyncio.wait_for(job.done.wait(), 10)
        await wait_until(lambda: not registry.scheduler.running, what="settled")
        assert len(await _effect_rows(effect_table)) == 1
        assert await registry.client.get("session-settle", "s1") is None
    finally:
        await app_engine.dispose()


async def test_a_session_on_another_database_is_refused_naming_both(
    any_registries: RegistryFactory,
) -> None:
    other = create_async_engine("postgresql+asyncpg://app:s3cret@elsewhere:6543/billing")
    errors: list[BaseException] = []

    class Elsewhere(OneTimeJob):
        def name(self) -> str:
            return "elsewhere"

        async def execute(self, ctx: ExecutionContext) -> None:
            try:
                async with ctx.transaction(AsyncSession(other)):
                    pass
            except ConfigurationError as error:
                errors.append(error)

    registry = await any_registries.start(Elsewhere())
    await registry.client.schedule("elsewhere", "x")
    await wait_until(lambda: bool(errors), what="the refusal")
    message = str(errors[0])
    assert "elsewhere:6543/billing" in message and registry.engine.url.database in message
    assert "s3cret" not in message and "app@" not in message
    await other.dispose()


async def test_transaction_is_once_per_execution_and_async_only(
    any_registries: RegistryFactory,
) -> None:
    seen: list[str] = []

    class Twice(OneTimeJob):
        def name(self) -> str:
            return "twice"

        async def execute(self, ctx: ExecutionContext) -> None:
            async with ctx.transaction():
                pass
            try:
                ctx.transaction()
            except ConfigurationError as error:
                seen.append(str(error))

    class Threaded(OneTimeJob):
        def name(self) -> str:
            return "threaded"

        def execute(self, ctx: ExecutionContext) -> None:
            try:
                ctx.transaction()
            except TypeError as error:
                seen.append(str(error))

    registry = await any_registries.start(Twice(), Threaded())
    await registry.client.schedule("twice", "a")
    await registry.client.schedule("threaded", "b")
    await wait_until(lambda: len(seen) == 2, what="both refusals")
    assert any("once per execution" in s for s in seen)
    assert any("async def execute" in s for s in seen)


async def test_the_fencing_token_grows_with_every_claim(
    any_registries: RegistryFactory, effect_table: AsyncEngine
) -> None:
    async def boom(ctx: ExecutionContext, conn: Any) -> None:
        raise RuntimeError("again")

    job = Settle(boom)
    registry = await any_registries.start(job)
    await registry.client.schedule("settle", "f")
    await wait_until(lambda: len(job.tokens) == 1, what="the first run")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    await registry.client.run_now("settle", "f")
    await wait_until(lambda: len(job.tokens) == 2, what="the second run")
    assert job.tokens[1] > job.tokens[0]


# -- a row locked by a completion that never commits ---------------------------------------------


async def test_a_row_held_between_completion_and_commit_stalls_nobody(
    any_registries: RegistryFactory, any_engine: AsyncEngine, any_database: Database
) -> None:
    """A process stopped after its completion statement, before COMMIT, holds the row's lock:
    the other instances' heartbeats, polls and dead-execution checks go on (they skip the
    locked row), and the slot is revived once the lock goes."""
    from .helpers import RecordingJob

    held_job = RecordingJob("held", Schedules.fixed_delay(timedelta(hours=1)))
    ticks = RecordingJob("ticks", Schedules.fixed_delay(timedelta(milliseconds=50)))
    is_mysql = any_database.is_mysql
    now_sql = "UTC_TIMESTAMP(6)" if is_mysql else "now()"
    past = "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR" if is_mysql else "now() - interval '1 hour'"
    async with any_engine.begin() as conn:
        for name in ("held", "gone"):
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, "
                    "picked, picked_by, last_heartbeat, version, priority) VALUES "
                    f"(:n, 'recurring', {now_sql}, true, 'frozen', {past}, 5, 0)"
                ),
                {"n": name},
            )
    gone_job = RecordingJob("gone", Schedules.fixed_delay(timedelta(hours=1)))
    holder: AsyncConnection = await any_engine.connect()
    try:
        await holder.begin()
        completion = await holder.execute(
            text(
                "UPDATE scheduled_tasks SET picked = false, picked_by = NULL, version = 6 "
                "WHERE task_name = 'held' AND task_instance = 'recurring' AND version = 5"
            )
        )
        assert completion.rowcount == 1  # the frozen process's completion, not committed
        registry = await any_registries.start(held_job, ticks, gone_job)
        # the other dead row is revived and runs, the other job runs, heartbeats flow
        await wait_until(lambda: len(gone_job.slots) == 1, timeout=15, what="the other revival")
        await wait_until(lambda: len(ticks.slots) >= 5, what="other work")
        assert held_job.slots == []
        assert registry.status().database_reachable is True
    finally:
        await holder.rollback()  # the lock goes (the server ended the frozen transaction)
        await holder.close()
    await wait_until(lambda: len(held_job.slots) == 1, timeout=15, what="the held slot revived")


# -- enqueue inside the caller's transaction -------------------------------------------------------


class Receipt(OneTimeJob):
    def __init__(self) -> None:
        self.runs: list[str] = []

    def name(self) -> str:
        return "send-receipt"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs.append(ctx.task_instance)


@pytest.mark.parametrize("session", [False, True], ids=["AsyncConnection", "AsyncSession"])
async def test_enqueue_inside_the_callers_transaction(
    any_registries: RegistryFactory, any_engine: AsyncEngine, any_database: Database, session: bool
) -> None:
    job = Receipt()
    # a long polling interval: only the commit's wake-up (or the due time) starts the run
    polls = Polls()
    registry = await any_registries.start(job, poll=0.5, customize=lambda b: b.observer(polls))

    async def enqueue(name: str, commit: bool) -> None:
        if session:
            async with AsyncSession(any_engine) as s:
                await registry.client.schedule("send-receipt", name, connection=s)
                await (s.commit() if commit else s.rollback())
            return
        async with any_engine.connect() as conn:
            await conn.begin()
            await registry.client.schedule("send-receipt", name, connection=conn)
            await registry.client.schedule_many(
                "send-receipt", [(f"{name}-b", None, None)], connection=conn
            )
            await (conn.commit() if commit else conn.rollback())

    await enqueue("rolled-back", commit=False)
    await enqueue("committed", commit=True)
    await wait_until(lambda: "committed" in job.runs, what="the committed enqueue")
    assert await polls.next(1) == 0
    assert "rolled-back" not in job.runs and job.runs.count("committed") == 1
    assert await registry.client.get("send-receipt", "rolled-back") is None


async def test_reschedule_inside_the_callers_transaction(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = Receipt()
    registry = await any_registries.start(job)
    later = datetime.now(UTC) + timedelta(hours=1)
    await registry.client.schedule("send-receipt", "r", at=later)
    async with any_engine.connect() as conn:
        await conn.begin()
        await registry.client.reschedule(
            "send-receipt", "r", datetime.now(UTC) + timedelta(hours=2), connection=conn
        )
        await conn.rollback()
    task = await registry.client.get("send-receipt", "r")
    assert task is not None and abs(task.execution_time - later) < timedelta(seconds=1)


async def test_connection_on_another_database_is_refused(any_registries: RegistryFactory) -> None:
    registry = any_registries.build(Receipt())
    other = create_async_engine("mysql+asyncmy://root:pw@otherhost:3307/shop")
    async with AsyncSession(other) as session:
        with pytest.raises(ConfigurationError, match="otherhost:3307/shop"):
            await registry.client.schedule("send-receipt", "x", connection=session)
    await other.dispose()
