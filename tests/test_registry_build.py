"""``build()`` validates everything, names the offending value, and opens no connection."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from ekbatan_fastapi import (
    ConfigurationError,
    ExecutionContext,
    Job,
    OneTimeJob,
    PollingStrategy,
    Schedules,
    job_registry,
)

from .helpers import CountingJob, RecordingJob

UNREACHABLE = "postgresql+asyncpg://nobody:secret@127.0.0.1:1/nowhere"


def build(*jobs: Job, url: Any = UNREACHABLE, customize: Any = None) -> Any:
    builder = job_registry().connection_provider(url).with_jobs(jobs)
    if customize is not None:
        builder.customize_scheduler(customize)
    return builder.build()


def test_build_opens_no_connection_and_reads_the_dialect_from_the_url() -> None:
    registry = build(RecordingJob("a", Schedules.fixed_delay(timedelta(seconds=1))))
    assert registry.engine.pool.checkedin() + registry.engine.pool.checkedout() == 0
    assert registry.store.tasks.dialect_name == "postgresql"
    assert registry.scheduler.polling_strategy == PollingStrategy.LOCK_AND_FETCH
    assert registry.config.missed_heartbeats_limit == 6
    assert registry.config.polling_interval == timedelta(seconds=10)
    assert registry.config.heartbeat_interval == timedelta(seconds=10)
    assert registry.config.shutdown_max_wait == timedelta(minutes=30)
    assert registry.config.delete_unresolved_after == timedelta(days=14)
    assert registry.scheduler.batch_size == 50
    assert len(registry.config.scheduler_name) <= 50


def test_plain_postgresql_url_uses_asyncpg() -> None:
    registry = build(CountingJob(), url="postgresql://u@localhost/db")
    assert registry.engine.url.drivername == "postgresql+asyncpg"


def test_customize_scheduler_runs_last_and_overrides() -> None:
    registry = (
        job_registry()
        .connection_provider(UNREACHABLE)
        .with_job(CountingJob())
        .customize_scheduler(lambda b: b.polling_interval(timedelta(seconds=3)))
        .poll_interval(timedelta(seconds=10))
        .customize_scheduler(
            lambda b: (
                b.missed_heartbeats_limit(8)
                .delete_unresolved_after(timedelta(days=30))
                .polling_strategy("fetch")
                .batch_size(7)
                .scheduler_name("node-a")
            )
        )
        .build()
    )
    assert registry.config.polling_interval == timedelta(seconds=3)
    assert registry.config.missed_heartbeats_limit == 8
    assert registry.config.dead_after == timedelta(seconds=80)
    assert registry.scheduler.polling_strategy == "fetch"
    assert registry.scheduler.batch_size == 7
    assert registry.scheduler.name == "node-a"


class Named(OneTimeJob):
    def __init__(self, name: Any) -> None:
        self._name = name

    def name(self) -> str:
        return self._name  # type: ignore[no-any-return]

    async def execute(self, ctx: ExecutionContext) -> None:
        return None


@pytest.mark.parametrize(
    ("jobs", "customize", "url", "message"),
    [
        ((Named("a"), Named("a")), None, UNREACHABLE, "two jobs are named 'a'"),
        ((Named(""),), None, UNREACHABLE, "name() must return 1 to 100 characters"),
        ((Named("x" * 101),), None, UNREACHABLE, "1 to 100 characters"),
        ((Named(42),), None, UNREACHABLE, "got 42"),
        ((CountingJob,), None, UNREACHABLE, "got the class CountingJob"),
        (("not a job",), None, UNREACHABLE, "is not a DistributedJob or OneTimeJob"),
        ((), lambda b: b.missed_heartbeats_limit(3), UNREACHABLE, "missed_heartbeats_limit"),
        ((), lambda b: b.polling_interval("10s"), UNREACHABLE, "polling_interval must be"),
        ((), lambda b: b.heartbeat_interval(timedelta(0)), UNREACHABLE, "heartbeat_interval"),
        ((), lambda b: b.polling_strategy("magic"), UNREACHABLE, "polling_strategy 'magic'"),
        ((), lambda b: b.batch_size(0), UNREACHABLE, "batch_size must be"),
        ((), lambda b: b.scheduler_name("n" * 51), UNREACHABLE, "scheduler_name must be"),
        ((), lambda b: b.table_name("x; DROP TABLE y"), UNREACHABLE, "not a plain SQL identifier"),
        ((), lambda b: b.dialect("oracle"), UNREACHABLE, "dialect 'oracle' is not supported"),
        (
            (),
            None,
            "sqlite+aiosqlite:///x.db",
            "unsupported database URL scheme 'sqlite+aiosqlite'",
        ),
        ((), None, "postgresql+psycopg2://u:pw@h/db", "supported: postgresql+asyncpg://"),
        ((), None, "not a url", "cannot parse database URL"),
        ((), None, 42, "connection_provider takes a database URL"),
        ((), None, None, "no database configured"),
    ],
)
def test_bad_input_raises_a_clear_error(jobs: Any, customize: Any, url: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        build(*jobs, url=url, customize=customize)


def test_errors_never_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        build(url="postgresql+psycopg2://u:hunter2@h/db")
    assert "hunter2" not in str(info.value)
