"""The chaos harness's eight scenarios: each drives a cluster through its faults (``drive``)
and says which of its promises the audit must show (``checks``).

Every wait is bounded; every scenario ends by itself. Durations come in a short version (run
by the test suite) and a long one (run by hand).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ekbatan_fastapi import SchedulerClient
from tests.chaos.audit import Audit, FaultRecovery
from tests.chaos.cluster import Cluster, Fault, Knobs, Node, Probe
from tests.chaos.jobs import BLOCK, LONG, ONCE, SYNC

__all__ = ["SCENARIOS", "Run", "Scenario"]


@dataclasses.dataclass
class Run:
    """What a scenario drives: the cluster, a client on the database, and what it noted."""

    cluster: Cluster
    client: SchedulerClient
    engine: AsyncEngine
    """A direct connection to the database (it bypasses the proxies: never cut)."""
    short: bool
    rng: random.Random
    restart_server: Callable[[float], Awaitable[None]] | None = None
    """Stop the database server for that many seconds and start it again (own server only)."""
    one_time: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    processes: str = ""
    load: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Measurements a scenario's checks need besides the audit."""
    begin: float = dataclasses.field(default_factory=time.time)
    end: float = 0.0

    @property
    def knobs(self) -> Knobs:
        return self.cluster.knobs

    @property
    def grace(self) -> float:
        """How long before the end of the workload a slot must be due to be expected."""
        return self.knobs.dead_after + self.knobs.poll + 0.5

    def pick(self, short: float, long: float) -> float:
        return short if self.short else long

    async def schedule_once(self, count: int, over: float, *, start: float = 0.5) -> None:
        """``count`` chaos-once instances due over the next ``over`` seconds (0-100 ms each)."""
        now = datetime.now(UTC)
        batch = []
        for i in range(count):
            offset = start + over * i / max(1, count)
            key = f"o{i:05d}"
            batch.append((key, now + timedelta(seconds=offset), {"ms": self.rng.randint(0, 100)}))
            self.one_time[(ONCE, key)] = now.timestamp() + offset
        for chunk in range(0, len(batch), 1000):
            await self.client.schedule_many(ONCE, batch[chunk : chunk + 1000])

    async def schedule(self, task: str, instance: str, **data: Any) -> None:
        """A one-time instance due now."""
        await self.client.schedule(task, instance, None, data)
        self.one_time[(task, instance)] = time.time()

    def records(self, task: str, instance: str, event: str) -> list[dict[str, Any]]:
        """The ledger's ``event`` records of one instance so far, oldest first."""
        found = []
        for path in self.cluster.ledger_dir.glob("ledger-*.jsonl"):
            for line in path.read_text().splitlines():
                if f'"{instance}"' in line and f'"e":"{event}"' in line:
                    record = json.loads(line)
                    if record["task"] == task and record["inst"] == instance:
                        found.append(record)
        return sorted(found, key=lambda r: r["t"])

    def starts(self, task: str, instance: str) -> list[dict[str, Any]]:
        return self.records(task, instance, "start")

    async def wait_started(
        self, task: str, instance: str, count: int = 1, timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        return await self.wait_records(task, instance, "start", count, timeout)

    async def wait_records(
        self, task: str, instance: str, event: str, count: int, timeout: float
    ) -> list[dict[str, Any]]:
        """The first ``count`` ``event`` records of one instance, once the ledger has them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.records(task, instance, event)
            if len(found) >= count:
                return found
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{task}/{instance}: not {count} {event!r} record(s) in {timeout:g}s")

    def node_of(self, pid: int) -> Node:
        return next(n for n in self.cluster.history if n.pid == pid)

    async def settle(self) -> None:
        """Let the revivals of the last fault finish before the workload ends."""
        await asyncio.sleep(self.grace + 0.5)


Checks = Callable[[Run, Audit], list[str]]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    recurring: int
    drive: Callable[[Run], Awaitable[None]]
    checks: Checks


def _within(values: list[float], bound: float, what: str) -> list[str]:
    late = [v for v in values if v > bound]
    return [f"{what}: {len(late)} over {bound:.2f}s (max {max(late):.2f}s)"] if late else []


def _recoveries(audit: Audit, *kinds: str) -> list[FaultRecovery]:
    return [r for r in audit.recoveries if r.fault.kind in kinds]


def _answered_during(probes: list[Probe], fault: Fault, label: str | None = None) -> list[Probe]:
    """The ``/jobs`` probes sent after the fault began (+0.5 s) and answered before it ended."""
    ended = fault.ended or 0.0
    return [
        p
        for p in probes
        if fault.began + 0.5 <= p.t and p.t + p.seconds < ended and label in (None, p.label)
    ]


def _revival_bound(knobs: Knobs) -> float:
    """A dead execution is revived within the dead window after its last heartbeat plus one
    housekeeping round, then claimed by the next poll; 1 s of slack for a loaded machine."""
    return knobs.dead_after + 2 * knobs.heartbeat + 1.0


# -- 1. crash ---------------------------------------------------------------------------------


async def _crash(run: Run) -> None:
    c = run.cluster
    window = run.pick(10.0, 60.0)
    once = int(run.pick(1000, 5000))
    every = run.pick(2.5, 4.0)
    nodes = [await c.start_plain("p1"), await c.start_plain("p2"), await c.start_app("a1")]
    run.processes = "2 plain registry processes (p1, p2) + 1 uvicorn example app (a1)"
    await run.schedule_once(once, window * 0.8)
    run.load = (
        f"{c.recurring} recurring jobs (FIXED_RATE 200-500 ms, each working 0-45 % of its "
        f"period) + {once} one-time tasks (0-100 ms each) due over {window * 0.8:g} s"
    )
    run.begin = time.time()
    deadline = time.monotonic() + window
    while time.monotonic() + every < deadline:
        await asyncio.sleep(every)
        victim = run.rng.choice([n for n in nodes if n.alive])
        await c.kill(victim)
        nodes[nodes.index(victim)] = await c.restart(victim)
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    await run.settle()


def _crash_checks(run: Run, audit: Audit) -> list[str]:
    kills = _recoveries(audit, "kill")
    problems = _within(
        [t for r in kills for t in r.rerun_after], _revival_bound(run.knobs), "reruns after a kill"
    )
    if not any(r.orphans for r in kills):
        problems.append("no kill interrupted an execution: nothing was shown")
    return problems


# -- 2. stall -----------------------------------------------------------------------------------


async def _stall(run: Run) -> None:
    c = run.cluster
    dead = run.knobs.dead_after
    work = 2 * dead + 0.5
    work_a = work + 2.5  # phase A's executions must outlive p2's start and p1's stop
    p1 = await c.start_plain("p1", extras=("long",))
    run.processes = "2 plain registry processes (p1, p2), both with the long job"
    run.load = (
        f"{c.recurring} recurring jobs; one-time long executions of {work:g} s: A-rude ignores "
        "its heartbeats, A-polite and B-polite give up at fraction_dead >= 0.5"
    )
    run.begin = time.time()
    await run.schedule(LONG, "A-rude", seconds=work_a)
    await run.schedule(LONG, "A-polite", seconds=work_a, polite=True)
    await run.wait_started(LONG, "A-rude")
    await run.wait_started(LONG, "A-polite")
    await c.start_plain("p2", extras=("long",))
    await asyncio.sleep(0.3)
    await c.stop(p1, dead + 1.5)  # SIGSTOP past the dead window, then SIGCONT
    # wait until p2's reruns of phase A are done, then phase B: a partition of the holder
    await run.wait_started(LONG, "A-rude", 2)
    await asyncio.sleep(work_a + 0.5)
    await run.schedule(LONG, "B-polite", seconds=work, polite=True)
    holder = run.node_of((await run.wait_started(LONG, "B-polite"))[0]["pid"])
    await asyncio.sleep(0.3)
    await c.partition([holder], dead + 1.5)
    await run.wait_started(LONG, "B-polite", 2)
    await asyncio.sleep(work + 0.5)
    await run.settle()
    for inst in ("A-rude", "A-polite", "B-polite"):
        run.notes.append(_takeover_note(run, inst))


def _takeover_note(run: Run, instance: str) -> str:
    """How the first execution of ``instance`` ended, relative to its takeover."""
    ends = {(r["pid"], r["ver"]): r for r in run.records(LONG, instance, "end")}
    starts = run.starts(LONG, instance)
    if len(starts) < 2:
        return f"{instance}: not taken over"
    first, second = starts[0], starts[1]
    end = ends.get((first["pid"], first["ver"]))
    if end is None:
        return f"{instance}: the first execution never ended"
    gap = end["t"] - second["t"]
    when = f"{abs(gap):.2f} s {'after' if gap > 0 else 'before'} the takeover started"
    detail = f" ({end['detail']})" if end.get("detail") else ""
    return f"{instance}: first execution ended {end['outcome']}{detail} {when}"


def _stall_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    by_inst = {d.slot_key[1]: d for d in audit.duplicates if d.slot_key[0] == LONG}
    for inst in ("A-rude", "A-polite", "B-polite"):
        if inst not in by_inst:
            problems.append(f"{inst} was not taken over after the fault")
    rude = by_inst.get("A-rude")
    if rude is not None and not (
        rude.runs[0].outcome == "ok" and rude.runs[0].finish == "rejected"
    ):
        problems.append(f"A-rude's late completion was not rejected: {rude.runs[0]}")
    for inst in ("A-polite", "B-polite"):
        dup = by_inst.get(inst)
        if dup is not None and dup.runs[0].outcome != "bailed":
            problems.append(f"{inst} did not give up: {dup.runs[0].outcome}")
    polite = by_inst.get("B-polite")
    if polite is not None:
        first, second = polite.runs[0], polite.runs[1]
        if first.end is None or first.end > second.start:
            problems.append("B-polite was still running when its takeover started")
    return problems


# -- 3. database restart ----------------------------------------------------------------------


_STATEMENT_TIMEOUT = 30.0
"""The library's default ``statement_timeout`` (every process of the harness keeps it)."""


async def _db_restart(run: Run) -> None:
    c = run.cluster
    seconds = run.pick(3.0, 5.0)
    # reset: every connection reset, new ones refused (a restart); blackhole: nothing answers,
    # then the connections are reset; blackhole-forever: nothing answers, and the connections
    # stay silent for good (new ones work): only statement_timeout ends the wait
    modes = ["reset", "reset", "blackhole"] if run.short else ["reset"] * 3 + ["blackhole"] * 2
    if not run.short:
        modes.append("blackhole-forever")
    await c.start_plain("p1")
    await c.start_plain("p2")
    await c.start_app("a1")
    run.processes = "2 plain registry processes (p1, p2) + 1 uvicorn example app (a1)"
    once = int(run.pick(600, 3000))
    span = len(modes) * (seconds + 3.0) + (_STATEMENT_TIMEOUT if not run.short else 0.0)
    await run.schedule_once(once, span)
    run.load = f"{c.recurring} recurring jobs + {once} one-time tasks due over {span:g} s"
    c.start_probing()
    run.begin = time.time()
    for mode in modes:
        await asyncio.sleep(run.pick(2.0, 3.0))
        await c.partition(c.live(), seconds, mode=mode)
        if mode == "blackhole-forever":
            await asyncio.sleep(_STATEMENT_TIMEOUT)
    if run.restart_server is not None:
        await asyncio.sleep(3.0)
        fault = c.fault("restart", c.live(), f"server stopped {seconds:g}s")
        await run.restart_server(seconds)
        fault.ended = time.time()
    await asyncio.sleep(3.0)
    await run.settle()


def _db_restart_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    # one polling interval, plus reconnecting on a loaded machine; connections that stay
    # silent are given up after statement_timeout
    bound = run.knobs.poll + 1.5
    for r in _recoveries(audit, "outage", "restart", "blackhole-all"):
        forever = "forever" in r.fault.note
        if r.resumed_all is None:
            problems.append(f"scheduling did not resume after the {r.fault.kind}")
        else:
            limit = bound + (_STATEMENT_TIMEOUT if forever else 0.0)
            problems += _within([r.resumed_all], limit, f"resumption after {r.fault.kind}")
        allowed = {"503", "cached"}
        if r.fault.kind not in ("outage", "restart"):
            allowed.add("ReadTimeout")
        if set(r.jobs_during) - allowed:
            problems.append(f"/jobs answered {r.jobs_during} during the {r.fault.kind}")
        if r.jobs_200_after is None:
            problems.append(f"/jobs did not answer 200 after the {r.fault.kind}")
    exits = [n for n in run.cluster.history if n.exited is not None and n.exited < run.end]
    if exits:
        problems.append(f"processes exited during the run: {[n.label for n in exits]}")
    return problems


# -- 4. database absent at startup ------------------------------------------------------------


async def _db_absent(run: Run) -> None:
    c = run.cluster
    absent = run.pick(5.0, 30.0)
    run.begin = time.time()
    fault = c.fault("absent", [], f"{absent:g}s once both processes were up")
    a1 = await c.start_app("a1", wait_ready=False)
    p1 = await c.start_plain("p1", wait="STARTED")
    fault.pids = [a1.pid, p1.pid]
    fault.targets = [a1.label, p1.label]
    run.processes = "1 uvicorn example app (a1) + 1 plain registry process (p1)"
    run.load = f"{c.recurring} recurring jobs, all created once the database appears"
    c.start_probing()
    await asyncio.sleep(absent)
    for proxy in c.proxies.values():
        await proxy.start()
    fault.ended = time.time()
    await asyncio.sleep(run.pick(3.0, 10.0))
    await run.settle()


def _db_absent_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    (recovery,) = _recoveries(audit, "absent")
    if recovery.jobs_during != ["503"]:
        problems.append(f"/jobs during the absence answered {recovery.jobs_during}, not 503")
    if recovery.jobs_200_after is None:
        problems.append("/jobs did not answer 200 once the database was up")
    if recovery.resumed_all is None:
        problems.append("nothing was scheduled once the database was up")
    else:
        problems += _within([recovery.resumed_all], run.knobs.poll + 2.0, "first executions")
    return problems


# -- 5. starved application pool ----------------------------------------------------------------


async def _starved_pool(run: Run) -> None:
    c = run.cluster
    hold = run.pick(3 * run.knobs.dead_after, 20.0)  # below the pool's 30 s checkout timeout
    requests = int(run.pick(20, 60))
    apps = [await c.start_app("a1"), await c.start_app("a2")]
    run.processes = "2 uvicorn example apps (a1, a2): application pool 2, jobs pool 5"
    run.load = (
        f"{c.recurring} recurring jobs + the example's demo job (FIXED_RATE 1 s, writes "
        "demo_runs through the application's database)"
    )
    c.start_probing()
    run.begin = time.time()
    await asyncio.sleep(2.0)
    demo_before = await _demo_runs(run.engine)
    async with run.engine.connect() as conn:
        lock = c.fault("lock", apps, f"demo_runs locked {hold:g}s; {requests} slow requests/app")
        await _lock_demo_runs(conn)
        async with httpx.AsyncClient(timeout=hold + 60) as http:
            slow = [
                asyncio.create_task(http.get(f"{app.base_url}/demo/runs"))
                for app in apps
                for _ in range(requests)
            ]
            await asyncio.sleep(hold)
            await _unlock_demo_runs(conn)
            lock.ended = time.time()
            answers = await asyncio.gather(*slow, return_exceptions=True)
    statuses = [
        a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a in answers
    ]
    run.facts["slow_requests"] = statuses
    await asyncio.sleep(2.0)
    run.facts["demo_during_lock"] = await _demo_runs(run.engine) - demo_before
    run.facts["demo_twice"] = await _demo_slots_twice(run.engine)
    await run.settle()
    during = _answered_during(c.probes, lock)
    latencies = sorted(p.seconds for p in during)
    codes = sorted({str(p.status or p.error) for p in during})
    if latencies:
        run.notes.append(
            f"/jobs during the starvation: {len(during)} requests, answers {'/'.join(codes)}, "
            f"median {latencies[len(latencies) // 2]:.3f} s, max {latencies[-1]:.3f} s"
        )
    answered = sum(1 for status in statuses if status == 200)
    run.notes.append(
        f"slow /demo/runs requests: {answered} of {len(statuses)} answered 200 once the lock "
        f"was released; demo slots recorded twice in demo_runs: {run.facts['demo_twice']}"
    )


async def _lock_demo_runs(conn: AsyncConnection) -> None:
    if conn.dialect.name in ("mysql", "mariadb"):
        await conn.execute(text("LOCK TABLES demo_runs WRITE"))
    else:
        await conn.execute(text("LOCK TABLE demo_runs IN ACCESS EXCLUSIVE MODE"))


async def _unlock_demo_runs(conn: AsyncConnection) -> None:
    if conn.dialect.name in ("mysql", "mariadb"):
        await conn.execute(text("UNLOCK TABLES"))
    await conn.rollback()


async def _demo_runs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM demo_runs"))).scalar_one())


async def _demo_slots_twice(engine: AsyncEngine) -> int:
    sql = "SELECT count(*) FROM (SELECT slot FROM demo_runs GROUP BY slot HAVING count(*) > 1) d"
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql))).scalar_one())


def _starved_pool_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    if audit.revivals:
        problems.append(f"{audit.revivals} executions were revived: heartbeats did not flow")
    if run.facts.get("demo_twice"):
        problems.append(f"{run.facts['demo_twice']} demo slots ran twice")
    lock = next(f for f in run.cluster.faults if f.kind == "lock")
    during = _answered_during(run.cluster.probes, lock)
    bad = [p for p in during if p.status != 200]
    if not during or bad:
        problems.append(f"/jobs during the starvation: {len(bad)} of {len(during)} not 200")
    if any(s != 200 for s in run.facts.get("slow_requests", [])):
        problems.append("some slow application requests failed")
    return problems


# -- 6. blocked event loop ----------------------------------------------------------------------


async def _blocked_loop(run: Run) -> None:
    c = run.cluster
    block = run.pick(2 * run.knobs.dead_after + 1.0, 20.0)
    held = run.pick(15.0, 30.0)
    a1 = await c.start_app("a1", extras=("block", "long"))
    run.processes = (
        "1 uvicorn example app (a1, the only one with the blocking job) + p1 (plain, takes over)"
    )
    run.load = (
        f"{c.recurring} recurring jobs; on a1, an `async def` job that calls time.sleep("
        f"{block:g}) (it blocks a1's event loop) while a1 holds H-held, a {held:g} s job "
        "that p1 knows"
    )
    run.begin = time.time()
    # An execution a1 surely holds when its loop blocks (its recurring ones are there only by
    # chance): started before p1 exists, so a1 runs it; p1 knows the job and must take it over.
    await run.schedule(LONG, "H-held", seconds=held)
    await run.wait_started(LONG, "H-held")
    await c.start_plain("p1", extras=("long",))
    c.start_probing()
    await asyncio.sleep(2.0)
    await run.schedule(BLOCK, "block-1", seconds=block)
    (start,) = await run.wait_started(BLOCK, "block-1")
    if run.records(LONG, "H-held", "end"):
        raise RuntimeError(f"H-held ({held:g} s) ended before the block began: set it longer")
    fault = c.fault("block", [a1], f"time.sleep({block:g}) in an async def")
    fault.began = start["t"]
    await asyncio.sleep(block + 2.0)
    ends = run.records(BLOCK, "block-1", "end")
    fault.ended = ends[0]["t"] if ends else None
    async with httpx.AsyncClient(timeout=5) as http:
        report = (await http.get(f"{a1.base_url}/jobs")).json()["scheduler"]
    run.facts["lag"] = {k: report.get(k) for k in ("loop_lag_events", "max_loop_lag_seconds")}
    run.facts["block"] = block
    log = a1.log.read_text(errors="replace")
    run.facts["lag_logged"] = "event loop was blocked" in log
    # p1's run of H-held (taken over during the block) ends within its length.
    await run.wait_records(LONG, "H-held", "end", 2, held + run.grace + 5.0)
    await run.settle()
    during = [p for p in c.probes if p.label == "a1" and fault.began < p.t < (fault.ended or 0)]
    answers = sorted({str(p.status or p.error) for p in during})
    run.notes.append(
        f"a1's /jobs during the block: {len(during)} requests, {'/'.join(answers) or '-'} "
        f"(2 s client timeout); after it: {run.facts['lag']}; logged at ERROR: "
        f"{run.facts['lag_logged']}"
    )


def _blocked_loop_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    lag = run.facts.get("lag", {})
    if not lag.get("loop_lag_events"):
        problems.append(f"/jobs does not count the blocked loop: {lag}")
    elif (lag.get("max_loop_lag_seconds") or 0) < 0.8 * run.facts["block"]:
        problems.append(f"/jobs shows a shorter lag than the block: {lag}")
    if not run.facts.get("lag_logged"):
        problems.append("the blocked loop was not logged")
    held = [d for d in audit.duplicates if d.slot_key[:2] == (LONG, "H-held")]
    if not held or not all(r.startswith("revived after block") for r in held[0].reasons):
        problems.append(f"H-held, held by the blocked process, was not taken over: {held}")
    return problems


# -- 7. graceful stop ----------------------------------------------------------------------------


async def _graceful(run: Run) -> None:
    c = run.cluster
    k = run.knobs
    long_async = 2 * k.shutdown_wait + 3.0
    long_sync = 2 * k.shutdown_wait + k.dead_after + 3.0
    a1 = await c.start_app("a1", extras=("long", "sync"))
    run.processes = "1 uvicorn example app (a1, stopped with SIGTERM) + p1 (plain, takes over)"
    run.load = (
        f"{c.recurring} recurring jobs; on a1, an async job of {long_async:g} s (cancelled in "
        f"phase 2) and a plain `def` job of {long_sync:g} s (a thread: cannot be cancelled)"
    )
    run.begin = time.time()
    await run.schedule(LONG, "G-async", seconds=long_async)
    await run.schedule(SYNC, "G-sync", seconds=long_sync)
    await run.wait_started(LONG, "G-async")
    await run.wait_started(SYNC, "G-sync")
    await c.start_plain("p1", extras=("long", "sync"))
    await asyncio.sleep(1.0)
    fault, code = await c.terminate(a1)
    run.facts["exit_code"] = code
    run.facts["exit_seconds"] = (fault.ended or 0) - fault.began
    sync_end = run.records(SYNC, "G-sync", "end")
    run.notes.append(
        f"a1 exited {run.facts['exit_seconds']:.2f} s after SIGTERM with code {code}; its "
        "abandoned G-sync thread ended "
        + (f"{sync_end[0]['t'] - fault.began:.2f} s after SIGTERM" if sync_end else "never")
        + " (Python joins worker threads at exit)"
    )
    await run.wait_started(SYNC, "G-sync", 2)
    await asyncio.sleep(long_sync + 0.5)
    await run.settle()


def _graceful_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    if run.facts.get("exit_code") != 0:
        problems.append(f"a1 exit code {run.facts.get('exit_code')}")
    reasons = {d.slot_key[1]: d.reasons for d in audit.duplicates}
    if reasons.get("G-async") != ["released at shutdown"]:
        problems.append(f"G-async: {reasons.get('G-async')}, expected released at shutdown")
    if reasons.get("G-sync") != ["revived after terminate"]:
        problems.append(f"G-sync: {reasons.get('G-sync')}, expected revived after terminate")
    return problems


# -- 8. clock skew -------------------------------------------------------------------------------


async def _clock_skew(run: Run) -> None:
    c = run.cluster
    window = run.pick(8.0, 40.0)
    await c.start_plain("fast", clock_offset=3600.0, extras=("long",))
    await c.start_plain("slow", clock_offset=-3600.0, extras=("long",))
    await c.start_plain("right", extras=("long",))
    run.processes = "3 plain registry processes: clock +1 h (fast), -1 h (slow), right"
    once = int(run.pick(300, 1500))
    await run.schedule_once(once, window * 0.8)
    work = 2 * run.knobs.dead_after + 1.0
    for i in range(3):
        await run.schedule(LONG, f"L{i}", seconds=work)
    run.load = (
        f"{c.recurring} recurring jobs + {once} one-time tasks + 3 executions of {work:g} s "
        "(longer than the dead window)"
    )
    for node in c.live():
        c.fault("skew", [node], f"{node.clock_offset:+g}s")
    run.begin = time.time()
    await asyncio.sleep(window)
    await run.settle()


def _clock_skew_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    if audit.revivals:
        problems.append(f"{audit.revivals} false dead detections")
    if audit.duplicates:
        problems.append(f"{len(audit.duplicates)} slots ran twice")
    return problems


# -- 9. /jobs under load -------------------------------------------------------------------------


async def _jobs_load(run: Run) -> None:
    c = run.cluster
    phase = run.pick(4.0, 20.0)
    clients = int(run.pick(16, 32))
    apps = [await c.start_app("a1"), await c.start_app("a2")]
    run.processes = "2 uvicorn example apps (a1, a2), scheduling on the loops that serve /jobs"
    run.load = (
        f"{c.recurring} recurring jobs; {phase:g} s calm, then {phase:g} s of {clients} "
        "clients per app calling GET /jobs back to back"
    )
    run.begin = time.time()
    await asyncio.sleep(phase)
    calm = (run.begin, time.time())
    fault = c.fault("http-load", apps, f"{clients} concurrent /jobs clients per app")
    answered: list[float] = []
    statuses: list[str] = []

    async def client(http: httpx.AsyncClient, app: Node, until: float) -> None:
        while time.time() < until:
            began = time.time()
            try:
                response = await http.get(f"{app.base_url}/jobs")
                statuses.append(str(response.status_code))
            except httpx.HTTPError as error:
                statuses.append(type(error).__name__)
            answered.append(time.time() - began)

    until = time.time() + phase
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.gather(*(client(http, app, until) for app in apps for _ in range(clients)))
    fault.ended = time.time()
    await run.settle()
    lags = _slot_lags(run)
    for name, (began, ended) in (("calm", calm), ("under load", (fault.began, fault.ended))):
        values = sorted(lag for start, lag in lags if began <= start <= ended)
        run.facts[name] = values
        if values:
            run.notes.append(
                f"recurring slot lag {name}: p50 {values[len(values) // 2]:.3f} s, p99 "
                f"{values[int(0.99 * len(values))]:.3f} s, max {values[-1]:.3f} s "
                f"({len(values)} slots)"
            )
    answered.sort()
    if answered:
        run.notes.append(
            f"/jobs under load: {len(answered)} requests, answers "
            f"{'/'.join(sorted(set(statuses)))}, median {answered[len(answered) // 2]:.3f} s, "
            f"max {answered[-1]:.3f} s"
        )


def _slot_lags(run: Run) -> list[tuple[float, float]]:
    """(start, seconds from slot to start) of each recurring slot's first execution."""
    first: dict[tuple[str, int], float] = {}
    for path in run.cluster.ledger_dir.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"e":"start"' in line and '"chaos-r' in line:
                record = json.loads(line)
                key = (record["task"], record["slot"])
                first[key] = min(first.get(key, record["t"]), record["t"])
    return [(start, start - slot / 1e6) for (_, slot), start in first.items()]


def _jobs_load_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    if audit.revivals:
        problems.append(f"{audit.revivals} executions were revived under load")
    loaded = run.facts.get("under load", [])
    if not loaded:
        problems.append("no slot ran under load")
    elif loaded[int(0.99 * len(loaded))] > run.knobs.dead_after / 2:
        problems.append(f"slots ran late under load: p99 {loaded[int(0.99 * len(loaded))]:.2f} s")
    return problems


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("crash", "SIGKILL a random process every few seconds", 30, _crash, _crash_checks),
        Scenario(
            "stall",
            "SIGSTOP, then a partition, of a process running long jobs",
            10,
            _stall,
            _stall_checks,
        ),
        Scenario(
            "db-restart",
            "The database goes away and comes back, several times",
            30,
            _db_restart,
            _db_restart_checks,
        ),
        Scenario(
            "db-absent",
            "The database is absent when the processes start",
            10,
            _db_absent,
            _db_absent_checks,
        ),
        Scenario(
            "starved-pool",
            "The application's pool is exhausted by slow queries",
            10,
            _starved_pool,
            _starved_pool_checks,
        ),
        Scenario(
            "blocked-loop",
            "An async job blocks its event loop past the dead window",
            30,
            _blocked_loop,
            _blocked_loop_checks,
        ),
        Scenario(
            "graceful", "SIGTERM to uvicorn while long jobs run", 10, _graceful, _graceful_checks
        ),
        Scenario(
            "clock-skew",
            "One clock an hour fast, another an hour slow",
            30,
            _clock_skew,
            _clock_skew_checks,
        ),
        Scenario(
            "jobs-load",
            "/jobs under a bounded load of concurrent requests",
            30,
            _jobs_load,
            _jobs_load_checks,
        ),
    ]
}
"""The scenarios of issue 5, in its order (and /jobs under load, from its "Bad input")."""


def fault_line(fault: Fault, begin: float) -> str:
    offset = fault.began - begin
    when = f"{offset if abs(offset) >= 0.05 else 0.0:+.1f}s"
    lasted = (fault.ended - fault.began) if fault.ended else 0.0
    length = f" for {lasted:.1f}s" if lasted >= 0.2 else ""
    who = ",".join(fault.targets) or "all"
    return f"{fault.kind} {who} at {when}{length}" + (f" ({fault.note})" if fault.note else "")
