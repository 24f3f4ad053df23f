"""Drives the peers (``peers.py`` in ``bench/.venv-peers``) through the same workloads as ours,
with the same parent logic: throughput (N no-op jobs by K worker processes) and slot lag.

    python bench/peers_run.py throughput --system pgqueuer -k 1 2 -n 20000
    python bench/peers_run.py lag --system procrastinate --jobs 10 --duration 60
    python bench/peers_run.py throughput --quick           # every peer, N=1000
    python bench/peers_run.py throughput --system oban dbos chancy -n 20000

Throughput: a fresh database, the peer's schema, N jobs enqueued with the peer's batch API
(timed: the enqueue rate), K workers started and released at once; timed from the workers'
run call (the earliest) until nothing is left (a worker in drain mode returns then; otherwise
its last completion; the parent polls the peer's queue table every 50 ms). Checks: every job
executed once, nothing left. A peer that cannot do a workload gets n/a with the reason.

Setting up the peers' environment (once; never a dependency of the library; Python 3.12 or
later, as oban requires; this machine: /root/.pyenv/versions/3.12.1/bin/python):

    python3.12 -m venv bench/.venv-peers
    bench/.venv-peers/bin/pip install -r bench/requirements-peers.txt
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import statistics
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
    from bench import common, lagstats, slot_lag
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import lagstats  # type: ignore[no-redef]
    import slot_lag  # type: ignore[no-redef]

PEERS_VENV = common.BENCH / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"
PEERS_SCRIPT = common.BENCH / "peers.py"
SYSTEMS = ("pgqueuer", "procrastinate", "apscheduler", "oban", "dbos", "chancy")
NEWER = ("oban", "dbos", "chancy")
"""The peers added for issue 32 (their figures also get a section of their own)."""
MINUTE_ONLY = ("oban",)
"""Peers whose cron has minute precision only: no 1-second schedule."""

REMAINING = {
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    "apscheduler": "SELECT count(*) FROM jobs",
    "oban": "SELECT count(*) FROM oban_jobs "
    "WHERE state IN ('available', 'scheduled', 'executing', 'retryable')",
    "dbos": "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')",
    "chancy": "SELECT count(*) FROM chancy_jobs WHERE state IN ('pending', 'running', 'retrying')",
}
SETTINGS = {
    "pgqueuer": "run(batch_size=25), uvloop; drain mode for throughput; cron '* * * * * *'",
    "procrastinate": "run_worker_async(concurrency=10); periodic cron '* * * * * *'",
    "apscheduler": "SQLAlchemyDataStore + AsyncpgEventBroker; worker role, "
    "max_running_jobs=None; IntervalTrigger(seconds=1) (role both) for lag",
    "oban": "Oban(queues={'default': 10}), its defaults (stager 1 s, leader election 30 s), "
    "uvloop; cron '* * * * *' (minute precision only) by the elected leader",
    "dbos": "DBOS.register_queue('bench') (no concurrency limit, polled every 1 s), "
    "DBOSClient.enqueue 32 in flight; DBOS.apply_schedules cron '* * * * * *', one executor id "
    "per process",
    "chancy": "Queue(concurrency=10, executor=Async, eager_polling=True), default plugins; "
    "Cron(poll_interval=1) '* * * * * *' (per minute: its default poll, 60 s)",
}


def available() -> str | None:
    """None when the peers' environment is usable, else why not."""
    if not PEERS_PY.exists():
        return (
            f"{PEERS_PY} missing: python3.12 -m venv bench/.venv-peers (Python 3.12+: oban) && "
            "bench/.venv-peers/bin/pip install -r bench/requirements-peers.txt"
        )
    return None


async def _peer(*args: str, timeout: float = 600.0) -> str:
    command = [str(PEERS_PY), str(PEERS_SCRIPT), *args]
    code, out, err = await common.run_bounded(command, timeout=timeout, cwd=str(common.ROOT))
    if code != 0:
        raise RuntimeError(f"peers.py {' '.join(args[:2])} failed:\n{err[-2000:]}")
    return out


async def versions() -> dict[str, str]:
    return dict(json.loads(await _peer("versions", timeout=60)))


@dataclasses.dataclass
class PeerThroughput:
    system: str
    processes: int
    n: int
    seconds: float | None
    enqueue_seconds: float | None
    executed: int
    distinct: int
    left: int | None
    per_worker: list[int]
    errors: list[str]
    busy_during: float | None = None
    """The machine's CPU busy fraction during the timed part (all processes, ours included)."""
    repeat: int = 1

    @property
    def rate(self) -> float | None:
        return self.n / self.seconds if self.seconds else None

    @property
    def enqueue_rate(self) -> float | None:
        return self.n / self.enqueue_seconds if self.enqueue_seconds else None

    @property
    def ok(self) -> bool:
        return (
            not self.errors
            and self.executed == self.distinct == self.n
            and self.left == 0
            and self.seconds is not None
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "rate": self.rate,
            "enqueue_rate": self.enqueue_rate,
            "ok": self.ok,
        }


async def _remaining(db_url: str, system: str) -> int:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(REMAINING[system]))).scalar_one())
    finally:
        await engine.dispose()


async def peer_throughput(
    server: common.ServerInfo,
    system: str,
    *,
    n: int = 20_000,
    processes: int = 1,
    timeout: float = 300.0,
) -> PeerThroughput:
    errors: list[str] = []
    busy_during: float | None = None
    seconds = enqueue_seconds = None
    left: int | None = None
    counts: collections.Counter[int] = collections.Counter()
    per_worker: list[int] = []
    async with common.fresh_database(server.url, f"ekbatan_peer_{system}") as db_url:
        database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
        conn = json.dumps(server.libpq(database))
        await _peer("setup", system, "--conn", conn, timeout=120)
        enqueued = json.loads(
            (await _peer("enqueue", system, "--conn", conn, "-n", str(n), timeout=timeout))
            .strip()
            .splitlines()[-1]
        )
        enqueue_seconds = float(enqueued["seconds"])
        # as throughput.py does for ours: a vacuumed, analyzed table and a checkpoint
        engine = create_async_engine(db_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as c:
                await c.execute(text("VACUUM ANALYZE"))
                with contextlib.suppress(Exception):
                    await c.execute(text("CHECKPOINT"))
        finally:
            await engine.dispose()
        children: list[common.Child] = []
        with tempfile.TemporaryDirectory(prefix=f"ekbatan-peer-{system}-") as work:
            results = [Path(work) / f"worker-{i}.json" for i in range(processes)]
            deadline = time.monotonic() + 2 * timeout + 60
            try:
                for index in range(processes):
                    args = [str(PEERS_PY), str(PEERS_SCRIPT), "worker", system, "--conn", conn]
                    args += ["--mode", "throughput", "--result", str(results[index])]
                    args += ["--deadline", repr(deadline), "--index", str(index)]
                    children.append(
                        await common.Child.spawn(
                            args, Path(work) / f"worker-{index}.log", f"{system} worker {index}"
                        )
                    )
                await asyncio.gather(*(c.expect("ready", 120.0) for c in children))
                await asyncio.gather(*(c.send("go") for c in children))
                go = time.monotonic()
                cpu_at_go = common.cpu_times()
                seen_empty: float | None = None
                while time.monotonic() - go < timeout:
                    await asyncio.sleep(0.05)
                    if await _remaining(db_url, system) == 0:
                        seen_empty = time.monotonic()
                        break
                    if any(c.proc.returncode is not None for c in children):
                        errors.append("a worker exited during the run")
                        break
                busy_during = common.busy_since(cpu_at_go)
                if seen_empty is None:
                    errors.append(f"not drained within {timeout:.0f} s")
                await asyncio.sleep(0.2)  # let drain-mode workers return by themselves
                await asyncio.gather(*(c.send("stop") for c in children))
                done = await asyncio.gather(
                    *(c.expect("done", 120.0) for c in children), return_exceptions=True
                )
                for child, outcome in zip(children, done, strict=True):
                    if isinstance(outcome, BaseException):
                        errors.append(f"{child.name}: {outcome}")
                starts: list[float] = []
                ends: list[float] = []
                for child, path in zip(children, results, strict=True):
                    try:
                        report = json.loads(path.read_text())
                    except (OSError, ValueError) as exc:
                        errors.append(f"{child.name}: no result ({exc}):\n{common.tail(child.log)}")
                        continue
                    counts.update(report["executed"])
                    per_worker.append(len(report["executed"]))
                    if report.get("start") is not None:
                        starts.append(report["start"])
                    if report.get("end") is not None:
                        ends.append(report["end"])
                if starts and (ends or seen_empty):
                    end = max(ends) if ends else seen_empty
                    assert end is not None
                    seconds = end - min(starts)
                left = await _remaining(db_url, system)
            finally:
                await asyncio.gather(*(c.close(30.0) for c in children), return_exceptions=True)
    return PeerThroughput(
        system=system,
        processes=processes,
        n=n,
        seconds=seconds,
        enqueue_seconds=enqueue_seconds,
        executed=sum(counts.values()),
        distinct=len(counts),
        left=left,
        per_worker=per_worker,
        errors=errors,
        busy_during=busy_during,
    )


def _pgqueuer_slots(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pgqueuer hands a schedule's *next* run to the function; the slot a run is for is the
    ``next_run`` its previous run of the same schedule was given (the first run of each
    schedule has none and is left out; the warm-up excludes it anyway)."""
    by_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in records:
        by_key[record["key"]].append(record)
    out = []
    for runs in by_key.values():
        runs.sort(key=lambda r: r["start"])
        previous: float | None = None
        for run in runs:
            out.append(run | {"slot": previous})
            previous = run["next_run"]
    return out


def chancy_slots(records: list[dict[str, Any]], period: float) -> list[dict[str, Any]]:
    """chancy's cron plugin pushes a job without its slot, then sets the schedule's next run to
    the first grid point after the push (its own clock). So the slot a push serves is the first
    grid point after the previous push of the same job (``enqueued``: the job's created_at).
    Where two pushes lie more than 1.5 periods apart (a dead owner, a push skipped because the
    job was still queued), that chain is unknown and the slot is the last grid point at or
    before the push; each job's first push has no slot (the warm-up excludes it anyway)."""
    by_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in records:
        by_key[record["key"]].append(record)
    out = []
    for runs in by_key.values():
        runs.sort(key=lambda r: r["enqueued"])
        previous: float | None = None
        for run in runs:
            pushed = run["enqueued"]
            if previous is not None and pushed - previous <= 1.5 * period:
                slot: float | None = (math.floor(previous / period + 1e-9) + 1) * period
            elif previous is not None:
                slot = math.floor(pushed / period + 1e-9) * period
            else:
                slot = None
            out.append(run | {"slot": slot})
            previous = pushed
    return out


def fix_slots(system: str, records: list[dict[str, Any]], period: float) -> list[dict[str, Any]]:
    """Each record's slot, for the peers that do not hand it to the function."""
    if system == "pgqueuer":
        return _pgqueuer_slots(records)
    if system == "chancy":
        return chancy_slots(records, period)
    return records


async def peer_lag(
    server: common.ServerInfo,
    system: str,
    *,
    processes: int = 2,
    jobs: int = 10,
    duration: float = 60.0,
    warmup: float = slot_lag.WARMUP,
) -> slot_lag.LagRun:
    if system in MINUTE_ONLY:
        return slot_lag.LagRun(
            system, processes, jobs, 1.0, duration, None, ["minute cron only"], SETTINGS[system]
        )
    async with common.fresh_database(server.url, f"ekbatan_peer_{system}") as db_url:
        database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
        conn = json.dumps(server.libpq(database))
        await _peer("setup", system, "--conn", conn, timeout=120)
        deadline = time.monotonic() + warmup + duration + 300

        def args(index: int, result: Path) -> list[str]:
            cmd = [str(PEERS_PY), str(PEERS_SCRIPT), "worker", system, "--conn", conn]
            cmd += ["--mode", "lag", "--jobs", str(jobs), "--result", str(result)]
            return [*cmd, "--deadline", repr(deadline), "--index", str(index)]

        records, window, errors, _ = await slot_lag.run_lag_workers(
            args, processes=processes, duration=duration, warmup=warmup
        )
    lag_records = fix_slots(system, records, 1.0)
    keys = [f"lag{j}" for j in range(jobs)]
    result = lagstats.analyze(lag_records, 1.0, window, keys) if lag_records else None
    return slot_lag.LagRun(
        system=system,
        processes=processes,
        jobs=jobs,
        period=1.0,
        duration=duration,
        result=result,
        errors=errors,
        settings=SETTINGS[system],
    )


def format_throughput(runs: Sequence[PeerThroughput]) -> str:
    lines = [
        "| system | processes | run | executions/s | enqueue/s | executed / N | left | split "
        "| machine busy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in runs:
        rate = f"{r.rate:,.0f}" if r.rate and r.ok else "n/a"
        enq = f"{r.enqueue_rate:,.0f}" if r.enqueue_rate else "n/a"
        note = "" if r.ok else f" ({'; '.join(r.errors)[:120] or 'checks failed'})"
        busy = f"{r.busy_during:.0%}" if r.busy_during is not None else "n/a"
        lines.append(
            f"| {r.system} | {r.processes} | {r.repeat} | {rate}{note} | {enq} | "
            f"{r.distinct} / {r.n} | {r.left} | {'/'.join(map(str, r.per_worker))} | {busy} |"
        )
    return "\n".join(lines)


def median_rate(runs: Sequence[PeerThroughput]) -> float | None:
    rates = [r.rate for r in runs if r.ok and r.rate]
    return statistics.median(rates) if rates else None


async def _cli(args: argparse.Namespace) -> int:
    reason = available()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    systems = args.system or list(SYSTEMS)
    with common.private_postgres(args.url) as server:
        if args.what == "throughput":
            n = args.n or (1000 if args.quick else 20_000)
            runs = [
                await peer_throughput(server, system, n=n, processes=k)
                for system in systems
                for k in args.processes
            ]
            print(format_throughput(runs))
            out: Any = [r.as_dict() for r in runs]
        else:
            lag_runs = [
                await peer_lag(
                    server,
                    system,
                    processes=args.processes[-1],
                    jobs=args.jobs or (3 if args.quick else 10),
                    duration=args.duration or (8.0 if args.quick else 60.0),
                )
                for system in systems
            ]
            print(slot_lag.format_table(lag_runs))
            for run in lag_runs:
                for error in run.errors:
                    print(f"! {run.system}: {error}")
            out = [r.as_dict() for r in lag_runs]
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("throughput", "lag"))
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: a private one)")
    p.add_argument("--system", nargs="+", choices=SYSTEMS)
    p.add_argument("-k", "--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("-n", type=int, default=None)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_cli(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
