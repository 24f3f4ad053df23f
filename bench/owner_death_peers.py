"""Owner death and per-minute slot lag: every system, ours and the peers, by one harness.

    python bench/owner_death_peers.py death                 # every system, 5 trials each
    python bench/owner_death_peers.py death --system ekbatan-fastapi dbos --trials 3
    python bench/owner_death_peers.py minute                # 10 jobs on '* * * * *', 4 minutes
    python bench/owner_death_peers.py death --quick         # ours, 1 trial (a smoke run)
    python bench/owner_death_peers.py death --url mysql+asyncmy://root@127.0.0.1:3306/test
                                                            # ours on MySQL/MariaDB

A system is a small adapter (``System``): how to prepare a fresh database for it, the command
line of one of its worker processes, the finest schedule it supports and how to read a slot
off its records. ``Ours`` runs this script's own worker (``--worker``) on the library as it is
in this checkout, with its defaults (polling interval PT10S, heartbeat PT10S); ``Peer`` runs
``peers.py worker SYSTEM --record`` in the peers' environment (``bench/.venv-peers``).

Every execution inserts a row (system, job, slot, enqueued, pid, start) into
``bench_executions`` in the system's own database, committed before the function returns,
so the executions of a process killed with SIGKILL are kept; the harness reads that table.
Ours writes it in ``ctx.transaction()``: it commits with the slot's completion, so a slot
whose completion a SIGKILL cut off (revived and run again, at least once) is counted once,
and a duplicate is a slot completed twice. ``--hold S`` makes each of our executions last
S seconds (the owner then dies during one).

**Owner death** (``death``): 2 processes, 3 recurring jobs on the finest schedule the system
supports (1 s: ours ``FIXED_RATE`` PT1S, the peers' ``* * * * * *`` cron or APScheduler's
1-second interval; oban: ``* * * * *``, minute precision only). A trial waits for the next
slot, reads which process started the most recent execution, and SIGKILLs it ``lead`` seconds
before the following slot (0.5 s on a 1-second schedule, 2 s before the minute). Then it
watches: for each job, did its next slot run, by which process, how late did the job run again
(its first start after the kill minus that slot), how many slots of the observed window no
process ran (lost) and how many ran twice (duplicates). A replacement process is started (two
processes again) and a random pause follows before the next trial.

**Per minute** (``minute``): 2 processes of each system, 10 jobs on ``* * * * *`` (ours:
``Schedules.cron``), 4 whole minutes measured after a minute of warm-up; the systems run at
the same time, each on its own database (the load is one execution per job per minute).
Lag = start of the function - the slot; duplicates and skipped slots as in ``slot_lag.py``.

With ``EKBATAN_BENCH_KEEP=<folder>`` the workers' logs are kept there, with times (and the
liveness watch's looks at DEBUG, ours). Every wait is bounded; the server must be on this
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common, lagstats, peers_run
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import lagstats  # type: ignore[no-redef]
    import peers_run  # type: ignore[no-redef]

THIS_FILE = Path(__file__).resolve()
OURS = "ekbatan-fastapi"
TABLE_DDL = (
    "CREATE TABLE bench_executions (id bigserial PRIMARY KEY, system text NOT NULL, "
    "job text NOT NULL, slot double precision, enqueued double precision, "
    "next_run double precision, pid integer NOT NULL, start double precision NOT NULL, "
    "note text)"
)
MYSQL_TABLE_DDL = (
    "CREATE TABLE bench_executions (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
    "system VARCHAR(100) NOT NULL, job VARCHAR(100) NOT NULL, slot DOUBLE, enqueued DOUBLE, "
    "next_run DOUBLE, pid INTEGER NOT NULL, start DOUBLE NOT NULL, note TEXT)"
)
"""Ours on MySQL/MariaDB (``--url mysql+asyncmy://...``: the peers are PostgreSQL-only)."""
LEDGER_INSERT = (
    "INSERT INTO bench_executions (system, job, slot, enqueued, pid, start, note) "
    "VALUES (:system, :job, :slot, :enqueued, :pid, :start, :note)"
)
"""Our worker's ledger row, written in ``ctx.transaction()`` (it commits with the slot's
completion, on either dialect)."""
RESUME_WAIT = 120.0
"""Seconds a trial waits for a live process to run a job after the previous kill; a system
that has not resumed by then has stalled: its remaining trials are not run."""
DEFAULT_TRIALS = 5
DEATH_JOBS = 3
MINUTE_JOBS = 10
MINUTES = 4


# -- the adapters ---------------------------------------------------------------------------


@dataclasses.dataclass
class System:
    """One system under test: what the harness needs to know about it."""

    name: str
    period: float = 1.0
    """Its finest recurring schedule, seconds."""
    settings: str = ""

    @property
    def lead(self) -> float:
        """How long before the next slot the owner is killed."""
        return 0.5 if self.period <= 1.0 else 2.0

    async def prepare(self, server: common.ServerInfo, db_url: str, database: str) -> None:
        raise NotImplementedError

    def command(
        self,
        server: common.ServerInfo,
        db_url: str,
        database: str,
        *,
        index: int,
        jobs: int,
        schedule: str,
        deadline: float,
        work: Path,
    ) -> list[str]:
        raise NotImplementedError

    def fix_slots(self, records: list[dict[str, Any]], period: float) -> list[dict[str, Any]]:
        return records

    def available(self) -> str | None:
        return None


class Ours(System):
    """ekbatan-fastapi as it is in this checkout, with the library's defaults."""

    def __init__(self, hold: float = 0.0) -> None:
        super().__init__(
            OURS,
            1.0,
            "FIXED_RATE|PT1S (per minute: Schedules.cron('* * * * *')), the library's defaults "
            "(polling interval PT10S, heartbeat PT10S, lock-and-fetch, LISTEN/NOTIFY)"
            + (f"; each execution lasts {hold:g} s" if hold else ""),
        )
        self.hold = hold
        """Seconds each execution lasts (``--hold``: the owner dies during an execution)."""

    async def prepare(self, server: common.ServerInfo, db_url: str, database: str) -> None:
        from ekbatan_fastapi import create_schema

        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            await create_schema(engine)
        finally:
            await engine.dispose()

    def command(
        self,
        server: common.ServerInfo,
        db_url: str,
        database: str,
        *,
        index: int,
        jobs: int,
        schedule: str,
        deadline: float,
        work: Path,
    ) -> list[str]:
        cmd = [sys.executable, str(THIS_FILE), "--worker", "--url", db_url]
        cmd += ["--jobs", str(jobs), "--schedule", schedule, "--index", str(index)]
        if self.hold:
            cmd += ["--hold", repr(self.hold)]
        return [*cmd, "--deadline", repr(deadline)]


class Peer(System):
    """A peer of ``peers.py``, run in the peers' environment with ``--record``."""

    def available(self) -> str | None:
        return peers_run.available()

    async def prepare(self, server: common.ServerInfo, db_url: str, database: str) -> None:
        conn = json.dumps(server.libpq(database))
        await peers_run._peer("setup", self.name, "--conn", conn, timeout=180)

    def command(
        self,
        server: common.ServerInfo,
        db_url: str,
        database: str,
        *,
        index: int,
        jobs: int,
        schedule: str,
        deadline: float,
        work: Path,
    ) -> list[str]:
        conn = json.dumps(server.libpq(database))
        cmd = [str(peers_run.PEERS_PY), str(peers_run.PEERS_SCRIPT), "worker", self.name]
        cmd += ["--conn", conn, "--mode", "lag", "--jobs", str(jobs), "--schedule", schedule]
        cmd += ["--record", "--index", str(index), "--deadline", repr(deadline)]
        return [*cmd, "--result", str(work / f"{self.name}-{index}-{time.time_ns()}.json")]

    def fix_slots(self, records: list[dict[str, Any]], period: float) -> list[dict[str, Any]]:
        return peers_run.fix_slots(self.name, records, period)


def systems() -> dict[str, System]:
    out: dict[str, System] = {OURS: Ours()}
    for name in peers_run.SYSTEMS:
        period = 60.0 if name in peers_run.MINUTE_ONLY else 1.0
        out[name] = Peer(name, period, peers_run.SETTINGS[name])
    return out


# -- the processes --------------------------------------------------------------------------


class _Fleet:
    """A system's live worker processes on one database."""

    def __init__(
        self,
        system: System,
        server: common.ServerInfo,
        db_url: str,
        work: Path,
        *,
        jobs: int,
        schedule: str,
        deadline: float,
    ) -> None:
        self.system, self.server, self.db_url, self.work = system, server, db_url, work
        self.database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
        self.jobs, self.schedule, self.deadline = jobs, schedule, deadline
        self.children: list[common.Child] = []
        self.dead: list[common.Child] = []
        self.kills: list[float] = []
        """Wall-clock times of the SIGKILLs so far."""
        self._count = 0

    async def spawn(self) -> common.Child:
        index = self._count
        self._count += 1
        cmd = self.system.command(
            self.server,
            self.db_url,
            self.database,
            index=index,
            jobs=self.jobs,
            schedule=self.schedule,
            deadline=self.deadline,
            work=self.work,
        )
        child = await common.Child.spawn(
            cmd, self.work / f"{self.system.name}-{index}.log", f"{self.system.name} {index}"
        )
        self.children.append(child)
        await child.expect("ready", 180.0)
        return child

    async def kill(self, child: common.Child) -> None:
        self.kills.append(time.time())
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        await child.proc.wait()
        self.children.remove(child)
        self.dead.append(child)

    async def close(self) -> None:
        await asyncio.gather(*(c.send("stop") for c in self.children), return_exceptions=True)
        await asyncio.gather(
            *(c.expect("done", 60.0) for c in self.children), return_exceptions=True
        )
        await asyncio.gather(
            *(c.close(30.0) for c in [*self.children, *self.dead]), return_exceptions=True
        )


async def _rows(db_url: str) -> list[dict[str, Any]]:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                text("SELECT job, slot, enqueued, next_run, pid, start, note FROM bench_executions")
            )
            return [
                {
                    "key": r.job,
                    "slot": r.slot,
                    "enqueued": r.enqueued,
                    "next_run": r.next_run,
                    "pid": r.pid,
                    "start": r.start,
                    "note": r.note,
                }
                for r in result
            ]
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def _database(server: common.ServerInfo, system: System) -> Any:
    prefix = "ekbatan_death_" + system.name.replace("-", "_")
    async with common.fresh_database(server.url, prefix) as db_url:
        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                mysql = common.is_mysql_url(db_url)
                await conn.execute(text(MYSQL_TABLE_DDL if mysql else TABLE_DDL))
        finally:
            await engine.dispose()
        database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
        await system.prepare(server, db_url, database)
        yield db_url


# -- owner death ----------------------------------------------------------------------------


@dataclasses.dataclass
class DeathTrial:
    index: int
    victim_pid: int | None
    kill_at: float | None
    """Wall-clock time of the SIGKILL."""
    next_ran: int = 0
    """Jobs whose next slot after the kill ran (of ``jobs``)."""
    jobs: int = 0
    by: list[str] = dataclasses.field(default_factory=list)
    """Who ran each job's next slot: survivor, victim (started before the kill) or none."""
    late_s: float | None = None
    """The largest over the jobs of: its first start after the kill - its next slot."""
    resumed: int = 0
    """Jobs that ran again within the observed window."""
    lost: int = 0
    """Slots of the observed window no process ran, over the jobs."""
    duplicates: int = 0
    window_s: float = 0.0
    victim_note: str | None = None
    """What the victim's last execution said of it (oban: leader or follower)."""
    error: str | None = None
    victim_held: int | None = None
    """Ours: rows the victim still held (picked) right after the kill: an execution it had
    not completed (its effects and completion commit together), which the survivor revives
    and runs again, its slot a second time only if that run had completed (a duplicate)."""


@dataclasses.dataclass
class DeathRun:
    system: str
    period: float
    trials: list[DeathTrial]
    settings: str = ""
    errors: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        done = [t for t in self.trials if t.error is None]
        lates = [t.late_s for t in done if t.late_s is not None]
        return {
            "trials": len(self.trials),
            "next_slot_ran": sum(1 for t in done if t.jobs and t.next_ran == t.jobs),
            "late_min_s": min(lates) if lates else None,
            "late_max_s": max(lates) if lates else None,
            "lost": [t.lost for t in done],
            "duplicates": sum(t.duplicates for t in done),
            "within_1s": sum(
                1
                for t in done
                if t.jobs and t.next_ran == t.jobs and t.late_s is not None and t.late_s <= 1.0
            ),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "period": self.period,
            "settings": self.settings,
            "errors": self.errors,
            "summary": self.summary(),
            "trials": [dataclasses.asdict(t) for t in self.trials],
        }


def _next_slots(
    system: System, rows: list[dict[str, Any]], keys: Sequence[str], after: float
) -> dict[str, float]:
    """Each job's first slot after ``after`` (its grid read off its latest slots)."""
    period = system.period
    fixed = system.fix_slots(rows, period)
    out: dict[str, float] = {}
    for key in keys:
        slots = [r["slot"] for r in fixed if r["key"] == key and r["slot"] is not None]
        phase = (max(slots) % period) if slots else 0.0
        out[key] = phase + math.floor((after - phase) / period + 1e-9) * period + period
    return out


def analyze_trial(
    system: System,
    rows: list[dict[str, Any]],
    keys: Sequence[str],
    *,
    index: int,
    victim: int,
    kill_at: float,
    window_end: float,
    survivors: set[int],
    victim_note: str | None = None,
) -> DeathTrial:
    """One trial's figures from every execution row of the system's database."""
    period = system.period
    fixed = system.fix_slots(rows, period)
    nexts = _next_slots(system, [r for r in rows if r["start"] < kill_at], keys, kill_at)
    trial = DeathTrial(
        index, victim, kill_at, jobs=len(keys), window_s=window_end - kill_at,
        victim_note=victim_note,
    )  # fmt: skip
    lates: list[float] = []
    for key in keys:
        first = nexts[key]
        runs = [r for r in fixed if r["key"] == key and r["slot"] is not None]
        counts: collections.Counter[int] = collections.Counter()
        for r in runs:
            counts[round((r["slot"] - first) / period)] += 1
        on_next = [r for r in runs if abs(r["slot"] - first) < period / 2]
        if on_next:
            trial.next_ran += 1
            pid = min(on_next, key=lambda r: r["start"])["pid"]
            trial.by.append(
                "victim" if pid == victim else ("survivor" if pid in survivors else str(pid))
            )
        else:
            trial.by.append("none")
        after = [
            r["start"] for r in runs if r["start"] >= kill_at and r["slot"] >= first - period / 2
        ]
        if after:
            trial.resumed += 1
            lates.append(min(after) - first)
        last = math.floor((window_end - first) / period + 1e-9)
        trial.lost += sum(1 for i in range(0, last + 1) if counts[i] == 0)
        trial.duplicates += sum(c - 1 for i, c in counts.items() if i >= -2 and c > 1)
    trial.late_s = max(lates) if len(lates) == len(keys) else None
    return trial


async def run_death(
    server: common.ServerInfo,
    system: System,
    *,
    trials: int = DEFAULT_TRIALS,
    jobs: int = DEATH_JOBS,
    observe: float | None = None,
    pause: tuple[float, float] = (2.0, 8.0),
    seed: int | None = None,
    verbose: bool = True,
) -> DeathRun:
    """``trials`` owner deaths of ``system``; ``observe``: seconds watched after the next slot
    (default 15 s on a 1-second schedule, 70 s on a minute: the next two minutes)."""
    rng = random.Random(seed)
    period = system.period
    observe = observe if observe is not None else (15.0 if period <= 1.0 else 70.0)
    keys = [f"lag{j}" for j in range(jobs)]
    schedule = "second" if period <= 1.0 else "minute"
    run = DeathRun(system.name, period, [], system.settings)
    reason = system.available()
    if reason:
        run.errors.append(reason)
        return run
    keep = os.environ.get("EKBATAN_BENCH_KEEP")  # a folder: the workers' logs are kept there
    with tempfile.TemporaryDirectory(prefix=f"ekbatan-death-{system.name}-") as scratch:
        tmp = keep or scratch
        async with _database(server, system) as db_url:
            per_trial = 2 * period + observe + pause[1] + 200
            deadline = time.monotonic() + 300 + trials * per_trial
            fleet = _Fleet(
                system, server, db_url, Path(tmp), jobs=jobs, schedule=schedule, deadline=deadline
            )
            try:
                await asyncio.gather(fleet.spawn(), fleet.spawn())
                await _await_rows(db_url, keys, 2, within=3 * period + 90)
                for index in range(trials):
                    trial = await _death_trial(fleet, system, keys, index, observe)
                    run.trials.append(trial)
                    if verbose:
                        print(f"    {system.name} trial {index + 1}/{trials}: "
                              f"{_trial_line(trial)}", flush=True)  # fmt: skip
                    if trial.error is not None:
                        run.errors.append(f"stopped after trial {index + 1}: {trial.error}")
                        break
                    await fleet.spawn()  # two processes again
                    await asyncio.sleep(rng.uniform(*pause))
            except Exception as exc:  # reported with the trials done so far
                run.errors.append(f"{type(exc).__name__}: {exc}"[:500])
            finally:
                await fleet.close()
    return run


async def _await_rows(db_url: str, keys: Sequence[str], each: int, within: float) -> None:
    """Until every job has run ``each`` times (the warm-up)."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        rows = await _rows(db_url)
        counts = collections.Counter(r["key"] for r in rows)
        if all(counts[k] >= each for k in keys):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the jobs did not run {each} times within {within:.0f} s")


async def _death_trial(
    fleet: _Fleet, system: System, keys: Sequence[str], index: int, observe: float
) -> DeathTrial:
    period = system.period
    # a live process must have run a job since the previous kill (the system has resumed)
    since = max((c_kill for c_kill in fleet.kills), default=0.0)
    began = time.monotonic()
    rows = await _rows(fleet.db_url)
    live_pids = {c.pid for c in fleet.children}
    while not any(r["pid"] in live_pids and r["start"] > since for r in rows):
        if time.monotonic() - began > RESUME_WAIT:
            return DeathTrial(
                index,
                None,
                None,
                error=f"no live process ran a job within {RESUME_WAIT:.0f} s of the previous "
                "trial (the system had not resumed)",
            )
        await asyncio.sleep(1.0)
        rows = await _rows(fleet.db_url)
    # the next slot far enough ahead to aim the kill at it
    nexts = _next_slots(system, rows, keys, time.time() + system.lead + 0.3)
    target = min(nexts.values())
    kill_at = target - system.lead
    await asyncio.sleep(max(0.0, kill_at - 0.15 - time.time()))
    rows = await _rows(fleet.db_url)
    live = {c.pid: c for c in fleet.children}
    latest = max((r for r in rows if r["pid"] in live), key=lambda r: r["start"], default=None)
    if latest is None:
        return DeathTrial(index, None, None, error="no execution by a live process")
    victim = live[latest["pid"]]
    await asyncio.sleep(max(0.0, kill_at - time.time()))
    killed = time.time()
    await fleet.kill(victim)
    held = await _victim_held(fleet.db_url, victim.pid) if system.name == OURS else None
    survivors = {c.pid for c in fleet.children}
    window_end = target + observe
    await asyncio.sleep(max(0.0, window_end - time.time()) + min(5.0, period))
    rows = await _rows(fleet.db_url)
    trial = analyze_trial(
        system,
        rows,
        keys,
        index=index,
        victim=victim.pid,
        kill_at=killed,
        window_end=window_end,
        survivors=survivors,
        victim_note=latest.get("note"),
    )
    trial.victim_held = held
    return trial


async def _victim_held(db_url: str, pid: int) -> int | None:
    """Ours: rows picked by the victim's scheduler (``death-<index>-<pid>``) now."""
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(
                text("SELECT COUNT(*) FROM scheduled_tasks WHERE picked_by LIKE :name"),
                {"name": f"death-%-{pid}"},
            )
            return int(found.scalar_one())
    except Exception:  # a figure of the report, never a reason to fail the trial
        return None
    finally:
        await engine.dispose()


def _trial_line(t: DeathTrial) -> str:
    if t.error:
        return f"FAILED {t.error}"
    late = f"{t.late_s:.2f} s" if t.late_s is not None else "not resumed"
    return (
        f"next slot ran {t.next_ran}/{t.jobs} (by {', '.join(sorted(set(t.by)))}), "
        f"late {late}, lost {t.lost}, duplicates {t.duplicates}"
        + (f", victim was {t.victim_note}" if t.victim_note else "")
        + (f", victim held {t.victim_held} row(s) at the kill" if t.victim_held else "")
    )


def format_death(runs: Sequence[DeathRun]) -> str:
    lines = [
        "| system | schedule | next slot ran (trials) | within 1 s | late by (s), per trial "
        "| slots lost, per trial | duplicates | observed after the slot |",
        "| --- | --- | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for run in runs:
        s = run.summary()
        sched = "1 s" if run.period <= 1.0 else "1 min"
        done = [t for t in run.trials if t.error is None]
        if not done:
            reason = "; ".join(run.errors + [t.error or "" for t in run.trials])[:160]
            lines.append(f"| {run.system} | {sched} | n/a ({reason or 'not run'}) | | | | | |")
            continue
        lates = ", ".join(f"{t.late_s:.2f}" if t.late_s is not None else "never" for t in done)
        lost = ", ".join(str(t.lost) for t in done)
        observed = max(t.window_s for t in done)
        note = f" ({'; '.join(run.errors)[:80]})" if run.errors else ""
        lines.append(
            f"| {run.system} | {sched} | {s['next_slot_ran']}/{len(run.trials)}{note} | "
            f"{s['within_1s']}/{len(run.trials)} | {lates} | {lost} | {s['duplicates']} | "
            f"{observed:.0f} s |"
        )
    return "\n".join(lines)


def format_death_trials(run: DeathRun) -> str:
    lines = [
        "| trial | victim | next slot ran | by | late by s | lost | duplicates |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for t in run.trials:
        if t.error:
            lines.append(f"| {t.index + 1} | | n/a ({t.error}) | | | | |")
            continue
        late = f"{t.late_s:.2f}" if t.late_s is not None else "never"
        victim = f"{t.victim_pid}" + (f" ({t.victim_note})" if t.victim_note else "")
        if t.victim_held:
            victim += f" (held {t.victim_held} unfinished at the kill)"
        lines.append(
            f"| {t.index + 1} | {victim} | {t.next_ran}/{t.jobs} | {', '.join(t.by)} | {late} "
            f"| {t.lost} | {t.duplicates} |"
        )
    return "\n".join(lines)


async def run_death_all(
    server: common.ServerInfo,
    chosen: Sequence[System],
    *,
    trials: int = DEFAULT_TRIALS,
    jobs: int = DEATH_JOBS,
    seed: int | None = None,
) -> list[DeathRun]:
    """Every system of ``chosen``: the 1-second ones one after the other, the minute ones (a
    trial takes minutes, their load is one execution a minute) at the same time as those."""
    minute = [s for s in chosen if s.period > 1.0]
    slow = [
        asyncio.create_task(run_death(server, s, trials=trials, jobs=jobs, seed=seed))
        for s in minute
    ]
    out: dict[str, DeathRun] = {}
    for system in chosen:
        if system.period <= 1.0:
            out[system.name] = await run_death(server, system, trials=trials, jobs=jobs, seed=seed)
    for run in await asyncio.gather(*slow):
        out[run.system] = run
    return [out[s.name] for s in chosen]


# -- per minute -----------------------------------------------------------------------------


@dataclasses.dataclass
class MinuteRun:
    system: str
    jobs: int
    minutes: int
    result: lagstats.LagResult | None
    errors: list[str]
    settings: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "jobs": self.jobs,
            "minutes": self.minutes,
            "settings": self.settings,
            "errors": self.errors,
            "result": self.result.as_dict() if self.result else None,
        }


async def run_minute(
    server: common.ServerInfo,
    chosen: Sequence[System],
    *,
    jobs: int = MINUTE_JOBS,
    minutes: int = MINUTES,
    tail: float = 75.0,
) -> list[MinuteRun]:
    """Every system of ``chosen`` at once, each on its own database: ``jobs`` jobs on
    ``* * * * *`` in 2 processes, ``minutes`` whole minutes measured. ``tail``: seconds waited
    after the last measured slot (chancy's cron plugin polls once a minute by default)."""
    return list(
        await asyncio.gather(
            *(_minute_one(server, s, jobs=jobs, minutes=minutes, tail=tail) for s in chosen)
        )
    )


async def _minute_one(
    server: common.ServerInfo, system: System, *, jobs: int, minutes: int, tail: float
) -> MinuteRun:
    keys = [f"lag{j}" for j in range(jobs)]
    reason = system.available()
    if reason:
        return MinuteRun(system.name, jobs, minutes, None, [reason], system.settings)
    errors: list[str] = []
    result = None
    try:
        with tempfile.TemporaryDirectory(prefix=f"ekbatan-minute-{system.name}-") as tmp:
            async with _database(server, system) as db_url:
                deadline = time.monotonic() + 400 + minutes * 60 + tail
                fleet = _Fleet(
                    system, server, db_url, Path(tmp), jobs=jobs, schedule="minute",
                    deadline=deadline,
                )  # fmt: skip
                try:
                    await asyncio.gather(fleet.spawn(), fleet.spawn())
                    # a whole minute of warm-up (a schedule's first run: pgqueuer hands over
                    # no slot for it), then the minutes measured
                    first = math.ceil((time.time() + 5.0) / 60.0) * 60.0 + 60.0
                    last = first + (minutes - 1) * 60.0
                    await asyncio.sleep(max(0.0, last + tail - time.time()))
                    for child in fleet.children:
                        if child.proc.returncode is not None:
                            errors.append(f"{child.name} exited:\n{common.tail(child.log)}")
                    rows = system.fix_slots(await _rows(db_url), 60.0)
                    result = lagstats.analyze(rows, 60.0, (first - 1.0, last + 1.0), keys)
                finally:
                    await fleet.close()
    except Exception as exc:  # reported in the table; the other systems still run
        errors.append(f"{type(exc).__name__}: {exc}"[:500])
    return MinuteRun(system.name, jobs, minutes, result, errors, system.settings)


def format_minute(runs: Sequence[MinuteRun]) -> str:
    lines = [
        "| system | jobs x minutes | slots | lag p50 ms | p99 ms | max ms | duplicates | skipped "
        "| settings |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        r = run.result
        if r is None:
            reason = "; ".join(run.errors)[:160] or "no result"
            lines.append(
                f"| {run.system} | {run.jobs} x {run.minutes} | n/a ({reason}) | | | | | | |"
            )
            continue
        lines.append(
            f"| {run.system} | {run.jobs} x {run.minutes} | {r.slots_expected} | "
            f"{common.fmt_ms(r.p50_ms)} | {common.fmt_ms(r.p99_ms)} | {common.fmt_ms(r.max_ms)} "
            f"| {r.duplicates} | {r.skipped} | {run.settings} |"
        )
    return "\n".join(lines)


# -- our worker -----------------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> int:
    from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules

    if os.environ.get("EKBATAN_BENCH_KEEP"):  # the kept logs say when
        import logging

        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        logging.getLogger("ekbatan_fastapi.engine.liveness").setLevel(logging.DEBUG)

    class Probe(DistributedJob):
        def __init__(self, name: str) -> None:
            self._name = name

        def name(self) -> str:
            return self._name

        def schedule(self) -> Schedule:
            if args.schedule == "minute":
                return Schedules.cron("* * * * *")
            return Schedules.fixed_rate(dt.timedelta(seconds=1))

        async def execute(self, ctx: ExecutionContext) -> None:
            started = time.time()
            if args.hold:
                await asyncio.sleep(args.hold)
            # the row commits with the slot's completion: a SIGKILL before that commit leaves
            # neither (the slot is revived and runs again, once), so a duplicate here is a slot
            # that completed twice, never db-scheduler's at-least-once revival
            async with ctx.transaction() as conn:
                await conn.execute(
                    text(LEDGER_INSERT),
                    {"system": OURS, "job": self._name, "slot": ctx.execution_time.timestamp(),
                     "enqueued": None, "pid": os.getpid(), "start": started, "note": None},
                )  # fmt: skip

    registry = common.worker_registry(
        args.url,
        [Probe(f"lag{j}") for j in range(args.jobs)],
        name=f"death-{args.index}-{os.getpid()}",
    )
    commands = common.stdin_commands()
    await registry.start()
    try:
        if not await registry.wait_until_ready(60.0):
            print("failed: not ready", flush=True)
            return 1
        print("ready", flush=True)
        await common.wait_for_stop(commands, args.deadline)
    finally:
        await registry.stop()
    print("done", flush=True)
    return 0


# -- command line ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.harness_parser(__doc__)
    p.add_argument("what", nargs="?", choices=("death", "minute"), default="death")
    p.add_argument("--system", nargs="+", help=f"default: every system ({OURS} and the peers)")
    p.add_argument("--trials", type=int, default=None, help=f"({DEFAULT_TRIALS})")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--minutes", type=int, default=MINUTES)
    p.add_argument("--seed", type=int, default=None, help="the pauses' random seed")
    p.add_argument("--quick", action="store_true", help="ours only, 1 trial")
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="ours: seconds each execution lasts (0.7: the owner dies during the previous "
        "slot's execution, which its survivor revives and runs again)",
    )
    p.add_argument("--json", type=Path)
    common.add_worker_arguments(p)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--schedule", choices=("second", "minute"), default="second")
    return p.parse_args(argv)


async def _cli(args: argparse.Namespace) -> int:
    known = systems()
    if args.hold:
        known[OURS] = Ours(hold=args.hold)
    names = args.system or ([OURS] if args.quick else list(known))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}: choose from {sorted(known)}")
    if args.url and common.is_mysql_url(args.url):
        if args.system and names != [OURS]:
            raise SystemExit(f"on MySQL/MariaDB only {OURS} runs (the peers are PostgreSQL's)")
        names = [OURS]
    with common.private_postgres(args.url) as server:
        if args.what == "death":
            runs = await run_death_all(
                server,
                [known[n] for n in names],
                trials=args.trials or (1 if args.quick else DEFAULT_TRIALS),
                jobs=args.jobs or DEATH_JOBS,
                seed=args.seed,
            )
            print(format_death(runs))
            for run in runs:
                print(f"\n{run.system}:\n{format_death_trials(run)}")
            out: Any = [r.as_dict() for r in runs]
        else:
            minute = await run_minute(
                server,
                [known[n] for n in names],
                jobs=args.jobs or MINUTE_JOBS,
                minutes=args.minutes,
            )
            print(format_minute(minute))
            out = [r.as_dict() for r in minute]
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        args.jobs = args.jobs or DEATH_JOBS
        return asyncio.run(_worker(args))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_cli(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
