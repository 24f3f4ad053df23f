"""Real deployments, each with its real component: PgBouncer (Debian's, in transaction mode, a
server pool far smaller than the clients), a private PostgreSQL 15 primary with its
``pg_basebackup -R`` replica (frozen, fenced read-only, promoted), MariaDB, and a proxy that
delays or swallows answers. Each test pins a problem a probe of such a deployment found (see
docs/deployment.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from bench.servers import Bouncer, Pair, have_pg15, have_pgbouncer, pgbouncer, primary_and_replica
from ekbatan_fastapi import (
    ConfigurationError,
    ExecutionContext,
    OneTimeJob,
    Schedules,
    create_schema,
    job_registry,
)
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.store.connection import ConnectionProvider
from ekbatan_fastapi.store.migrate import available_migrations
from ekbatan_fastapi.web.lifespan import build_registry
from tests.chaos.cluster import Proxy

from .conftest import fresh_mysql_database
from .helpers import RecordingJob, RegistryFactory, fail_writes, wait_until

_ROOT = Path(__file__).resolve().parent.parent
_URL_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL"


class Once(OneTimeJob):
    """A one-time job that records the instances it ran."""

    def __init__(self, name: str = "once", seconds: float = 0.0) -> None:
        self._name = name
        self.seconds = seconds
        self.done: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    def name(self) -> str:
        return self._name

    async def execute(self, ctx: ExecutionContext) -> None:
        await self.release.wait()
        await asyncio.sleep(self.seconds)
        self.done.append(ctx.task_instance)


@pytest.fixture
def bouncer(postgres_server_url: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode, 2 server connections per database."""
    if not have_pgbouncer():
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    with pgbouncer(postgres_server_url, mode="transaction", pool_size=2) as running:
        yield running


@contextlib.asynccontextmanager
async def _pair_with_database(name: str = "app") -> AsyncIterator[Pair]:
    """A primary and its replica, with a database holding the library's tables on both."""
    if not have_pg15():
        pytest.skip("needs PostgreSQL 15's binaries in /usr/lib/postgresql/15/bin")
    with contextlib.ExitStack() as stack:
        pair = await asyncio.to_thread(stack.enter_context, primary_and_replica())
        await asyncio.to_thread(pair.primary.psql, f"CREATE DATABASE {name}")
        engine = create_async_engine(pair.primary_url(name), poolclass=NullPool)
        try:
            await create_schema(engine)
        finally:
            await engine.dispose()
        await asyncio.to_thread(pair.wait_replicated, name)
        try:
            yield pair
        finally:
            await asyncio.to_thread(pair.thaw)


def _jobs_settings(**jobs: object) -> dict[str, object]:
    return {"polling_interval": "PT0.2S", "heartbeat_interval": "PT0.1S", **jobs}


# -- 1. PgBouncer in transaction mode -------------------------------------------------------


async def test_pgbouncer_transaction_mode_works_from_the_pooler_setting_alone(
    database_url: str, engine: AsyncEngine, bouncer: Bouncer
) -> None:
    """Three instances through PgBouncer's transaction pooling with 2 server connections:
    with ``EKBATAN_JOBS__POOLER=pgbouncer-transaction`` (nothing else set) every instance
    becomes ready, runs recurring slots and one-time tasks, revives a dead execution, and
    reports no error. Before, asyncpg's statement names collided on the shared server
    connections (``prepared statement "__asyncpg_stmt_4__" already exists``)."""
    url = bouncer.url(database_url)
    # A 4 s dead window (40 missed heartbeats of 0.1 s): the planted dead row is 5 minutes old,
    # and on a loaded CI machine a heartbeat queued behind the 2 server connections for over
    # 1 s (the window of 10) had a live slot revived and run twice.
    settings = EkbatanSettings(
        jobs=_jobs_settings(pooler="pgbouncer-transaction", missed_heartbeats_limit=40),
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": url}}}]}]},
    )
    tick = RecordingJob("tick", Schedules.fixed_rate(timedelta(milliseconds=100)))
    once = Once()
    registries = [build_registry(settings, [tick, once]) for _ in range(3)]
    assert all(not r.config.listen for r in registries), "LISTEN is off behind the pooler"
    gone = datetime.now(UTC) - timedelta(minutes=5)
    async with engine.begin() as conn:  # a dead execution of a killed instance
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "picked_by, last_heartbeat, version) VALUES ('once', 'dead', :t, true, 'gone', "
                ":t, 3)"
            ),
            {"t": gone},
        )
    try:
        for registry in registries:
            await registry.start()
        for registry in registries:
            assert await registry.wait_until_ready(15), registry.status()
        await registries[0].client.schedule_many(
            "once", [(f"o{i}", None, None) for i in range(100)]
        )
        await wait_until(
            lambda: len(once.done) >= 101 and len(tick.slots) >= 10,
            timeout=30,
            what="the one-time tasks, the revived one and ten slots",
        )
        assert sorted(once.done) == sorted([*(f"o{i}" for i in range(100)), "dead"])
        assert len(set(tick.slots)) == len(tick.slots), "a slot ran twice"
        for registry in registries:
            status = registry.status()
            assert status.condition == "ok" and status.last_error is None, status
    finally:
        for registry in registries:
            await registry.stop()


@pytest.mark.slow
async def test_new_connections_through_transaction_pooling_do_not_stall_on_codecs(
    database_url: str, engine: AsyncEngine, bouncer: Bouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg looks up the codecs of some array types (the heartbeat's ``bigint[]``, the
    scheduling's ``bytea[]``, ...) on their first use on each connection: JIT off, its
    introspection query, JIT back on, as three statements outside any transaction. Behind
    transaction pooling those ran on different server connections whenever others were busy,
    and the server JIT-compiled the introspection query: 5-7 s on a loaded 2-core machine,
    one of the few server connections held, the first heartbeat of a new connection waiting
    (a chaos run lost 9 slots after a restart). Each new connection of the library's pool
    now looks them up at connect, in one transaction: one server connection, JIT off."""
    import asyncpg  # type: ignore[import-untyped]

    outside: list[list[int]] = []
    introspect = asyncpg.connection.Connection._introspect_types

    async def watched(self: Any, typeoids: Any, timeout: Any) -> Any:
        if not self.is_in_transaction():
            outside.append(list(typeoids))
        return await introspect(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.connection.Connection, "_introspect_types", watched)
    url = bouncer.url(database_url)
    provider = ConnectionProvider.from_url(url, pooler="pgbouncer-transaction", pool_size=6)
    busy = create_async_engine(url, poolclass=NullPool, connect_args={"statement_cache_size": 0})
    stop = asyncio.Event()

    async def keep_busy() -> None:  # the other clients, holding server connections in turn
        async with busy.connect() as conn:
            while not stop.is_set():
                await conn.execute(text("SELECT pg_sleep(0.01)"))
                await conn.commit()

    async def first_use() -> float:  # as the library's statements run: autocommit
        async with provider.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            began = time.monotonic()
            await conn.execute(
                text("SELECT count(*) FROM unnest(CAST(:v AS bigint[]), CAST(:d AS bytea[]))"),
                {"v": [1, 2], "d": [b"x"]},
            )
            return time.monotonic() - began

    others = [asyncio.create_task(keep_busy()) for _ in range(3)]
    try:
        took = await asyncio.gather(*(first_use() for _ in range(6)))
    finally:
        stop.set()
        await asyncio.gather(*others)
        await busy.dispose()
        await provider.dispose()
    assert outside == [], "asyncpg introspected types outside a transaction"
    assert max(took) < 2.0, f"a first use took {max(took):.2f}s"


async def test_without_the_pooler_setting_the_error_names_it(
    database_url: str, engine: AsyncEngine, bouncer: Bouncer
) -> None:
    """The same deployment with the library's defaults: the prepared-statement errors are
    shown as what they mean (condition ``pooler``, the database is reachable) with the setting
    that fixes them, not as "database unreachable"."""
    factory = RegistryFactory(bouncer.url(database_url))
    tick = RecordingJob("tick", Schedules.fixed_rate(timedelta(milliseconds=50)))
    try:
        registries = [factory.build(tick) for _ in range(2)]
        for registry in registries:
            await registry.start()

        def mismatch() -> bool:
            return any(r.status().condition == "pooler" for r in registries)

        await wait_until(mismatch, timeout=30, what="a prepared-statement error")
        status = next(r.status() for r in registries if r.status().condition == "pooler")
        assert status.database_reachable is True
        assert status.last_error is not None
        assert "EKBATAN_JOBS__POOLER=pgbouncer-transaction" in status.last_error
        assert status.last_error_at is not None
    finally:
        await factory.close()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ekbatan_fastapi.cli", *args]


@pytest.mark.multiprocess
async def test_migrate_through_pgbouncer_transaction_mode_again_and_at_once(
    database_url: str, postgres_server_url: str, bouncer: Bouncer
) -> None:
    """``ekbatan-jobs migrate`` through transaction pooling: three runs at once and a fourth
    afterwards all succeed (the second run used to fail with "cannot reach the database"),
    ``?statement_cache_size=0`` reaches asyncpg as a number, and no advisory lock is left on
    any server connection (``pg_advisory_lock`` leaked onto a pooled one and every later
    migrate hung)."""
    url = make_url(bouncer.url(database_url)).update_query_dict({"statement_cache_size": "0"})
    command = _cli(
        "--url", url.render_as_string(hide_password=False), "migrate", "--pooler",
        "pgbouncer-transaction", "--json",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("EKBATAN_")}

    async def run() -> tuple[int, str]:
        pipe = asyncio.subprocess.PIPE
        process = await asyncio.create_subprocess_exec(
            *command, cwd=_ROOT, env=env, stdout=pipe, stderr=pipe
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode or 0, (out + err).decode()

    results = await asyncio.gather(run(), run(), run())
    results.append(await run())
    for code, output in results:
        assert code == 0, output
    admin = create_async_engine(database_url, poolclass=NullPool)
    try:
        async with admin.connect() as conn:
            held = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            )
            versions = await conn.scalar(text("SELECT count(*) FROM ekbatan_schema_migrations"))
    finally:
        await admin.dispose()
    assert held == 0, "an advisory lock outlived its migrate"
    assert versions == len(available_migrations("postgresql"))


def test_url_values_asyncpg_wants_as_numbers_are_converted() -> None:
    from ekbatan_fastapi.store.connection import ConnectionProvider

    provider = ConnectionProvider.from_url(
        "postgresql://app@db/app?statement_cache_size=0&command_timeout=7.5&timeout=2"
    )
    assert "statement_cache_size" not in provider.engine.url.query
    with pytest.raises(ConfigurationError, match="statement_cache_size='none' must be a number"):
        ConnectionProvider.from_url("postgresql://app@db/app?statement_cache_size=none")
    with pytest.raises(ConfigurationError, match="contradicts pooler"):
        ConnectionProvider.from_url(
            "postgresql://app@db/app?statement_cache_size=100", pooler="pgbouncer-transaction"
        )


def test_the_pooler_setting_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="pooler") as caught:
        EkbatanSettings(jobs={"pooler": "pgbouncer-statement"})
    assert "transaction mode" in str(caught.value)
    with pytest.raises(ConfigurationError, match="for PostgreSQL"):
        job_registry().connection_provider("mysql+asyncmy://u@db/app").customize_scheduler(
            lambda b: b.pooler("pgbouncer-transaction")
        ).build()


# -- 2. a multi-host URL whose primary freezes ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("connect", "statement"), [(1, 2), (3, 1)])
async def test_failover_with_a_frozen_primary_tries_the_next_host(
    connect: int, statement: int
) -> None:
    """``?host=A&host=B&target_session_attrs=read-write`` with A frozen (SIGSTOP: TCP accepts,
    nothing answers) and B promoted: scheduling resumes on B. asyncpg spent ``timeout`` as one
    budget over every host, so A used all of it, B was never tried, and nothing ran until A
    was killed. With a statement timeout shorter than the connect timeout (3, 1) every
    reconnect ended on A, cut short by the statement's bound, until the host an attempt was
    cut short on came to be tried last; and each idle connection of the pool to A spent a
    statement timeout of its own until the pool was distrusted after the first."""
    async with _pair_with_database() as pair:
        url = pair.url("app") + f"&timeout={connect}"
        factory = RegistryFactory(url)
        tick = RecordingJob("tick", Schedules.fixed_rate(timedelta(milliseconds=200)))
        try:
            registry = await factory.start(
                tick, customize=lambda b: b.statement_timeout(timedelta(seconds=statement))
            )
            await wait_until(lambda: len(tick.slots) >= 3, what="slots on the primary")
            await asyncio.to_thread(pair.freeze)
            await asyncio.to_thread(pair.promote)
            promoted = time.monotonic()
            before = len(tick.slots)
            await wait_until(lambda: len(tick.slots) >= before + 3, timeout=30, what="slots on B")
            print(f"resumed {time.monotonic() - promoted:.2f}s after the promotion")
            await wait_until(lambda: registry.status().condition == "ok", what="condition ok")
            # (a slot may run twice: asynchronous replication can lose the last completion)
        finally:
            await asyncio.to_thread(pair.thaw)
            await factory.close()


# -- 3. the listener after a fence to read-only ----------------------------------------------


@pytest.mark.slow
async def test_the_listener_follows_a_fence_to_read_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The old primary is fenced read-only and the replica promoted: the loops fail with
    SQLSTATE 25006 (shown as ``read-only``, the database reachable), their connections are
    replaced by connections to B, and then the LISTEN connection moves too: work scheduled
    on B wakes the instance at once, not at its next poll (30 s here). It used to stay on the
    old primary, deaf."""
    async with _pair_with_database() as pair:
        once = Once()
        factory = RegistryFactory(pair.url("app"))
        try:
            registry = await factory.start(
                once, poll=30.0, customize=lambda b: b.statement_timeout(timedelta(seconds=3))
            )
            other = job_registry().connection_provider(pair.url("app")).with_job(once).build()
            await asyncio.sleep(0.5)  # the listener holds its connection
            await other.client.schedule("once", "before")
            await wait_until(lambda: "before" in once.done, timeout=10, what="a notification")
            caplog.set_level(logging.ERROR, "ekbatan_fastapi.engine.poller")

            def read_only() -> bool:
                return any("read-only (SQLSTATE 25006)" in r.getMessage() for r in caplog.records)

            await asyncio.to_thread(pair.fence)
            await wait_until(read_only, timeout=10, what="the read-only error")
            await asyncio.to_thread(pair.promote)
            await wait_until(
                lambda: registry.status().condition == "ok", timeout=20, what="the loops on B"
            )
            await other.connection.dispose()
            await asyncio.sleep(0.5)  # the listener reconnects
            b_url = f"postgresql+asyncpg://postgres@127.0.0.1:{pair.replica.port}/app"
            on_b = job_registry().connection_provider(b_url).with_job(once).build()
            await on_b.client.schedule("once", "after")
            await on_b.connection.dispose()
            await wait_until(lambda: "after" in once.done, timeout=10, what="woken on B")
        finally:
            await factory.close()


# -- 4. MariaDB: an orphaned claim transaction ------------------------------------------------


async def test_mariadb_orphaned_transaction_is_ended_by_the_session_bound(
    mysql_server_url: str,
) -> None:
    """A session of the library's pool left idle inside a transaction that holds the job's
    row lock (a partition right after ``SELECT ... FOR UPDATE``): the server ends it after
    ``idle_transaction_timeout`` and scheduling goes on. Before, the lock stayed until
    ``wait_timeout`` (8 hours by default) and nothing ran."""
    async with fresh_mysql_database(mysql_server_url) as url:
        schema = create_async_engine(url, poolclass=NullPool)
        try:
            await create_schema(schema)
        finally:
            await schema.dispose()
        factory = RegistryFactory(url)
        tick = RecordingJob("tick", Schedules.fixed_rate(timedelta(milliseconds=100)))
        try:
            registry = await factory.start(
                tick, customize=lambda b: b.idle_transaction_timeout(timedelta(seconds=2))
            )
            await wait_until(lambda: len(tick.slots) >= 2, what="slots")
            sql = "SELECT @@innodb_lock_wait_timeout, @@idle_transaction_timeout"
            async with registry.engine.connect() as probe:
                bounds = (await probe.execute(text(sql))).one()
            assert tuple(bounds) == (2, 2)
            orphan = await registry.engine.connect()
            await orphan.begin()
            await orphan.execute(text("SELECT * FROM scheduled_tasks FOR UPDATE"))
            held = len(tick.slots)
            began = time.monotonic()
            await wait_until(lambda: len(tick.slots) >= held + 3, timeout=30, what="slots again")
            print(f"resumed {time.monotonic() - began:.2f}s after the orphan")
            with pytest.raises(Exception):  # noqa: B017 - the server ended the session
                await orphan.execute(text("SELECT 1"))
            await orphan.invalidate()
            await orphan.close()
        finally:
            await factory.close()


# -- 5. an orphaned claim of this instance ---------------------------------------------------


async def test_a_claim_whose_answer_was_lost_is_released_by_its_instance(
    database_url: str, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim's answer is delayed past ``statement_timeout``: the client gives up, the
    server has claimed the row for this instance, which does not run it. The instance
    releases it within a few heartbeats and runs it, long before the dead window (10 s
    here); before, nothing ran it until the dead window."""
    once = Once()
    control = job_registry().connection_provider(database_url).with_job(once).build()
    await control.client.schedule("once", "late")
    await control.connection.dispose()
    proxy = Proxy(database_url)
    await proxy.start()
    proxy.delay_answer(b"SET picked = true, picked_by", 3.0, skip=1)  # the Bind after the Parse
    factory = RegistryFactory(proxy.url)
    caplog.set_level(logging.WARNING, "ekbatan_fastapi.engine.housekeeper")
    try:
        await factory.start(
            once,
            customize=lambda b: b.statement_timeout(timedelta(seconds=1)).missed_heartbeats_limit(
                100
            ),
        )
        await wait_until(lambda: bool(proxy.matched), what="the claim")
        began = time.monotonic()
        await wait_until(lambda: once.done == ["late"], timeout=9, what="the released row")
        print(f"ran {time.monotonic() - began:.2f}s after the claim")
        assert any("which does not run it" in r.getMessage() for r in caplog.records)
    finally:
        await factory.close()
        await proxy.close()


async def test_a_poller_backing_off_after_a_failed_claim_is_not_claiming(
    registries: RegistryFactory,
) -> None:
    """Between a failed claim and the next try the poller only waits: it does not count as
    claiming then, so the housekeeper may release what the failed claim left picked (and
    /jobs may judge this instance's rows) while the claims keep failing."""
    registry = await registries.start(Once())
    scheduler = registry.scheduler
    failures = 0

    async def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        failures += 1
        raise OSError("the claim's answer was lost")

    scheduler.poller.tasks.poll = failing  # type: ignore[method-assign]
    scheduler.alarm.request_poll()
    await wait_until(lambda: failures >= 2, what="two failed claims")
    assert not scheduler.executions.claiming
    assert not scheduler.holdings().claiming
    assert scheduler.state.claim_failed_at is not None


async def test_jobs_shows_a_row_picked_by_this_instance_that_it_does_not_run(
    database_url: str, engine: AsyncEngine
) -> None:
    from ekbatan_fastapi.client.read_model import ReadModel

    factory = RegistryFactory(database_url)
    once = Once()
    try:
        registry = await factory.start(once, heartbeat=0.2)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, "
                    "picked, picked_by, last_heartbeat, version) VALUES ('once', 'orphan', now(), "
                    "true, :me, now() - interval '1 second', 2)"
                ),
                {"me": registry.scheduler.name},
            )
        scheduler = registry.scheduler
        model = ReadModel.of(registry.client, scheduler)

        def orphaned(report: Any) -> bool:
            return any("once/orphan is picked by this instance" in p for p in report.problems)

        # A claim in flight, or one answered while the rows were read: rows picked by this
        # instance may be that claim's, not orphans yet; the next report judges them.
        list_rows = registry.client.list

        async def launching_meanwhile(*args: Any, **kwargs: Any) -> Any:
            # an execution launched (and ended) while the rows were read
            scheduler.executions.launches += 1
            return await list_rows(*args, **kwargs)

        registry.client.list = launching_meanwhile  # type: ignore[method-assign]
        first = await model.report()
        assert first.problems == [], first.problems
        del registry.client.list
        for _ in range(50):  # the poller's own claims (every 0.2 s) defer a report too
            report = await model.report()
            if orphaned(report):
                break
        assert not report.healthy and orphaned(report), report.problems
    finally:
        await factory.close()


# -- 6. a stop with the database down --------------------------------------------------------


async def test_a_stop_with_the_database_down_fits_a_grace_period(
    database_url: str, engine: AsyncEngine
) -> None:
    """SIGTERM while the database is down and a result is unrecorded: the stop spends at most
    ``shutdown_results_wait`` on the database (the row stays picked and is revived later),
    however long ``shutdown_max_wait`` is. It used to wait for the database to come back."""
    proxy = Proxy(database_url)
    await proxy.start()
    once = Once()
    once.release.clear()
    factory = RegistryFactory(proxy.url)
    try:
        registry = await factory.start(
            once,
            shutdown=60.0,
            customize=lambda b: b.shutdown_results_wait(timedelta(seconds=1)),
        )
        await registry.client.schedule("once", "last")
        await wait_until(lambda: bool(registry.status().running), what="the execution")
        await proxy.cut()
        once.release.set()
        await wait_until(lambda: once.done == ["last"], what="the job's end")
        began = time.monotonic()
        await registry.stop()
        took = time.monotonic() - began
        # not a timing test: waiting for the database would take the 60 s shutdown_max_wait
        assert took < 30, f"the stop took {took:.1f}s"
    finally:
        await proxy.close()
        await factory.close()


# -- 7. status wording -----------------------------------------------------------------------


async def test_status_shows_the_current_condition_and_the_last_error_with_its_time(
    registries: RegistryFactory,
) -> None:
    once = Once()
    registry = await registries.start(once)
    back = fail_writes(registry.store.tasks)
    await registry.client.schedule("once", "a")
    await wait_until(lambda: registry.status().condition == "unreachable", what="the outage")
    assert registry.status().database_reachable is False
    back()
    await wait_until(lambda: registry.status().condition == "ok", what="the recovery")
    status = registry.status()
    assert status.database_reachable is True
    assert status.last_error is not None and "the database is away" in status.last_error
    assert status.last_error_at is not None and status.condition_since is not None
    assert status.last_error_at <= status.condition_since


async def test_a_pool_whose_server_went_silent_closes_within_its_bound(
    any_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``ConnectionProvider.dispose`` on a server that accepts and never answers (a frozen
    primary): the polite close would wait forever; after its timeout the connections left are
    closed at once (asyncpg waits for the server's answer to its Terminate; MySQL's COM_QUIT
    expects none). A harness that disposed a client's pool hung CI here."""
    from ekbatan_fastapi.store.connection import ConnectionProvider

    proxy = Proxy(any_database_url)
    await proxy.start()
    provider = ConnectionProvider.from_url(proxy.url, pool_size=2)
    try:
        async with provider.engine.connect() as a, provider.engine.connect() as b:
            for conn in (a, b):
                await conn.execute(text("SELECT 1"))
        await proxy.blackhole()
        caplog.set_level(logging.WARNING, "ekbatan_fastapi.store")
        began = time.monotonic()
        await provider.dispose(timeout=0.5)
        took = time.monotonic() - began
        assert took < 20, f"the dispose took {took:.1f}s"  # a polite close would never end
        if provider.dialect == "postgresql":  # MySQL's COM_QUIT expects no answer
            assert any("closed without waiting" in r.getMessage() for r in caplog.records)
    finally:
        await proxy.close()
