"""The database clusters users run in production, started from Debian's packages by the tests
themselves: a Patroni 3 cluster (etcd, 3 PostgreSQL 15 nodes, HAProxy; ``bench/patroni.py``)
and a 3-node MariaDB Galera cluster (galera-4, multi-primary; ``bench/galera.py``).

Marked ``clusters``: the default test command leaves them out (``addopts``); ``.ci/run``
installs ``patroni etcd-server haproxy galera-4 rsync`` and runs ``pytest -m clusters``.
The chaos scenarios (``tests/chaos/clusters.py``, short versions) take about a minute each;
their long versions and figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.galera import GaleraCluster, galera_cluster, have_galera
from bench.patroni import have_patroni
from ekbatan_fastapi import create_schema, job_registry, try_cluster_lock
from ekbatan_fastapi.store.locks import GaleraLocksUnsupported
from ekbatan_fastapi.store.mysql.database import MySQLDatabase
from ekbatan_fastapi.store.mysql.tasks import cursor_transaction
from tests.chaos.clusters import IN_TESTS
from tests.chaos.run import run_scenario

from .helpers import CountingJob

pytestmark = [pytest.mark.clusters, pytest.mark.xdist_group("clusters")]

_NEEDS_PATRONI = "needs patroni, etcd-server, haproxy (apt-get install; .ci/run does)"
_NEEDS_GALERA = "needs galera-4, rsync and mariadb-server (apt-get install; .ci/run does)"


_OPEN: dict[str, str] = {}
"""Scenarios known to fail now and then (marked xfail, not strict), with the reason; none now:
``patroni-leader-frozen`` and ``galera-node-kill`` (seen failing in a local .ci/run on
2026-12-05 14:24 UTC) are fixed (issue 31)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=_OPEN[n], strict=False)) if n in _OPEN else n
        for n in IN_TESTS
    ],
)
async def test_cluster_scenario_keeps_its_promises(name: str, tmp_path: Path) -> None:
    """A planned switchover and a leader restart give no duplicate; a frozen leader loses
    nothing; Galera's write conflicts are retried, never logged as errors; a Galera node kill
    revives only the executions of the process whose node died."""
    if name.startswith("patroni") and not have_patroni():
        pytest.skip(_NEEDS_PATRONI)
    if name.startswith("galera") and not have_galera():
        pytest.skip(_NEEDS_GALERA)
    result = await run_scenario(name, short=True, database_url="", run_dir=tmp_path, verbose=False)
    assert result.ok, result.table


@pytest.fixture(scope="module")
def galera() -> Iterator[GaleraCluster]:
    if not have_galera():
        pytest.skip(_NEEDS_GALERA)
    with galera_cluster() as cluster:
        yield cluster


def _registry(url: str, *jobs: Any, **overrides: Any) -> Any:
    builder = job_registry().connection_provider(url).with_jobs(list(jobs))
    builder = builder.poll_interval(timedelta(milliseconds=100))

    def customize(b: Any) -> None:
        for name, values in overrides.items():
            b.job_override(name, **values)

    return builder.customize_scheduler(customize).build()


async def test_galera_commit_conflict_is_rolled_back_and_run_again(galera: GaleraCluster) -> None:
    """A transaction that loses Galera's certification fails at COMMIT with error 1213; the
    next attempt runs on the same connection after a real rollback (it raised
    PendingRollbackError before) and the conflict is counted."""
    other = create_async_engine(galera.url(0), poolclass=NullPool)
    async with other.begin() as conn:
        await conn.execute(text("CREATE TABLE conflict_t (id int PRIMARY KEY, v int)"))
        await conn.execute(text("INSERT INTO conflict_t VALUES (1, 0)"))
    registry = _registry(galera.url(1), CountingJob())
    db = registry.scheduler.store.db
    assert isinstance(db, MySQLDatabase)
    attempts = 0

    async def work(cursor: Any) -> int:
        nonlocal attempts
        attempts += 1
        await cursor.execute("UPDATE conflict_t SET v = v + 10 WHERE id = 1")
        if attempts == 1:  # a write on another node commits first: certification fails ours
            async with other.begin() as conn:
                await conn.execute(text("UPDATE conflict_t SET v = v + 1 WHERE id = 1"))
        return attempts

    try:
        for _ in range(50):  # the table reached g2 (replication is asynchronous to readers)
            async with db.connect() as conn:
                if await conn.scalar(text("SELECT COUNT(*) FROM conflict_t")) == 1:
                    break
            await asyncio.sleep(0.1)
        assert await cursor_transaction(db, None, work) == 2
        assert db.write_conflicts == 1
        async with other.connect() as conn:
            assert await conn.scalar(text("SELECT v FROM conflict_t WHERE id = 1")) == 11
    finally:
        await registry.connection.dispose()
        await other.dispose()


async def test_get_lock_is_per_node_on_galera_and_refused(galera: GaleraCluster) -> None:
    """Measured: GET_LOCK on two nodes gives the same lock to both. try_cluster_lock refuses
    to run there, naming the cause."""
    engines = [create_async_engine(galera.url(i), poolclass=NullPool) for i in (0, 1)]
    try:
        async with engines[0].connect() as first, engines[1].connect() as second:
            name = "ekbatan-test-per-node"
            assert await first.scalar(text("SELECT GET_LOCK(:n, 0)"), {"n": name}) == 1
            assert await second.scalar(text("SELECT GET_LOCK(:n, 0)"), {"n": name}) == 1
        with pytest.raises(GaleraLocksUnsupported, match=r"Galera.*wsrep_on.*one node only"):
            async with try_cluster_lock(engines[0], "report"):
                pass
    finally:
        for engine in engines:
            await engine.dispose()


async def test_galera_scheduler_chooses_fetch_and_refuses_max_concurrency(
    galera: GaleraCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a configured strategy a scheduler on a Galera node polls with ``fetch`` (and
    runs its jobs); one with a ``max_concurrency`` job never gets ready and says why."""
    schema = create_async_engine(galera.url(0), poolclass=NullPool)
    try:
        await create_schema(schema)
    finally:
        await schema.dispose()
    counting = CountingJob()
    plain = _registry(galera.url(2), counting)
    await plain.start()
    try:
        assert await plain.wait_until_ready(30), plain.status()
        assert plain.scheduler.polling_strategy == "fetch"
        await plain.client.schedule("count", "a")
        for _ in range(100):
            if counting.runs["a"]:
                break
            await asyncio.sleep(0.1)
        assert counting.runs["a"] == 1
    finally:
        await plain.stop()
        await plain.connection.dispose()

    limited = _registry(galera.url(2), CountingJob("limited"), limited={"max_concurrency": 1})
    await limited.start()
    try:
        assert not await limited.wait_until_ready(3)
    finally:
        await limited.stop()
        await limited.connection.dispose()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "max_concurrency of limited" in messages and "Galera" in messages
