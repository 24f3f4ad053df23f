"""Capping an instance's connections (docs/deployment.md, "Sizing a fleet"): the pool the
library builds from a URL is the most it opens (``max_overflow`` 0), and with ``pool_size=1``
an instance runs on one connection: no LISTEN, which would hold it for good."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ekbatan_fastapi import Schedules, job_registry

from .conftest import Database
from .helpers import RecordingJob, wait_until


async def _connections(url: str) -> int:
    parsed = make_url(url)
    mysql = parsed.get_backend_name() in ("mysql", "mariadb")
    sql = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = :d AND ID <> "
        "CONNECTION_ID()"
        if mysql
        else "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
    )
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(sql), {"d": parsed.database})).scalar_one())
    finally:
        await engine.dispose()


async def test_an_instance_with_pool_size_1_runs_its_jobs_on_one_connection(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    builder = (
        job_registry()
        .connection_provider(any_database.url, pool_size=1)
        .with_jobs([job])
        .poll_interval(timedelta(seconds=0.2))
        .heartbeat_interval(timedelta(seconds=0.1))
        .shutdown_max_wait(timedelta(seconds=2))
    )
    dialect = any_database.dialect
    builder.customize_scheduler(lambda b: b.dialect(dialect))
    registry = builder.build()
    assert registry.config.listen is False  # it would hold the only connection
    await registry.start()
    try:
        assert await registry.wait_until_ready(30), registry.status()
        await wait_until(lambda: len(job.slots) >= 3, what="three runs on one connection")
        await any_engine.dispose()  # the fixture's own connections are not the instance's
        assert await _connections(any_database.url) <= 1
    finally:
        await registry.stop()


async def test_listen_stays_on_with_a_pool_of_two(any_database: Database) -> None:
    registry = (
        job_registry()
        .connection_provider(any_database.url, pool_size=2)
        .with_jobs([RecordingJob("tick", Schedules.fixed_delay(timedelta(seconds=1)))])
        .build()
    )
    assert registry.config.listen is True
    await registry.engine.dispose()
