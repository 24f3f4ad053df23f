"""Bad input, property-based: job names and instance ids (quotes, SQL fragments, unicode,
surrogates, NUL, very long strings) through the client against a real database.

Only the documented exceptions come out (``ConfigurationError`` for a name that can never be
stored, ``UnknownJobError``, ``TaskNotFoundError``, ``TaskPickedError``); a stored name reads
back exactly as written (no SQL is ever built from input: bound parameters only); the
scheduler keeps running every other task. Runs on every available database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    JobRegistry,
    Schedule,
    Schedules,
    TaskNotFoundError,
    TaskPickedError,
    UnknownJobError,
    job_registry,
    scheduled_tasks,
)
from ekbatan_fastapi.client import MAX_NAME_LENGTH

from .conftest import Database
from .helpers import CountingJob, RecordingJob, RegistryFactory, examples, wait_until

SQL_BITS = [
    "'",
    '"',
    ";",
    "--",
    "/*",
    "*/",
    "\\",
    "%",
    "%s",
    "%(name)s",
    "_",
    "$1",
    ":name",
    "?",
    "{t}",
    "`",
    "DROP TABLE scheduled_tasks",
    "' OR '1'='1",
    "\x00",
    "\ud800",
    "\u2028",
    " ",
    "\t",
    "ß",
    "İ",
    "ﬁ",
    "😀",
    "\u0301",
]
NASTY = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=MAX_NAME_LENGTH + 5),
    st.lists(st.sampled_from(SQL_BITS), min_size=1, max_size=12).map("".join),
    st.text(min_size=MAX_NAME_LENGTH - 2, max_size=MAX_NAME_LENGTH + 2),
    st.text("😀ßİ'\"", min_size=MAX_NAME_LENGTH - 1, max_size=MAX_NAME_LENGTH + 1),
)
DOCUMENTED = (ConfigurationError, UnknownJobError, TaskNotFoundError, TaskPickedError)
FAR = datetime(2100, 1, 1, tzinfo=UTC)


def _storable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return 0 < len(name) <= MAX_NAME_LENGTH and "\x00" not in name and bool(name.strip())


@pytest.fixture
async def running(any_registries: RegistryFactory) -> AsyncIterator[JobRegistry]:
    """A started registry with a one-time job ``count`` and a recurring job ``tick``."""
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=100)))
    yield await any_registries.start(CountingJob(), tick)


async def _table_rows(registry: JobRegistry) -> int:
    async with registry.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(scheduled_tasks))).one()[0])


@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(instance=NASTY)
async def test_instance_ids_are_stored_exactly_or_refused(
    running: JobRegistry, instance: str
) -> None:
    client = running.client
    try:
        created = await client.schedule("count", instance, FAR, {"echo": instance[:10]})
    except ConfigurationError as error:
        assert not _storable(instance), f"{instance!r} was refused: {error}"
        assert "instance id" in str(error)
        return
    assert _storable(instance), f"{instance!r} should have been refused"
    assert created
    task = await client.get("count", instance)
    assert task is not None and task.task_instance == instance
    assert [t.task_instance for t in await client.list("count")] == [instance]
    await client.reschedule("count", instance, FAR + timedelta(days=1))
    await client.cancel("count", instance)
    assert await client.get("count", instance) is None
    with pytest.raises(TaskNotFoundError):
        await client.cancel("count", instance)


@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=NASTY)
async def test_unknown_job_names_get_documented_errors_only(
    running: JobRegistry, name: str
) -> None:
    client = running.client
    calls = [
        client.schedule(name, "i", FAR),
        client.reschedule(name, "i", FAR),
        client.run_now(name, "i"),
        client.cancel(name, "i"),
        client.pause(name),
        client.resume(name),
        client.history(name),
    ]
    for call in calls:
        with contextlib.suppress(*DOCUMENTED):
            await call
    if _storable(name):
        assert await client.get(name, "i") is None
        assert await client.list(name) == []


async def test_the_scheduler_keeps_running_after_bad_input(
    running: JobRegistry, any_database: Database
) -> None:
    """After the client refused junk, every other task still runs and no loop restarted."""
    client = running.client
    for junk in ["\ud800", "x" * 101, "", " ", "\x00", "'; DROP TABLE scheduled_tasks; --"]:
        with contextlib.suppress(ConfigurationError):
            await client.schedule("count", junk)
    await client.schedule("count", "after-the-junk")
    count = running.jobs["count"]
    assert isinstance(count, CountingJob)
    await wait_until(lambda: count.runs["after-the-junk"] == 1, what="a normal run")
    tick = running.jobs["tick"]
    assert isinstance(tick, RecordingJob)
    seen = len(tick.slots)
    await wait_until(lambda: len(tick.slots) > seen + 2, what="the recurring job")
    status = running.status()
    assert status.loop_restarts == 0 and status.database_reachable is True
    assert await _table_rows(running) >= 1  # the table is still there


class NamedJob(DistributedJob):
    def __init__(self, name: str) -> None:
        self._name = name
        self.slots: list[datetime] = []

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=100))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.slots.append(ctx.execution_time)


@settings(max_examples=examples(300), deadline=None)
@given(name=NASTY)
def test_job_names_are_checked_when_the_registry_is_built(name: str) -> None:
    builder = job_registry().connection_provider("postgresql+asyncpg://u@127.0.0.1/db")
    try:
        registry = builder.with_job(NamedJob(name)).build()
    except ConfigurationError as error:
        assert not _storable(name), f"{name!r} was refused: {error}"
        return
    assert _storable(name), f"{name!r} should have been refused"
    assert list(registry.jobs) == [name]


NASTY_JOB_NAMES = [
    "'; DROP TABLE scheduled_tasks; --",
    "q\"uote's",
    "{t}%s%(x)s$1:name?",
    "ünïcødé ✓ 😀",
    "x" * MAX_NAME_LENGTH,
    "😀" * MAX_NAME_LENGTH,
]


async def test_recurring_jobs_with_nasty_names_run_on_the_scheduler(
    any_registries: RegistryFactory, any_database: Database
) -> None:
    jobs = [NamedJob(name) for name in NASTY_JOB_NAMES]
    registry = await any_registries.start(*jobs)
    await wait_until(lambda: all(len(job.slots) >= 2 for job in jobs), what="every nasty job")
    rows = {t.task_name for t in await registry.client.list()}
    assert rows == set(NASTY_JOB_NAMES)
    assert registry.status().loop_restarts == 0


@settings(max_examples=examples(200), deadline=None)
@given(name=NASTY)
def test_scheduler_names_are_checked_when_the_registry_is_built(name: str) -> None:
    """The scheduler name is written into ``picked_by`` (50 characters) by every claim."""
    builder = (
        job_registry()
        .connection_provider("postgresql+asyncpg://u@127.0.0.1/db")
        .with_job(CountingJob())
        .customize_scheduler(lambda b: b.scheduler_name(name))
    )
    try:
        registry = builder.build()
    except ConfigurationError as error:
        assert not (_storable(name) and len(name) <= 50), f"{name!r} was refused: {error}"
        return
    assert _storable(name) and len(name) <= 50, f"{name!r} should have been refused"
    assert registry.status().name == name
