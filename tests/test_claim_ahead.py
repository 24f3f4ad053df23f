"""``claim_ahead``: rows due within the lead are claimed before their time and each starts at
its own time (every dialect); a stop releases the rows it holds that have not started; a bad
value, or a dialect without it, is refused with the value and the fix."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, OneTimeJob, scheduled_tasks
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.domain.rows import PollingStrategy
from ekbatan_fastapi.engine.config import SchedulerConfig
from ekbatan_fastapi.engine.execution import Execution
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.postgresql.tasks import PostgresTaskStore

from .conftest import Database
from .helpers import Polls, RegistryFactory, db_now, wait_until

T = scheduled_tasks


class StampJob(OneTimeJob):
    """Records when each instance started, by this machine's clock."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[datetime, datetime]] = {}

    def name(self) -> str:
        return "stamp"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.started[ctx.task_instance] = (datetime.now(UTC), ctx.execution_time)


def _ahead(seconds: float) -> object:
    lead = timedelta(seconds=seconds)
    return lambda b: b.claim_ahead(lead)


async def _picked(engine: AsyncEngine, instance: str) -> bool:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(T.c.picked).where(T.c.task_instance == instance))
        ).one_or_none()
    return bool(row and row.picked)


async def _schedule_two_seconds_ahead(
    registries: RegistryFactory, engine: AsyncEngine, job: StampJob, instances: list[str]
) -> datetime:
    """Start an instance claiming 3 s ahead, and schedule ``instances`` 2 s from now."""
    registry = await registries.start(job, poll=5.0, customize=_ahead(3.0))
    at = await db_now(engine) + timedelta(seconds=2)
    await registry.client.schedule_many("stamp", [(i, at, None) for i in instances])
    return at


# -- settings and validation ---------------------------------------------------------------


def test_the_setting_takes_an_iso_duration_and_defaults_to_zero() -> None:
    assert EkbatanSettings().jobs.claim_ahead == timedelta(0)
    assert EkbatanSettings(jobs={"claim-ahead": "PT0.2S"}).jobs.claim_ahead == timedelta(
        milliseconds=200
    )


@pytest.mark.parametrize(
    ("value", "says"), [("PT11S", "PT0S to PT10S"), ("-PT1S", "negative duration")]
)
def test_a_lead_out_of_range_is_refused_with_the_range(value: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"claim-ahead.*{says}"):
        EkbatanSettings(jobs={"claim-ahead": value})


@pytest.mark.parametrize("value", [timedelta(seconds=-1), timedelta(seconds=11), 0.2])
def test_the_scheduler_config_refuses_a_bad_lead(value: object) -> None:
    config = SchedulerConfig(claim_ahead=value)  # type: ignore[arg-type]
    # the rule the settings apply too (one per setting): the range, or the type it takes
    says = r"claim_ahead(: .*\(allowed: PT0S to PT10S\)| must be a datetime.timedelta)"
    with pytest.raises(ConfigurationError, match=says):
        config.validate()


def test_a_dialect_that_cannot_claim_ahead_refuses_a_lead_naming_the_fix(
    registries: RegistryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every built-in dialect claims ahead: a third-party task store without it is refused
    monkeypatch.setattr(PostgresTaskStore, "supports_claim_ahead", False)
    with pytest.raises(ConfigurationError, match=r"claim_ahead \(0.2 s\) .*postgresql.*PT0S"):
        registries.build(StampJob(), customize=_ahead(0.2))  # refused when built, not started
    assert registries.made == []


async def test_a_store_that_cannot_claim_ahead_refuses_a_poll_with_a_lead(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PostgresTaskStore, "supports_claim_ahead", False)
    tasks = open_store(engine, "postgresql").tasks
    with pytest.raises(ValueError, match=r"ahead=PT1S.*timedelta\(0\)"):
        await tasks.poll(["stamp"], 10, "me", PollingStrategy.FETCH, ahead=timedelta(seconds=1))


# -- the poll statement ----------------------------------------------------------------------


# one name, a few (MySQL/MariaDB: one index range per name), more than PER_NAME_MAX (the scan)
MANY = ["stamp", *(f"other-{i}" for i in range(150))]


@pytest.mark.parametrize("skip_paused", [False, True], ids=["", "pause-filter"])
@pytest.mark.parametrize(
    "names", [["stamp"], ["stamp", "other"], MANY], ids=["one-name", "two-names", "151-names"]
)
@pytest.mark.parametrize("strategy", list(PollingStrategy))
async def test_a_poll_with_a_lead_claims_what_comes_due_within_it(
    any_engine: AsyncEngine,
    any_database: Database,
    strategy: PollingStrategy,
    names: list[str],
    skip_paused: bool,
) -> None:
    if strategy not in any_database.strategies:
        pytest.skip(f"{any_database.id} has no {strategy}")
    tasks = open_store(any_engine, any_database.dialect).tasks
    now = await db_now(any_engine)
    soon, later = now + timedelta(seconds=5), now + timedelta(seconds=30)
    async with any_engine.begin() as conn:
        await conn.execute(
            insert(T),
            [
                {"task_name": "stamp", "task_instance": i, "execution_time": at}
                | {"picked": False, "version": 1, "priority": 0}
                for i, at in (("soon", soon), ("later", later))
            ],
        )
    plain = await tasks.poll(names, 50, "me", strategy, skip_paused=skip_paused)
    assert plain.claimed == [] and plain.next_due == soon
    lead = timedelta(seconds=10)
    ahead = await tasks.poll(names, 50, "me", strategy, skip_paused=skip_paused, ahead=lead)
    assert [r.task_instance for r in ahead.claimed] == ["soon"]
    assert ahead.claimed[0].picked_by == "me"
    # the next due time is the first one beyond the lead's reach
    assert ahead.next_due == later


# -- the scheduler -------------------------------------------------------------------------------


async def test_a_row_is_claimed_before_its_time_and_starts_at_it(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = StampJob()
    at = await _schedule_two_seconds_ahead(any_registries, any_engine, job, ["one"])
    # claimed (picked) while its time is still ahead, but not run yet
    await wait_until(lambda: _picked(any_engine, "one"), 5, "the row claimed ahead")
    claimed_at = await db_now(any_engine)
    assert claimed_at < at and "one" not in job.started
    await wait_until(lambda: "one" in job.started, 5, "the execution")
    started, slot = job.started["one"]
    assert slot == at
    assert started >= at, f"started {at - started} before its time"

    async def deleted() -> bool:
        async with any_engine.connect() as conn:
            found = await conn.execute(select(T).where(T.c.task_instance == "one"))
            return found.first() is None

    await wait_until(deleted, 5, "the one-time row deleted once it succeeded")


async def test_a_stop_releases_the_rows_it_claimed_ahead_without_running_them(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = StampJob()
    registry = await any_registries.start(job, poll=5.0, shutdown=30.0, customize=_ahead(8.0))
    at = await db_now(any_engine) + timedelta(seconds=6)
    await registry.client.schedule("stamp", "held", at)
    await wait_until(lambda: _picked(any_engine, "held"), 5, "the row claimed ahead")
    began = time.monotonic()
    await registry.stop()
    assert time.monotonic() - began < 5, "the stop waited for a row that had not started"
    assert job.started == {}
    async with any_engine.connect() as conn:
        row = (await conn.execute(select(T).where(T.c.task_instance == "held"))).one()
    assert not row.picked and row.picked_by is None
    assert row.execution_time == at  # released at its own time, for another instance


async def test_two_instances_claiming_ahead_run_each_slot_once(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    jobs = [StampJob(), StampJob()]
    polls = [Polls(), Polls()]
    for job, seen in zip(jobs, polls, strict=True):
        # both poll often: MySQL/MariaDB have no notifications to wake the other
        await any_registries.start(
            job,
            poll=0.2,
            customize=lambda b, seen=seen: b.observer(seen).claim_ahead(timedelta(seconds=0.5)),
        )
    now = await db_now(any_engine)
    at = [now + timedelta(milliseconds=300 + 10 * i) for i in range(40)]
    client = any_registries.made[0].client
    for i, when in enumerate(at):
        await client.schedule("stamp", f"i{i}", when)
    await wait_until(lambda: sum(len(j.started) for j in jobs) >= 40, 10, "40 executions")
    for seen in polls:  # each instance looked again: a second claim of a row would show now
        await seen.next(1)
    ran = [set(j.started) for j in jobs]
    assert not ran[0] & ran[1], "an instance ran twice"
    assert ran[0] | ran[1] == {f"i{i}" for i in range(40)}
    for job in jobs:
        for started, slot in job.started.values():
            assert started >= slot


async def test_a_row_claimed_ahead_waits_for_this_machines_clock_when_the_estimate_runs_ahead(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """The estimate of the database's clock runs ahead of this machine's (a statement's send
    time taken before a blocked event loop let it go): a row the estimate calls due, claimed
    before its time by this machine's clock, is still held until then."""
    job = StampJob()
    registry = await any_registries.start(job, poll=0.05, customize=_ahead(0.1))
    link = registry.scheduler.link
    observed = link.observed

    def ahead(db_now: datetime, sent: datetime | None = None) -> None:
        observed(db_now, sent)
        link.offset += timedelta(milliseconds=300)

    link.observed = ahead  # type: ignore[method-assign]
    now = await db_now(any_engine)
    at = [now + timedelta(milliseconds=300 + 40 * i) for i in range(10)]
    await registry.client.schedule_many("stamp", [(f"e{i}", t, None) for i, t in enumerate(at)])
    await wait_until(lambda: len(job.started) >= 10, 10, "10 executions")
    early = {i: slot - started for i, (started, slot) in job.started.items() if started < slot}
    assert not early, f"started before their time by this machine's clock: {early}"


class OneAtATime(StampJob):
    """At most one running at once, cluster-wide; each records its start and end."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[float, float]] = []

    def max_concurrency(self) -> int:
        return 1

    async def execute(self, ctx: ExecutionContext) -> None:
        began = time.monotonic()
        await super().execute(ctx)
        await asyncio.sleep(0.1)
        self.spans.append((began, time.monotonic()))


async def test_a_limited_job_counts_the_rows_it_holds_ahead(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = OneAtATime()
    at = await _schedule_two_seconds_ahead(any_registries, any_engine, job, ["a", "b"])
    # one row is held ahead; the other waits for the place, which the held row takes
    await wait_until(lambda: _any_picked(any_engine), 5, "a row held ahead")
    assert await db_now(any_engine) < at, "held after its time, not ahead of it"
    assert [await _picked(any_engine, i) for i in ("a", "b")].count(True) == 1
    await wait_until(lambda: len(job.spans) == 2, 10, "both executions")
    (_, first_ended), (second_began, _) = sorted(job.spans)
    assert first_ended <= second_began, "the two ran at once"
    for started, slot in job.started.values():
        assert started >= slot


async def _any_picked(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return (await conn.execute(select(T.c.task_instance).where(T.c.picked))).first() is not None


async def test_a_held_row_whose_start_raises_is_given_back(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """A row claimed ahead whose slot cannot be decided when its time comes: it is no longer
    held (nor heartbeated) but unpicked, and the rows held with it run."""
    job = StampJob()
    registry = registries.build(job, poll=5.0, customize=_ahead(3.0))
    executor = registry.scheduler.executor
    prepare = executor._prepare

    def fails_for_b(execution: Execution) -> bool:
        if execution.row.task_instance == "b":
            raise RuntimeError("deciding the slot of b failed")
        return prepare(execution)

    executor._prepare = fails_for_b  # type: ignore[method-assign]
    await registry.start()
    assert await registry.wait_until_ready(10)
    at = await db_now(engine) + timedelta(seconds=1)
    await registry.client.schedule_many("stamp", [(i, at, None) for i in ("a", "b", "c")])
    await wait_until(lambda: len(job.started) == 2, what="a and c run at their time")
    executions = registry.scheduler.executions
    await wait_until(lambda: not executions.by_key, what="nothing held")
    await wait_until(lambda: _unpicked(engine, "b"), what="b given back")
    assert set(job.started) == {"a", "c"} and executions.executing == 0


async def _unpicked(engine: AsyncEngine, instance: str) -> bool:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(T.c.picked).where(T.c.task_instance == instance))
        ).one_or_none()
    return row is not None and not row.picked


async def test_a_held_row_asked_to_stop_does_not_run_when_its_time_comes(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """``cancel_running`` reaches a row claimed ahead (picked, waiting for its time): the
    job is not started at its time (it used to run to the end, recorded as succeeded, only
    ``ctx.cancel_requested`` saying it was asked), the one-time task is removed, and the
    history says cancelled."""
    job = StampJob()
    at = await _schedule_two_seconds_ahead(registries, engine, job, ["held"])
    await wait_until(lambda: _picked(engine, "held"), 5, "the row claimed ahead")
    registry = registries.made[-1]
    await registry.client.cancel_running("stamp", "held", "not wanted")
    await registry.scheduler.housekeeper.stop_requested()  # its heartbeat round's read
    assert await db_now(engine) < at, "the machine was too slow to ask before its time"

    async def gone() -> bool:
        async with engine.connect() as conn:
            found = await conn.execute(select(T).where(T.c.task_instance == "held"))
            return found.first() is None

    await wait_until(gone, 5, "the cancelled task removed")
    assert "held" not in job.started
    records = await registry.client.history("stamp", limit=10)
    assert [r.outcome for r in records] == ["cancelled"]
    assert "not wanted" in (records[0].error_message or "")
