"""Slot lag of recurring jobs: how late each slot's ``execute()`` starts, with the default
polling interval (PT10S), across several processes.

    python bench/slot_lag.py          # private PostgreSQL; 10 jobs x 1 s, 2 processes, 60 s
    python bench/slot_lag.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/slot_lag.py --quick            # 3 jobs, 8 s

Each worker process (this script with ``--worker``) registers J recurring jobs with a
``FIXED_RATE`` schedule of P seconds and otherwise the library's defaults (polling interval
PT10S, heartbeat PT10S, lock-and-fetch, LISTEN/NOTIFY). A job records, as the first thing its
``execute`` does, ``time.time()`` and ``ctx.execution_time`` (the slot). Every process runs on
this machine, so the database's clock and ours are the same clock.

After every worker has reached the database (``wait_until_ready``), the harness lets them run
a warm-up, then measures a window of D seconds, and stops them a few seconds after the window
(so the window's last slots have run). Over the slots whose intended time lies in the window:

* lag = start of ``execute()`` - the slot's time: p50 / p99 / max;
* duplicates: executions of a (job, slot) beyond the first;
* skipped slots: slots of the fixed-rate grid that no process ran.

The parent logic (``run_lag_workers``) is shared with the peers' runs (``peers_run.py``).
Every wait is bounded; the server must be on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from bench import common, lagstats
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import lagstats  # type: ignore[no-redef]

THIS_FILE = Path(__file__).resolve()
DEFAULT_JOBS = 10
DEFAULT_DURATION = 60.0
DEFAULT_PROCESSES = 2
DEFAULT_PERIOD = 1.0
WARMUP = 3.0
TAIL = 5.0
"""Seconds the workers keep running after the window, so that its last slots run (a peer
whose lag is seconds would otherwise show them as skipped)."""


@dataclasses.dataclass
class LagRun:
    """What one slot-lag run measured."""

    system: str
    processes: int
    jobs: int
    period: float
    duration: float
    result: lagstats.LagResult | None
    errors: list[str]
    settings: str = ""
    breakdown: dict[str, dict[str, float | None]] | None = None
    """Ours only: p50/p99/max ms of each part of the lag (see ``lag_breakdown``)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "breakdown": self.breakdown,
            "system": self.system,
            "processes": self.processes,
            "jobs": self.jobs,
            "period": self.period,
            "duration": self.duration,
            "settings": self.settings,
            "errors": self.errors,
            "result": self.result.as_dict() if self.result else None,
        }


async def run_lag_workers(
    worker_args: Callable[[int, Path], list[str]],
    *,
    processes: int,
    duration: float,
    warmup: float = WARMUP,
    tail: float = TAIL,
    startup_timeout: float = 120.0,
) -> tuple[list[dict[str, Any]], tuple[float, float], list[str], list[int]]:
    """Spawn ``processes`` workers, measure a window, stop them; (records, window, errors,
    pids). A worker prints ``ready`` once it can run slots, stops on a ``stop`` line, writes
    its records (a JSON list) to the file it was given and prints ``done``."""
    errors: list[str] = []
    records: list[dict[str, Any]] = []
    children: list[common.Child] = []
    with tempfile.TemporaryDirectory(prefix="ekbatan-lag-") as work:
        results = [Path(work) / f"worker-{i}.json" for i in range(processes)]
        try:
            for index in range(processes):
                children.append(
                    await common.Child.spawn(
                        worker_args(index, results[index]),
                        Path(work) / f"worker-{index}.log",
                        f"worker {index}",
                    )
                )
            await asyncio.gather(*(c.expect("ready", startup_timeout) for c in children))
            ready = time.time()
            window = (ready + warmup, ready + warmup + duration)
            await asyncio.sleep(warmup + duration + tail)
            for child in children:
                if child.proc.returncode is not None:
                    errors.append(f"{child.name} exited during the run:\n{common.tail(child.log)}")
            await asyncio.gather(*(c.send("stop") for c in children))
            done = await asyncio.gather(
                *(c.expect("done", 90.0) for c in children), return_exceptions=True
            )
            for child, outcome in zip(children, done, strict=True):
                if isinstance(outcome, BaseException):
                    errors.append(f"{child.name}: {outcome}")
            for child, path in zip(children, results, strict=True):
                try:
                    loaded = json.loads(path.read_text())
                    # ours: a list of records; the peers' workers: {"records": [...], ...}
                    records += loaded["records"] if isinstance(loaded, dict) else loaded
                except (OSError, ValueError) as exc:
                    errors.append(
                        f"{child.name}: no records ({exc}); log:\n{common.tail(child.log)}"
                    )
            pids = [c.pid for c in children]
        finally:
            await asyncio.gather(*(c.close(30.0) for c in children), return_exceptions=True)
    return records, window, errors, pids


async def run_ours(
    server: common.ServerInfo,
    *,
    processes: int = DEFAULT_PROCESSES,
    jobs: int = DEFAULT_JOBS,
    duration: float = DEFAULT_DURATION,
    period: float = DEFAULT_PERIOD,
    warmup: float = WARMUP,
    polling_interval: float | None = None,
    cprofile_dir: Path | None = None,
    claim_ahead: float = 0.0,
    gc_freeze: bool = False,
    record_missed_slots: bool = True,
    checkin_url: str | None = None,
    overlap: float = 0.0,
) -> LagRun:
    """``record_missed_slots`` (the setting), ``checkin_url`` (a ``CheckIns`` observer pinging
    it for every job) and ``overlap`` (each run lasts this many periods: slots pass while it
    goes) are for bench/missed_cost.py."""
    async with common.fresh_schema(server.url, "ekbatan_lag") as db_url:
        deadline = time.monotonic() + warmup + duration + 300

        def args(index: int, result: Path) -> list[str]:
            cmd = [sys.executable, str(THIS_FILE), "--worker", "--url", db_url]
            cmd += ["--jobs", str(jobs), "--period", repr(period), "--result", str(result)]
            cmd += ["--deadline", repr(deadline), "--index", str(index)]
            if polling_interval is not None:
                cmd += ["--polling-interval", repr(polling_interval)]
            if claim_ahead:
                cmd += ["--claim-ahead", repr(claim_ahead)]
            if gc_freeze:
                cmd.append("--gc-freeze")
            if not record_missed_slots:
                cmd.append("--no-missed-slots")
            if checkin_url is not None:
                cmd += ["--checkin-url", checkin_url]
            if overlap:
                cmd += ["--overlap", repr(overlap)]
            if cprofile_dir is not None:
                cprofile_dir.mkdir(parents=True, exist_ok=True)
                cmd += ["--cprofile", str(cprofile_dir / f"slot-lag-worker-{index}.pstats")]
            return cmd

        records, window, errors, _ = await run_lag_workers(
            args, processes=processes, duration=duration, warmup=warmup
        )
    keys = [f"lag-{j}" for j in range(jobs)]
    result = lagstats.analyze(records, period, window, keys) if records else None
    breakdown = lag_breakdown(records, window)
    interval = f"PT{polling_interval:g}S" if polling_interval else "PT10S (default)"
    return LagRun(
        system="ekbatan-fastapi",
        processes=processes,
        jobs=jobs,
        period=period,
        duration=duration,
        result=result,
        errors=errors,
        settings=f"FIXED_RATE|PT{period:g}S, polling interval {interval}, lock-and-fetch"
        + ("" if common.is_mysql_url(server.url) else ", LISTEN/NOTIFY on")
        + (f", claim_ahead PT{claim_ahead:g}S" if claim_ahead else "")
        + (", gc.freeze()" if gc_freeze else ""),
        breakdown=breakdown,
    )


def lag_breakdown(
    records: Sequence[dict[str, Any]], window: tuple[float, float]
) -> dict[str, dict[str, float | None]] | None:
    """Each part of the lag of the slots in ``window``: the wake-up (the claiming poll's start
    - the slot: timer, the scheduler's 2 ms margin, a busy event loop or CPU), the poll (its
    round trip) and the launch (the poll's end - the start of ``execute``)."""
    parts: dict[str, list[float]] = {"wake-up": [], "poll": [], "launch": [], "total": []}
    for r in records:
        if "poll_start" not in r or not window[0] <= r["slot"] <= window[1]:
            continue
        parts["wake-up"].append(r["poll_start"] - r["slot"])
        parts["poll"].append(r["poll_end"] - r["poll_start"])
        parts["launch"].append(r["start"] - r["poll_end"])
        parts["total"].append(r["start"] - r["slot"])
    if not parts["total"]:
        return None
    return {name: common.summarize_ms(values) for name, values in parts.items()}


def format_breakdown(run: LagRun) -> str:
    if not run.breakdown:
        return ""
    lines = [
        "| part of the lag | p50 ms | p99 ms | max ms | mean ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, s in run.breakdown.items():
        lines.append(
            f"| {name} | {common.fmt_ms(s['p50'])} | {common.fmt_ms(s['p99'])} | "
            f"{common.fmt_ms(s['max'])} | {common.fmt_ms(s['mean'])} |"
        )
    return "\n".join(lines)


def format_table(runs: Sequence[LagRun]) -> str:
    lines = [
        "| system | processes | jobs x period | slots (window) | lag p50 ms | p99 ms | max ms "
        "| duplicates | skipped | settings |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        r = run.result
        if r is None:
            lines.append(
                f"| {run.system} | {run.processes} | {run.jobs} x {run.period:g} s | n/a | n/a "
                f"| n/a | n/a | n/a | n/a | {'; '.join(run.errors)[:200] or run.settings} |"
            )
            continue
        lines.append(
            f"| {run.system} | {run.processes} | {run.jobs} x {run.period:g} s | "
            f"{r.slots_expected} | {common.fmt_ms(r.p50_ms)} | {common.fmt_ms(r.p99_ms)} | "
            f"{common.fmt_ms(r.max_ms)} | {r.duplicates} | {r.skipped} | {run.settings} |"
        )
    return "\n".join(lines)


# -- the worker -----------------------------------------------------------------------------


def _settings(args: argparse.Namespace, traced: Any) -> Callable[[Any], None]:
    """A lag worker's scheduler settings beyond the defaults, from its command line."""

    def customize(b: Any) -> None:
        b.observer(traced)
        if args.claim_ahead:
            b.claim_ahead(dt.timedelta(seconds=args.claim_ahead))
        if args.no_missed_slots:
            b.record_missed_slots(False)
        if args.checkin_url:
            from ekbatan_fastapi.checkin import CheckIns

            b.observer(CheckIns({f"lag-{j}": args.checkin_url for j in range(args.jobs)}))

    return customize


async def _worker(args: argparse.Namespace) -> int:
    from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules

    records: list[dict[str, Any]] = []

    class LagJob(DistributedJob):
        def __init__(self, name: str) -> None:
            self._name = name

        def name(self) -> str:
            return self._name

        def schedule(self) -> Schedule:
            return Schedules.fixed_rate(dt.timedelta(seconds=args.period))

        async def execute(self, ctx: ExecutionContext) -> None:
            started = time.time()
            records.append(
                {
                    "key": self._name,
                    "slot": ctx.execution_time.timestamp(),
                    "start": started,
                    "pid": os.getpid(),
                    "version": ctx.version,
                }
            )
            if args.overlap:
                await asyncio.sleep(args.overlap * args.period)

    from ekbatan_fastapi import SchedulerObserver

    # Where a slot's lag goes: each poll's start and end (wall clock) and what it claimed, so
    # that lag = (poll start - slot) + (poll) + (poll end - execute start). Through an
    # observer of the scheduler; it changes nothing in the scheduler.
    polls: dict[tuple[str, float], tuple[float, float]] = {}

    class Traced(SchedulerObserver):
        def poll_answered(self, result: Any, started: float, seconds: float) -> None:
            for row in result.claimed:
                polls[(row.task_name, row.execution_time.timestamp())] = (
                    started,
                    started + seconds,
                )

    registry = common.worker_registry(
        args.url,
        [LagJob(f"lag-{j}") for j in range(args.jobs)],
        name=f"lag-{args.index}-{os.getpid()}",
        polling_interval=args.polling_interval,
        customize=_settings(args, Traced()),
    )
    commands = common.stdin_commands()
    remaining = max(1.0, args.deadline - time.monotonic())
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    await registry.start()
    try:
        if not await registry.wait_until_ready(min(60.0, remaining)):
            print("failed: not ready", flush=True)
            return 1
        if args.gc_freeze:
            gc.freeze()  # what was made at startup is never scanned again (docs/scheduling.md)
        print("ready", flush=True)
        await common.wait_for_stop(commands, args.deadline)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)
        await registry.stop()
    for record in records:
        traced = polls.get((record["key"], record["slot"]))
        if traced is not None:
            record["poll_start"], record["poll_end"] = traced
    await common.write_result(args.result, records)
    return 0


# -- command line ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.harness_parser(__doc__)
    p.add_argument("-k", "--processes", type=int, default=DEFAULT_PROCESSES)
    p.add_argument("--jobs", type=int, default=None, help=f"recurring jobs ({DEFAULT_JOBS})")
    p.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="schedule, seconds")
    p.add_argument("--duration", type=float, default=None, help="window, seconds (60)")
    p.add_argument("--polling-interval", type=float, default=None, help="default: PT10S")
    p.add_argument(
        "--claim-ahead", type=float, default=0.0, help="seconds (claim_ahead; default 0)"
    )
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="each worker calls gc.freeze() once started (docs/schedules.md)",
    )
    p.add_argument("--quick", action="store_true", help="3 jobs, 8 s")
    p.add_argument("--json", type=Path)
    p.add_argument("--cprofile-dir", type=Path, help="cProfile each worker")
    # worker mode (internal)
    common.add_worker_arguments(p)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--cprofile", help=argparse.SUPPRESS)
    p.add_argument("--no-missed-slots", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkin-url", help=argparse.SUPPRESS)
    p.add_argument("--overlap", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        args.jobs = args.jobs or DEFAULT_JOBS
        return asyncio.run(_worker(args))
    jobs = args.jobs or (3 if args.quick else DEFAULT_JOBS)
    duration = args.duration or (8.0 if args.quick else DEFAULT_DURATION)
    with common.private_postgres(args.url) as server:
        run = asyncio.run(
            run_ours(
                server,
                processes=args.processes,
                jobs=jobs,
                duration=duration,
                period=args.period,
                polling_interval=args.polling_interval,
                claim_ahead=args.claim_ahead,
                gc_freeze=args.gc_freeze,
                cprofile_dir=args.cprofile_dir,
            )
        )
        kind = server.kind
    print(f"server: {kind}")
    print(format_table([run]))
    print(format_breakdown(run))
    for error in run.errors:
        print(f"! {error}")
    if run.result is not None:
        r = run.result
        print(f"executions {r.executions}, per process {r.per_process}, min {r.min_ms:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(run.as_dict(), indent=2))
    return 0 if run.result is not None and not run.errors else 1


if __name__ == "__main__":
    sys.exit(main())
