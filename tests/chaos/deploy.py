"""The chaos harness's deployment scenarios: the real components of production deployments
between the scheduler processes and the database (see docs/deployment.md).

* ``pgbouncer-transaction``: every process through PgBouncer's transaction pooling (3 server
  connections for 3 processes of 5 connections each), ``pooler=pgbouncer-transaction``; one
  process is killed and its executions are revived through the pooler.
* ``failover``: a private PostgreSQL 15 primary with a synchronous ``pg_basebackup -R``
  replica, a multi-host URL with ``target_session_attrs=read-write``; the primary is stopped
  (immediate) and the replica promoted.
* ``failover-frozen``: the same, but the primary is frozen (SIGSTOP of the postmaster and its
  backends: TCP accepts, nothing answers) before the promotion.
* ``fence-read-only``: the primary is fenced read-only (``default_transaction_read_only``),
  then the replica promoted; every process's listener must follow.
* ``mariadb-orphan``: (``--url`` a MariaDB server) one process is partitioned right after its
  ``SELECT ... FOR UPDATE SKIP LOCKED``: its claim transaction is orphaned on the server with
  the due rows locked; the others go on once ``idle_transaction_timeout`` ends it.
* ``orphaned-claim``: the answer to one process's claim is delayed past its statement
  timeout: the server claimed rows for it that it never saw; they are released or revived.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.servers import Pair, pgbouncer, primary_and_replica
from ekbatan_fastapi import create_schema
from tests.chaos.audit import Audit
from tests.chaos.cluster import Knobs
from tests.chaos.scenarios import Run, Scenario, _recoveries, _revival_bound, _within

__all__ = ["DEPLOYMENTS", "Deployment"]

_CONNECT_TIMEOUT = 5.0
"""The library's default connect timeout per host."""
_FROZEN_STATEMENT_TIMEOUT = 5.0
"""failover-frozen: the plain processes' statement timeout (a held connection to the frozen
primary is given up after it)."""


@dataclasses.dataclass
class Deployment:
    """Where a scenario's processes connect, and how."""

    url: str
    """The cluster's URL (through PgBouncer, or the multi-host URL of a pair)."""
    admin_url: str
    """The harness's own connection (direct; the pair's multi-host URL)."""
    direct: bool = False
    pooler: str | None = None
    statement_timeout: float | None = None
    pair: Pair | None = None
    description: str = ""
    knobs: Knobs | None = None
    """The processes' settings (None: the harness's ``KNOBS``)."""
    urls: dict[str, str] | None = None
    """A process's own URL by label (each process on its own node of a multi-primary cluster)."""
    polling_strategy: str | None = None
    cluster: Any = None
    """The scenario's database cluster (``bench/patroni.py``, ``bench/galera.py``)."""


Setup = Callable[[str], contextlib.AbstractAsyncContextManager[Deployment]]


@contextlib.asynccontextmanager
async def _through_pgbouncer(database_url: str) -> AsyncIterator[Deployment]:
    parsed = make_url(database_url)
    server = parsed.set(database="postgres").render_as_string(hide_password=False)
    with pgbouncer(server, mode="transaction", pool_size=3) as bouncer:
        yield Deployment(
            bouncer.url(database_url),
            database_url,
            pooler="pgbouncer-transaction",
            description="PgBouncer 1.18, transaction mode, 3 server connections",
        )


def _pair_setup(*, statement_timeout: float | None = None) -> Setup:
    @contextlib.asynccontextmanager
    async def setup(_database_url: str) -> AsyncIterator[Deployment]:
        with contextlib.ExitStack() as stack:
            pair = await asyncio.to_thread(
                stack.enter_context, primary_and_replica(synchronous=True)
            )
            await asyncio.to_thread(pair.primary.psql, "CREATE DATABASE chaos")
            engine = create_async_engine(pair.primary_url("chaos"), poolclass=NullPool)
            try:
                await create_schema(engine)
            finally:
                await engine.dispose()
            await asyncio.to_thread(pair.wait_replicated, "chaos")
            try:
                yield Deployment(
                    pair.url("chaos"),
                    pair.url("chaos"),
                    direct=True,
                    statement_timeout=statement_timeout,
                    pair=pair,
                    description="private PostgreSQL 15 primary + synchronous pg_basebackup -R "
                    "replica; ?host=primary&host=replica&target_session_attrs=read-write",
                )
            finally:
                await asyncio.to_thread(pair.thaw)

    return setup


@contextlib.asynccontextmanager
async def _mariadb(database_url: str) -> AsyncIterator[Deployment]:
    if make_url(database_url).get_backend_name() not in ("mysql", "mariadb"):
        raise RuntimeError("mariadb-orphan needs --url mysql+asyncmy://root@127.0.0.1:3306/test")
    yield Deployment(database_url, database_url, description="MariaDB, the default session bounds")


@contextlib.asynccontextmanager
async def _short_timeouts(database_url: str) -> AsyncIterator[Deployment]:
    yield Deployment(database_url, database_url, statement_timeout=2.0)


# -- the scenarios --------------------------------------------------------------------------


def _pair(run: Run) -> Pair:
    pair = run.facts["deployment"].pair
    assert isinstance(pair, Pair)
    return pair


async def _start_three(run: Run, *, app: bool = True) -> None:
    c = run.cluster
    await c.start_plain("p1")
    await c.start_plain("p2")
    if app:
        await c.start_app("a1")
        run.processes = "2 plain registry processes (p1, p2) + 1 uvicorn example app (a1)"
    else:
        await c.start_plain("p3")
        run.processes = "3 plain registry processes (p1, p2, p3)"


async def _pgbouncer_transaction(run: Run) -> None:
    c = run.cluster
    await _start_three(run)
    once = int(run.pick(500, 3000))
    window = run.pick(8.0, 40.0)
    await run.schedule_once(once, window * 0.8)
    run.load = f"{c.recurring} recurring jobs + {once} one-time tasks due over {window * 0.8:g} s"
    run.begin = time.time()
    await asyncio.sleep(window / 3)
    victim = c.nodes["p1"]
    await c.kill(victim)
    await asyncio.sleep(1.0)
    await c.restart(victim)
    await asyncio.sleep(window * 2 / 3)
    await run.settle()


def _log_lines(run: Run, needle: str) -> list[str]:
    return [
        line
        for path in sorted(run.cluster.log_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if needle in line
    ]


def _pgbouncer_checks(run: Run, audit: Audit) -> list[str]:
    problems = _within(
        [t for r in _recoveries(audit, "kill") for t in r.rerun_after],
        _revival_bound(run.knobs),
        "reruns after a kill",
    )
    mismatches = _log_lines(run, "EKBATAN_JOBS__POOLER")
    if mismatches:
        problems.append(f"{len(mismatches)} prepared-statement errors: {mismatches[0][:200]}")
    return problems


def _failover_drive(kind: str) -> Callable[[Run], Awaitable[None]]:
    async def drive(run: Run) -> None:
        c = run.cluster
        pair = _pair(run)
        await _start_three(run, app=kind != "frozen")
        once = int(run.pick(300, 1500))
        window = run.pick(12.0, 40.0)
        await run.schedule_once(once, window * 0.8)
        run.load = (
            f"{c.recurring} recurring jobs + {once} one-time tasks due over {window * 0.8:g} s"
        )
        if kind != "frozen":
            c.start_probing()
        run.begin = time.time()
        await asyncio.sleep(window / 4)
        if kind == "fence":
            fault = c.fault("fence", c.live(), "primary fenced read-only, 1 s, replica promoted")
            await asyncio.to_thread(pair.fence)
            await asyncio.sleep(1.0)
        elif kind == "frozen":
            fault = c.fault("failover", c.live(), "primary frozen (SIGSTOP), replica promoted")
            await asyncio.to_thread(pair.freeze)
        else:
            fault = c.fault("failover", c.live(), "primary stopped (immediate), replica promoted")
            await asyncio.to_thread(pair.primary.pg_ctl, "-m", "immediate", "-w", "stop")
        await asyncio.to_thread(pair.promote)
        fault.ended = time.time()
        run.notes.append(f"promotion done {fault.ended - fault.began:.2f} s after the fault began")
        after = window * 3 / 4
        if kind == "frozen":
            # the held connections give up after their statement timeout and the first new
            # one spends a connect timeout on the frozen host: leave time to run after that
            after = max(after, _FROZEN_STATEMENT_TIMEOUT + _CONNECT_TIMEOUT + 6.0)
        await asyncio.sleep(after)
        await run.settle()

    return drive


def _failover_checks(kind: str) -> Callable[[Run, Audit], list[str]]:
    def checks(run: Run, audit: Audit) -> list[str]:
        bound = run.knobs.poll + _CONNECT_TIMEOUT + 2.0
        if kind == "frozen":
            bound += _FROZEN_STATEMENT_TIMEOUT + _CONNECT_TIMEOUT
        problems = []
        for r in _recoveries(audit, "failover", "fence"):
            if r.resumed_all is None:
                problems.append(f"scheduling did not resume after the {r.fault.kind}")
            else:
                problems += _within([r.resumed_all], bound, f"resumption after {r.fault.kind}")
        if kind == "fence":
            moved = {p.name for p in run.cluster.log_dir.glob("*.log")}
            followed = _log_lines(run, "reconnecting the LISTEN connection")
            run.notes.append(f"listener reconnections after the fence: {len(followed)}")
            if len(followed) < len(moved):
                problems.append(
                    f"only {len(followed)} of {len(moved)} processes reconnected their listener"
                )
        return problems

    return checks


async def _mariadb_orphan(run: Run) -> None:
    c = run.cluster
    await _start_three(run)
    once = int(run.pick(300, 1500))
    window = run.pick(20.0, 45.0)
    await run.schedule_once(once, window * 0.8)
    run.load = f"{c.recurring} recurring jobs + {once} one-time tasks due over {window * 0.8:g} s"
    run.begin = time.time()
    await asyncio.sleep(window / 5)
    victim = c.nodes["p1"]
    victim.proxy.blackhole_after(b"FOR UPDATE SKIP LOCKED")
    for _ in range(1000):  # the next claim comes within a polling interval
        if victim.proxy.matched:
            break
        await asyncio.sleep(0.01)
    fault = c.fault("partition", [victim], "right after its SELECT ... FOR UPDATE SKIP LOCKED")
    fault.began = time.time()
    await asyncio.sleep(run.pick(14.0, 20.0))
    await victim.proxy.heal(reset=True)
    fault.ended = time.time()
    run.facts["orphan"] = (fault.began, fault.ended)
    await asyncio.sleep(window * 2 / 5)
    await run.settle()


def _longest_pause(run: Run, since: float, until: float, label: str) -> float:
    """The longest stretch without an execution starting on the processes other than
    ``label`` between ``since`` and ``until``."""
    pids = {n.pid for n in run.cluster.history if n.label != label}
    starts = sorted(
        record["t"]
        for path in run.cluster.ledger_dir.glob("ledger-*.jsonl")
        for record in map(json.loads, path.read_text().splitlines())
        if record.get("e") == "start"
        and record.get("pid") in pids
        and since <= record["t"] <= until
    )
    points = [since, *starts, until]
    return max(b - a for a, b in itertools.pairwise(points))


def _mariadb_checks(run: Run, audit: Audit) -> list[str]:
    if "orphan" not in run.facts:
        return ["the orphan was not made"]
    since, until = run.facts["orphan"]
    pause = _longest_pause(run, since, until, "p1")
    run.notes.append(f"longest pause of the other processes during the orphan: {pause:.2f} s")
    return _within([pause], 10.0 + run.knobs.poll + 3.0, "pause during the orphan")


async def _orphaned_claim(run: Run) -> None:
    c = run.cluster
    run.processes = "3 plain registry processes (p1, whose first claim is answered late; p2, p3)"
    once = int(run.pick(300, 1500))
    window = run.pick(10.0, 30.0)
    await run.schedule_once(once, window * 0.8, start=0.0)  # due at once: p1's claim gets some
    run.load = f"{c.recurring} recurring jobs + {once} one-time tasks due over {window * 0.8:g} s"
    run.begin = time.time()
    proxy = c._proxy("p1")
    proxy.delay_answer(b"SET picked = true, picked_by", 4.0, skip=1)
    fault = c.fault("delay", [], "p1's first claim answered 4 s late (statement timeout 2 s)")
    await c.start_plain("p1", wait="STARTED")
    fault.pids = [c.nodes["p1"].pid]
    fault.targets = ["p1"]
    fault.ended = fault.began + 4.0
    await asyncio.sleep(1.0)  # p1 alone: its claim takes due rows
    await c.start_plain("p2")
    await c.start_plain("p3")
    await asyncio.sleep(window)
    await run.settle()


def _orphaned_checks(run: Run, audit: Audit) -> list[str]:
    released = _log_lines(run, "which does not run it")
    revived = [line for line in _log_lines(run, "revived dead execution") if "picked by p1" in line]
    run.notes.append(
        f"rows of the lost claim: {len(released)} released by p1, {len(revived)} revived by peers"
    )
    if not released and not revived:
        return ["the delayed claim left nothing to release: the fault did not happen"]
    return []


DEPLOYMENTS: dict[str, tuple[Scenario, Setup]] = {
    "pgbouncer-transaction": (
        Scenario(
            "pgbouncer-transaction",
            "Every process through PgBouncer's transaction pooling, one killed",
            30,
            _pgbouncer_transaction,
            _pgbouncer_checks,
        ),
        _through_pgbouncer,
    ),
    "failover": (
        Scenario(
            "failover",
            "The primary stops; the replica is promoted (multi-host URL)",
            20,
            _failover_drive("stop"),
            _failover_checks("stop"),
        ),
        _pair_setup(),
    ),
    "failover-frozen": (
        Scenario(
            "failover-frozen",
            "The primary freezes (SIGSTOP); the replica is promoted (multi-host URL)",
            20,
            _failover_drive("frozen"),
            _failover_checks("frozen"),
        ),
        _pair_setup(statement_timeout=_FROZEN_STATEMENT_TIMEOUT),
    ),
    "fence-read-only": (
        Scenario(
            "fence-read-only",
            "The primary is fenced read-only; the replica is promoted; listeners follow",
            20,
            _failover_drive("fence"),
            _failover_checks("fence"),
        ),
        _pair_setup(),
    ),
    "mariadb-orphan": (
        Scenario(
            "mariadb-orphan",
            "MariaDB: a claim transaction orphaned by a partition right after its SELECT",
            20,
            _mariadb_orphan,
            _mariadb_checks,
        ),
        _mariadb,
    ),
    "orphaned-claim": (
        Scenario(
            "orphaned-claim",
            "A claim's answer arrives after its statement timeout",
            20,
            _orphaned_claim,
            _orphaned_checks,
        ),
        _short_timeouts,
    ),
}
