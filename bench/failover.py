"""Failover: SIGKILL the instance executing a job; how long until another instance starts it.

    python bench/failover.py                    # private PostgreSQL; 20 trials, the defaults
    python bench/failover.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/failover.py --url mysql+asyncmy://root@127.0.0.1:3306/test   # MySQL/MariaDB
    python bench/failover.py --liveness-lock off --heartbeat 1 --limit 4      # the dead window
    python bench/failover.py --quick            # 3 trials

Two worker processes (this script with ``--worker``) run a scheduler each with the library's
defaults (polling interval PT10S, heartbeat PT10S x 6: a dead window of 60 s; the liveness lock
on), or the ``--heartbeat`` / ``--limit`` / ``--liveness-lock`` given. Both know one one-time
job whose ``execute`` prints ``start <instance> <monotonic time> <pid>`` and then waits until
the harness releases it.

Each trial schedules a new instance (due now; on PostgreSQL LISTEN/NOTIFY wakes both workers,
elsewhere the next poll finds it). The worker that starts it is SIGKILLed at once (a few ms
after its claim, which is the freshest heartbeat the row gets: the worst case for the dead
window). The failover time is the survivor's start of the same instance minus the moment of
the kill (``time.monotonic``, one clock for every process on Linux). A replacement worker is
then started, so every trial begins with two live instances.

Goal: with the liveness lock, p99 <= 2 s over 20 trials (issue #31, "Failover at the speed of
the crash"); without it, at most dead window + one heartbeat interval + 100 ms. Every wait is
bounded; the server must be on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

THIS_FILE = Path(__file__).resolve()
JOB = "failover-probe"
HEARTBEAT = 10.0
LIMIT = 6
"""The library's defaults (heartbeat PT10S x 6)."""
LIVENESS_GOAL = 2.0
"""Seconds, p99, with the liveness lock."""
DEFAULT_TRIALS = 20


@dataclasses.dataclass
class Trial:
    index: int
    first_pid: int | None
    second_pid: int | None
    kill_delay_ms: float | None
    """From the first start to the kill (how long the victim ran)."""
    failover_s: float | None
    error: str | None = None


@dataclasses.dataclass
class FailoverRun:
    trials: list[Trial]
    heartbeat: float
    limit: int
    goal_s: float
    liveness_lock: str = "auto"
    database: str = "postgresql"

    @property
    def times(self) -> list[float]:
        return [t.failover_s for t in self.trials if t.failover_s is not None]

    def summary(self) -> dict[str, Any]:
        times = self.times
        return {
            "trials": len(self.trials),
            "ok": len(times),
            "p50_s": common.percentile(times, 50),
            "p99_s": common.percentile(times, 99),
            "max_s": max(times) if times else None,
            "min_s": min(times) if times else None,
            "goal_s": self.goal_s,
            "dead_after_s": self.heartbeat * self.limit,
            "liveness_lock": self.liveness_lock,
            "database": self.database,
        }

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "trials": [dataclasses.asdict(t) for t in self.trials]}


class _Pool:
    """The live workers and one queue of every line they print: (child, line)."""

    def __init__(
        self,
        db_url: str,
        work: Path,
        deadline: float,
        heartbeat: float,
        limit: int,
        liveness_lock: str = "auto",
    ) -> None:
        self.db_url = db_url
        self.heartbeat = heartbeat
        self.limit = limit
        self.liveness_lock = liveness_lock
        self.work = work
        self.deadline = deadline
        self.children: list[common.Child] = []
        self.lines: asyncio.Queue[tuple[common.Child, str]] = asyncio.Queue()
        self._readers: list[asyncio.Task[None]] = []
        self._count = 0

    async def spawn(self) -> common.Child:
        index = self._count
        self._count += 1
        args = [sys.executable, str(THIS_FILE), "--worker", "--url", self.db_url]
        args += ["--release-dir", str(self.work), "--deadline", repr(self.deadline)]
        args += ["--index", str(index), "--heartbeat", repr(self.heartbeat)]
        args += ["--limit", str(self.limit), "--liveness-lock", self.liveness_lock]
        child = await common.Child.spawn(args, self.work / f"worker-{index}.log", f"worker {index}")
        self.children.append(child)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._readers.append(asyncio.create_task(self._read(child, ready)))
        async with asyncio.timeout(120):
            await ready
        return child

    async def _read(self, child: common.Child, ready: asyncio.Future[None]) -> None:
        assert child.proc.stdout is not None
        for _ in range(1_000_000):
            raw = await child.proc.stdout.readline()
            if not raw:
                if not ready.done():
                    ready.set_exception(
                        RuntimeError(f"{child.name} exited; log:\n{common.tail(child.log)}")
                    )
                return
            line = raw.decode().strip()
            if line == "ready" and not ready.done():
                ready.set_result(None)
            else:
                self.lines.put_nowait((child, line))

    async def wait_start(self, instance: str, within: float) -> tuple[common.Child, float]:
        """The next ``start <instance>`` line: (child, its monotonic timestamp)."""
        async with asyncio.timeout(within):
            while True:
                child, line = await self.lines.get()
                parts = line.split()
                if len(parts) == 4 and parts[0] == "start" and parts[1] == instance:
                    return child, float(parts[2])

    async def close(self) -> None:
        # the readers first: Child.close drains stdout itself (one reader per stream)
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                if child.proc.returncode is None:
                    child.proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(c.close(30.0) for c in self.children), return_exceptions=True)


async def run_failover(
    server: common.ServerInfo,
    *,
    trials: int = DEFAULT_TRIALS,
    heartbeat: float = HEARTBEAT,
    limit: int = LIMIT,
    liveness_lock: str = "auto",
    verbose: bool = True,
) -> FailoverRun:
    from ekbatan_fastapi import OneTimeJob, SchedulerClient, create_schema
    from ekbatan_fastapi.store.dialects import open_store

    class Probe(OneTimeJob):
        def name(self) -> str:
            return JOB

        async def execute(self, ctx: Any) -> None:  # never run here: only for the client
            return None

    goal = LIVENESS_GOAL if liveness_lock != "off" else heartbeat * limit + heartbeat + 0.1
    results: list[Trial] = []
    async with common.fresh_database(server.url, "ekbatan_failover") as db_url:
        engine = create_async_engine(db_url, poolclass=NullPool)
        database = engine.dialect.name
        try:
            await create_schema(engine)
            client = SchedulerClient(open_store(engine, database), {JOB: Probe()})
            with tempfile.TemporaryDirectory(prefix="ekbatan-failover-") as work:
                deadline = time.monotonic() + trials * (heartbeat * (limit + 2) + 60) + 120
                pool = _Pool(db_url, Path(work), deadline, heartbeat, limit, liveness_lock)
                try:
                    await asyncio.gather(pool.spawn(), pool.spawn())
                    for index in range(trials):
                        trial = await _trial(pool, client, index, heartbeat, limit)
                        results.append(trial)
                        if verbose:
                            shown = (
                                f"{trial.failover_s:.3f} s"
                                if trial.failover_s is not None
                                else f"FAILED {trial.error}"
                            )
                            print(f"trial {index + 1}/{trials}: failover {shown}", flush=True)
                        await pool.spawn()  # back to two live instances
                finally:
                    await pool.close()
        finally:
            await engine.dispose()
    return FailoverRun(results, heartbeat, limit, goal, liveness_lock, database)


async def _trial(pool: _Pool, client: Any, index: int, heartbeat: float, limit: int) -> Trial:
    instance = f"t{index}"
    await client.schedule(JOB, instance)
    try:  # (without notifications, the next poll finds it: within a polling interval)
        victim, first_start = await pool.wait_start(instance, 40.0)
    except TimeoutError:
        return Trial(index, None, None, None, None, "nobody started the instance within 40 s")
    killed_at = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim.pid, signal.SIGKILL)
    await victim.proc.wait()
    pool.children.remove(victim)
    within = heartbeat * (limit + 2) + 20.0
    try:
        survivor, second_start = await pool.wait_start(instance, within)
    except TimeoutError:
        return Trial(
            index,
            victim.pid,
            None,
            (killed_at - first_start) * 1000,
            None,
            f"not restarted within {within:.0f} s",
        )
    (pool.work / f"release-{instance}").touch()
    return Trial(
        index,
        victim.pid,
        survivor.pid,
        (killed_at - first_start) * 1000,
        second_start - killed_at,
    )


def format_table(run: FailoverRun) -> str:
    s = run.summary()

    def sec(value: float | None) -> str:
        return f"{value:.3f}" if value is not None else "n/a"

    return "\n".join(
        [
            "| database | liveness lock | heartbeat x limit | dead after | trials ok "
            "| failover p50 s | p99 s | max s | min s | goal (p99) |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {run.database} | {run.liveness_lock} | {run.heartbeat:g} s x {run.limit} | "
            f"{s['dead_after_s']:g} s | "
            f"{s['ok']}/{s['trials']} | {sec(s['p50_s'])} | {sec(s['p99_s'])} | "
            f"{sec(s['max_s'])} | {sec(s['min_s'])} | <= {run.goal_s:.1f} s |",
        ]
    )


# -- the worker -----------------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> int:
    from ekbatan_fastapi import ExecutionContext, OneTimeJob, SchedulerBuilder

    release_dir = Path(args.release_dir)

    class Probe(OneTimeJob):
        def name(self) -> str:
            return JOB

        async def execute(self, ctx: ExecutionContext) -> None:
            print(f"start {ctx.task_instance} {time.monotonic()!r} {os.getpid()}", flush=True)
            release = release_dir / f"release-{ctx.task_instance}"
            for _ in range(2400):  # at most 120 s
                if release.exists() or ctx.is_shutting_down:
                    return
                await asyncio.sleep(0.05)

    def customize(b: SchedulerBuilder) -> None:
        b.heartbeat_interval(dt.timedelta(seconds=args.heartbeat))
        b.missed_heartbeats_limit(args.limit)
        b.liveness_lock(args.liveness_lock)

    registry = common.worker_registry(
        args.url,
        [Probe()],
        name=f"failover-{args.index}-{os.getpid()}",
        shutdown_max_wait=2.0,
        customize=customize,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    commands = common.stdin_commands()
    await registry.start()
    try:
        if not await registry.wait_until_ready(60.0):
            return 1
        print("ready", flush=True)
        waiter = asyncio.create_task(commands.get())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait(
            {waiter, stopper},
            timeout=max(1.0, args.deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        waiter.cancel()
        stopper.cancel()
    finally:
        await registry.stop()
    return 0


# -- command line ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.harness_parser(__doc__)
    p.add_argument("--trials", type=int, default=None, help=f"({DEFAULT_TRIALS})")
    p.add_argument("--heartbeat", type=float, default=HEARTBEAT, help="seconds (10)")
    p.add_argument("--limit", type=int, default=LIMIT, help="missed heartbeats limit (6)")
    p.add_argument("--liveness-lock", choices=("auto", "on", "off"), default="auto", help="(auto)")
    p.add_argument("--quick", action="store_true", help="3 trials")
    p.add_argument("--json", type=Path)
    # worker mode (internal)
    common.add_worker_arguments(p)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--release-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        return asyncio.run(_worker(args))
    trials = args.trials or (3 if args.quick else DEFAULT_TRIALS)
    with common.private_postgres(args.url) as server:
        run = asyncio.run(
            run_failover(
                server,
                trials=trials,
                heartbeat=args.heartbeat,
                limit=args.limit,
                liveness_lock=args.liveness_lock,
            )
        )
    print(format_table(run))
    if args.json:
        args.json.write_text(json.dumps(run.as_dict(), indent=2))
    return 0 if len(run.times) == trials else 1


if __name__ == "__main__":
    sys.exit(main())
