"""The chaos harness's database-cluster scenarios: the engines users run in production, started
from Debian's packages on this machine (``bench/patroni.py``, ``bench/galera.py``).

Three plain scheduler processes, heartbeat 0.2 s x 4 = a 0.8 s dead window, polling 0.5 s,
one-time tasks and recurring jobs due all along, and a long execution running when the fault
comes (``chaos-long``, 4 s):

* ``patroni-switchover-haproxy`` / ``patroni-switchover-multihost``: ``patronictl
  switchover`` of a Patroni 3 cluster (etcd, 3 PostgreSQL 15 nodes), the processes connected
  through HAProxy (Patroni's ``/primary`` check, Patroni's documented ``inter 3s fall 3 rise 2
  on-marked-down shutdown-sessions``) or through the multi-host URL
  (``target_session_attrs=read-write``). A planned switchover must give 0 duplicates.
* ``patroni-switchover-haproxy-fast``: the same through HAProxy checking every 0.5 s
  (``inter 500ms fall 2 rise 1``).
* ``patroni-leader-kill``: the leader's postmaster is SIGKILLed (Patroni, alive, restarts it);
  multi-host URL. 0 duplicates.
* ``patroni-leader-frozen``: the leader's PostgreSQL is frozen (SIGSTOP of the postmaster and
  its backends) past Patroni's ``ttl``; a replica takes over; then it is continued (SIGCONT).
  Run as docs/deployment.md says a frozen primary must be fenced: ``synchronous_mode`` (the
  continued primary's commits wait for a standby that now follows the new leader, and are
  never acknowledged) and Patroni on etcd's v2 API (Patroni 3.0.2's ``etcd3`` code takes the
  leader key back when the frozen leader's loop resumes: patroni#2689, fixed in 3.0.3).
  Revivals of executions whose owner was cut off are explained; no unexplained duplicate.
  Its dead window is 2 s (``SYNCHRONOUS_KNOBS``): commits wait for a synchronous standby.
* ``patroni-leader-frozen-etcd3``: the same without ``synchronous_mode``, on etcd's v3 API, as
  Patroni 3.0.2 runs by default: the old leader becomes the leader again after the SIGCONT and
  the promoted node's commits are rewound (by hand: it fails when a process wrote there).
* ``galera-default`` / ``galera-lock-and-fetch`` / ``galera-fetch``: a 3-node MariaDB Galera
  cluster, each process on its own node (multi-primary), with no polling strategy set (the
  scheduler picks ``fetch`` on a Galera node), ``lock-and-fetch`` or ``fetch``: write
  conflicts (error 1213 at COMMIT) must be retried, never logged as errors.
* ``galera-node-kill``: one Galera node's ``mariadbd`` is SIGKILLed mid-execution; its process
  is moved to another node 1 s later (as a load balancer does); the cluster stalls until
  Galera evicts the node (``evs.suspect_timeout``, 5 s). Only the moved process's executions
  may be revived.

    python -m tests.chaos clusters              # every one, short
    python -m tests.chaos patroni-switchover-haproxy
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.galera import GaleraCluster, galera_cluster, have_galera
from bench.patroni import PatroniCluster, have_patroni, patroni_cluster
from tests.chaos.audit import Audit
from tests.chaos.cluster import Fault, Knobs
from tests.chaos.deploy import Deployment, Setup
from tests.chaos.jobs import LONG
from tests.chaos.scenarios import Run, Scenario

__all__ = ["CLUSTERS", "CLUSTER_KNOBS", "IN_TESTS", "have_galera", "have_patroni"]

CLUSTER_KNOBS = Knobs(poll=0.5, heartbeat=0.2, missed=4, shutdown_wait=1.0)
"""Polling 0.5 s, heartbeat 0.2 s x 4 missed = dead after 0.8 s."""

SYNCHRONOUS_KNOBS = Knobs(poll=0.5, heartbeat=0.2, missed=10, shutdown_wait=1.0)
"""With ``synchronous_mode``: heartbeat 0.2 s x 10 = dead after 2 s. Every commit waits for
a synchronous standby, and after a failover none is attached until a replica streams from the
new leader: commits (heartbeats among them) waited 0.6-1.1 s then, longer than 0.8 s."""

_LONG_SECONDS = 4.0

IN_TESTS = (
    "patroni-switchover-haproxy",
    "patroni-switchover-multihost",
    "patroni-leader-kill",
    "patroni-leader-frozen",
    "galera-default",
    "galera-node-kill",
)
"""The scenarios ``tests/test_clusters.py`` runs (the others are variants, run by hand)."""


def _patroni_setup(
    via: str, *, synchronous: bool = False, fast_checks: bool = False, dcs: str = "etcd3"
) -> Setup:
    check = (0.5, 2, 1) if fast_checks else (3.0, 3, 2)

    @contextlib.asynccontextmanager
    async def setup(_database_url: str) -> AsyncIterator[Deployment]:
        with contextlib.ExitStack() as stack:
            cluster = await asyncio.to_thread(
                stack.enter_context,
                patroni_cluster(
                    synchronous=synchronous,
                    check_interval=check[0],
                    fall=check[1],
                    rise=check[2],
                    dcs=dcs,
                ),
            )
            await asyncio.to_thread(cluster.leader().psql, "CREATE DATABASE chaos")
            url = cluster.haproxy_url("chaos") if via == "haproxy" else cluster.url("chaos")
            api = "v3" if dcs == "etcd3" else "v2"
            how = (
                f"HAProxy (OPTIONS /primary, inter {check[0]:g}s fall {check[1]} rise "
                f"{check[2]}, on-marked-down shutdown-sessions)"
                if via == "haproxy"
                else "the multi-host URL (3 hosts, target_session_attrs=read-write)"
            )
            try:
                yield Deployment(
                    url,
                    cluster.url("chaos"),
                    direct=True,
                    knobs=SYNCHRONOUS_KNOBS if synchronous else CLUSTER_KNOBS,
                    cluster=cluster,
                    description=f"Patroni 3.0 (etcd 3.4 through its {api} API, 3 PostgreSQL 15 "
                    f"nodes, ttl 20 s, "
                    f"loop_wait 1 s{', synchronous_mode' if synchronous else ''}); "
                    f"processes through {how}",
                )
            finally:
                await asyncio.to_thread(cluster.thaw)

    return setup


def _galera_setup(strategy: str | None) -> Setup:
    @contextlib.asynccontextmanager
    async def setup(_database_url: str) -> AsyncIterator[Deployment]:
        with contextlib.ExitStack() as stack:
            cluster = await asyncio.to_thread(stack.enter_context, galera_cluster())
            urls = {f"p{i + 1}": cluster.url(i, "test") for i in range(3)}
            yield Deployment(
                cluster.url(0, "test"),
                cluster.url(0, "test"),
                knobs=CLUSTER_KNOBS,
                urls=urls,
                polling_strategy=strategy,
                cluster=cluster,
                description=f"MariaDB Galera (galera-4), 3 nodes, multi-primary: p1 on g1, "
                f"p2 on g2, p3 on g3; polling strategy {strategy or 'not set (the default)'}",
            )

    return setup


def _patroni(run: Run) -> PatroniCluster:
    cluster = run.facts["deployment"].cluster
    assert isinstance(cluster, PatroniCluster)
    return cluster


def _galera(run: Run) -> GaleraCluster:
    cluster = run.facts["deployment"].cluster
    assert isinstance(cluster, GaleraCluster)
    return cluster


async def _start(run: Run, window: float) -> None:
    c = run.cluster
    for label in ("p1", "p2", "p3"):
        await c.start_plain(label, extras=("long",))
    run.processes = "3 plain registry processes (p1, p2, p3)"
    once = int(run.pick(300, 1500))
    await run.schedule_once(once, window * 0.8)
    run.load = (
        f"{c.recurring} recurring jobs + {once} one-time tasks due over {window * 0.8:g} s "
        f"+ 1 chaos-long ({_LONG_SECONDS:g} s) running when the fault comes"
    )
    run.begin = time.time()


async def _long_running(run: Run) -> int:
    """Start a long execution and wait until it runs: the fault comes mid-execution. The pid of
    the process running it."""
    await run.schedule(LONG, "mid-fault", seconds=_LONG_SECONDS)
    started = await run.wait_started(LONG, "mid-fault", timeout=20)
    await asyncio.sleep(0.5)
    return int(started[0]["pid"])


async def _wait_writable(run: Run, timeout: float = 90.0) -> float:
    """Until the cluster takes a write again through the processes' own URL (HAProxy, or the
    multi-host URL); when."""
    url = run.facts["deployment"].url
    from ekbatan_fastapi.store.postgresql.connect import HostConnector

    engine = create_async_engine(
        url, poolclass=NullPool, connect_args={"async_creator_fn": HostConnector(), "timeout": 2}
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                async with asyncio.timeout(3), engine.begin() as conn:
                    await conn.execute(text("CREATE TEMP TABLE w (x int)"))
                    return time.time()
            except Exception:  # not yet: any failure means try again
                await asyncio.sleep(0.05)
    finally:
        await engine.dispose()
    raise RuntimeError(f"the Patroni cluster took no write for {timeout:g}s")


def _primaries(cluster: PatroniCluster) -> str | None:
    """The nodes whose Patroni answers ``GET /primary`` with 200, joined by ``+``."""
    up = [n.name for n in cluster.nodes if n.rest("/primary", timeout=0.5)[0] == 200]
    return "+".join(up) or None


async def _watch(run: Run, cluster: PatroniCluster, since: float) -> None:
    """Record, from ``since``, when HAProxy's up nodes (its stats socket) and the nodes
    Patroni calls primary (REST ``/primary``) change."""
    readers = {"haproxy": cluster.haproxy_backend, "primary": lambda: _primaries(cluster)}
    last = {}
    for key, read in readers.items():
        run.facts[key] = []
        last[key] = await asyncio.to_thread(read)
    while True:
        for key, read in readers.items():
            now = await asyncio.to_thread(read)
            if now != last[key]:
                run.facts[key].append((time.time() - since, now))
                last[key] = now
        await asyncio.sleep(0.1)


def _patroni_drive(kind: str) -> Callable[[Run], Awaitable[None]]:
    async def drive(run: Run) -> None:
        c = run.cluster
        cluster = _patroni(run)
        window = run.pick(12.0, 40.0)
        await _start(run, window)
        await asyncio.sleep(window / 4)
        holder = run.node_of(await _long_running(run))
        run.facts["long_on"] = holder.label
        everyone = c.live()
        if kind == "switchover":
            fault = c.fault("switchover", everyone, "patronictl switchover --force")
            watcher = asyncio.create_task(_watch(run, cluster, fault.began))
            old, new = await asyncio.to_thread(cluster.switchover)
            fault.note += f" ({old} -> {new}, patronictl returned after "
            fault.note += f"{time.time() - fault.began:.2f} s)"
        elif kind == "kill":
            fault = c.fault("leader-kill", everyone, "SIGKILL of the leader's postmaster")
            watcher = asyncio.create_task(_watch(run, cluster, fault.began))
            victim = await asyncio.to_thread(cluster.kill_postmaster)
            fault.note += f" ({victim.name})"
        else:
            fault = c.fault("leader-frozen", everyone, "SIGSTOP of the leader's PostgreSQL")
            watcher = asyncio.create_task(_watch(run, cluster, fault.began))
            victim = await asyncio.to_thread(cluster.freeze)
            fault.note += f" ({victim.name})"
        fault.ended = await _wait_writable(run)
        run.notes.append(
            f"the cluster took writes again through the processes' URL "
            f"{fault.ended - fault.began:.2f} s after the fault began "
            f"(leader {(await asyncio.to_thread(cluster.leader)).name})"
        )
        if kind == "frozen":
            await asyncio.sleep(run.pick(3.0, 10.0))
            await asyncio.to_thread(cluster.thaw)
            run.notes.append(f"SIGCONT {time.time() - fault.began:.2f} s after the SIGSTOP")
        await asyncio.sleep(window * 3 / 4)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        for key, what in (("primary", "Patroni's /primary"), ("haproxy", "HAProxy's up nodes")):
            moves = run.facts.get(key, [])
            if moves:
                run.notes.append(
                    f"{what}: "
                    + ", ".join(f"{name or 'none'} after {t:.2f} s" for t, name in moves)
                )
        await run.settle()

    return drive


async def _galera_conflicts_drive(run: Run) -> None:
    window = run.pick(12.0, 40.0)
    await _start(run, window)
    await asyncio.sleep(window)
    await run.settle()


async def _galera_kill_drive(run: Run) -> None:
    c = run.cluster
    cluster = _galera(run)
    window = run.pick(12.0, 40.0)
    await _start(run, window)
    await asyncio.sleep(window / 4)
    await _long_running(run)
    moved = c.nodes["p3"]
    fault = c.fault("node-kill", [moved], "SIGKILL of g3's mariadbd (p3's node)")
    await asyncio.to_thread(cluster.kill, 2)
    await asyncio.sleep(1.0)
    moved.proxy.retarget(cluster.url(0))  # the load balancer's next check moves p3 to g1
    await asyncio.to_thread(cluster.wait_size, 2)
    fault.ended = time.time()  # the cluster takes writes again
    run.notes.append(
        f"p3 moved to g1 1 s after the kill; Galera evicted g3 "
        f"{fault.ended - fault.began:.2f} s after the kill"
    )
    await asyncio.sleep(window * 3 / 4)
    await run.settle()


# -- the checks -----------------------------------------------------------------------------


def _labels(run: Run) -> dict[int, str]:
    return {n.pid: n.label for n in run.cluster.history}


def _revivals(run: Run) -> list[dict[str, Any]]:
    found = []
    for path in run.cluster.ledger_dir.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"e":"revive"' in line:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    return found


def _first_after(run: Run, fault: Fault) -> tuple[float | None, float | None]:
    """Seconds from the fault's start to the first execution started after it by any process,
    and from the fault's end (the cluster writable again) to the same."""
    starts = sorted(
        json.loads(line)["t"]
        for path in run.cluster.ledger_dir.glob("ledger-*.jsonl")
        for line in path.read_text().splitlines()
        if '"e":"start"' in line
    )
    ended = fault.ended or fault.began
    after = [t for t in starts if t > ended]
    if not after:
        return None, None
    return after[0] - fault.began, after[0] - ended


def _summary(run: Run, audit: Audit, kinds: tuple[str, ...]) -> None:
    labels = _labels(run)
    revivals = _revivals(run)
    own = [r for r in revivals if labels.get(r["pid"]) == r.get("owner")]
    run.facts["own_revivals"] = len(own)
    run.notes.append(
        f"revivals {len(revivals)}, of which by the owner itself {len(own)}; "
        f"duplicates {len(audit.duplicates)} ({len(audit.unexplained)} unexplained)"
    )
    for fault in run.cluster.faults:
        if fault.kind in kinds:
            first, after_end = _first_after(run, fault)
            if first is not None and after_end is not None:
                run.notes.append(
                    f"first execution {first:.2f} s after the {fault.kind} began, "
                    f"{after_end:.2f} s after the cluster was writable again"
                )
                run.facts.setdefault("first_after", []).append(first)


def _patroni_checks(kind: str) -> Callable[[Run, Audit], list[str]]:
    def checks(run: Run, audit: Audit) -> list[str]:
        _summary(run, audit, ("switchover", "leader-kill", "leader-frozen"))
        problems = []
        if kind != "frozen" and audit.duplicates:
            problems.append(
                f"{len(audit.duplicates)} slots executed twice ({run.facts['own_revivals']} "
                "revived by their own running owner): a switchover or restart must give none"
            )
        if not run.facts.get("first_after"):
            problems.append("no execution after the fault")
        return problems

    return checks


def _galera_checks(run: Run, audit: Audit) -> list[str]:
    _summary(run, audit, ())
    stops = [
        json.loads(line)
        for path in run.cluster.ledger_dir.glob("ledger-*.jsonl")
        for line in path.read_text().splitlines()
        if '"e":"stopped"' in line
    ]
    strategies = sorted({str(r.get("strategy")) for r in stops})
    conflicts = sum(int(r.get("write_conflicts", 0)) for r in stops)
    run.notes.append(
        f"polling strategy in use: {', '.join(strategies) or '-'}; write conflicts retried "
        f"(ekbatan_write_conflicts_total, summed): {conflicts}"
    )
    problems = []
    if audit.errors_logged:
        problems.append(f"{audit.errors_logged} errors logged")
    if audit.duplicates:
        problems.append(f"{len(audit.duplicates)} slots executed twice")
    return problems


def _galera_kill_checks(run: Run, audit: Audit) -> list[str]:
    _summary(run, audit, ("node-kill",))
    problems = []
    if audit.unexplained:
        problems.append(
            f"{len(audit.unexplained)} slots executed twice whose first owner was not on the "
            "killed node"
        )
    if not run.facts.get("first_after"):
        problems.append("no execution after the node kill")
    return problems


CLUSTERS: dict[str, tuple[Scenario, Setup]] = {
    "patroni-switchover-haproxy": (
        Scenario(
            "patroni-switchover-haproxy",
            "Patroni: planned switchover (patronictl), processes through HAProxy",
            12,
            _patroni_drive("switchover"),
            _patroni_checks("switchover"),
        ),
        _patroni_setup("haproxy"),
    ),
    "patroni-switchover-haproxy-fast": (
        Scenario(
            "patroni-switchover-haproxy-fast",
            "Patroni: planned switchover, through HAProxy checking every 0.5 s (fall 2 rise 1)",
            12,
            _patroni_drive("switchover"),
            _patroni_checks("switchover"),
        ),
        _patroni_setup("haproxy", fast_checks=True),
    ),
    "patroni-switchover-multihost": (
        Scenario(
            "patroni-switchover-multihost",
            "Patroni: planned switchover (patronictl), processes on the multi-host URL",
            12,
            _patroni_drive("switchover"),
            _patroni_checks("switchover"),
        ),
        _patroni_setup("multihost"),
    ),
    "patroni-leader-kill": (
        Scenario(
            "patroni-leader-kill",
            "Patroni: the leader's postmaster is SIGKILLed (multi-host URL)",
            12,
            _patroni_drive("kill"),
            _patroni_checks("kill"),
        ),
        _patroni_setup("multihost"),
    ),
    "patroni-leader-frozen": (
        Scenario(
            "patroni-leader-frozen",
            "Patroni: the leader's PostgreSQL frozen (SIGSTOP) past the ttl, then continued "
            "(etcd's v2 API, synchronous_mode)",
            12,
            _patroni_drive("frozen"),
            _patroni_checks("frozen"),
        ),
        _patroni_setup("multihost", synchronous=True, dcs="etcd"),
    ),
    "patroni-leader-frozen-etcd3": (
        Scenario(
            "patroni-leader-frozen-etcd3",
            "Patroni 3.0.2 on etcd's v3 API: the leader frozen past the ttl, then continued "
            "(it takes the leader key back: patroni#2689)",
            12,
            _patroni_drive("frozen"),
            _patroni_checks("frozen"),
        ),
        _patroni_setup("multihost"),
    ),
    "galera-default": (
        Scenario(
            "galera-default",
            "Galera multi-primary, no polling strategy set (the scheduler picks one)",
            12,
            _galera_conflicts_drive,
            _galera_checks,
        ),
        _galera_setup(None),
    ),
    "galera-lock-and-fetch": (
        Scenario(
            "galera-lock-and-fetch",
            "Galera multi-primary, lock-and-fetch: write conflicts at COMMIT",
            12,
            _galera_conflicts_drive,
            _galera_checks,
        ),
        _galera_setup("lock-and-fetch"),
    ),
    "galera-fetch": (
        Scenario(
            "galera-fetch",
            "Galera multi-primary, fetch",
            12,
            _galera_conflicts_drive,
            _galera_checks,
        ),
        _galera_setup("fetch"),
    ),
    "galera-node-kill": (
        Scenario(
            "galera-node-kill",
            "Galera multi-primary: a node SIGKILLed mid-execution",
            12,
            _galera_kill_drive,
            _galera_kill_checks,
        ),
        _galera_setup("fetch"),
    ),
}
