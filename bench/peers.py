"""The peers' side of the side-by-side runs: runs inside ``bench/.venv-peers`` (see
``requirements-peers.txt``), never in the library's environment, and imports nothing from it.

    bench/.venv-peers/bin/python bench/peers.py setup   SYSTEM --conn '{"host": ...}'
    bench/.venv-peers/bin/python bench/peers.py enqueue SYSTEM --conn ... -n 20000
    bench/.venv-peers/bin/python bench/peers.py worker  SYSTEM --conn ... --mode throughput|lag

SYSTEM is ``pgqueuer``, ``procrastinate`` or ``apscheduler``; ``--conn`` holds libpq
parameters (host, port, user, dbname) of a database on this machine. ``peers_run.py`` (in the
library's environment) drives these commands, times them and checks the results, with the
same parent logic as our own harnesses.

Settings, as in shared/BENCHMARK-TARGETS.md:

* pgqueuer: ``PgQueuer.run(batch_size=25)`` under uvloop (its CLI default); throughput runs in
  ``QueueExecutionMode.drain`` (returns once the queue is empty); the 1-second schedule is the
  cron ``* * * * * *`` (seconds field) of ``@pgq.schedule``.
* procrastinate: ``run_worker_async(concurrency=10)`` (``wait=False`` for throughput: returns
  once no job is left); the schedule is ``@app.periodic(cron="* * * * * *")``.
* APScheduler 4: ``AsyncScheduler`` over ``SQLAlchemyDataStore`` (asyncpg) and
  ``AsyncpgEventBroker``; worker role and the task's ``max_running_jobs=None`` for throughput;
  ``IntervalTrigger(seconds=1)`` schedules (role both) for slot lag.

Worker protocol (stdout lines): ``ready``; then on stdin ``go`` (throughput) and ``stop``;
at the end it writes its result file (JSON) and prints ``done``. Every loop and wait is
bounded by ``--deadline`` (a ``time.monotonic()`` value).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SYSTEMS = ("pgqueuer", "procrastinate", "apscheduler")
EXECUTED: list[int] = []
LAG_RECORDS: list[dict[str, Any]] = []


def _read_stdin(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line.strip())
    loop.call_soon_threadsafe(queue.put_nowait, "eof")


def _commands() -> asyncio.Queue[str]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_read_stdin, args=(loop, queue), daemon=True).start()
    return queue


async def _next_command(queue: asyncio.Queue[str], deadline: float, *wanted: str) -> str:
    """The next of ``wanted`` (or ``eof``); ``timeout`` when the deadline passes."""
    try:
        async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
            for _ in range(1000):
                command = await queue.get()
                if command in wanted or command == "eof":
                    return command
    except TimeoutError:
        pass
    return "timeout"


def _dsn(conn: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in conn.items())


def _sqlalchemy_url(conn: dict[str, str]) -> str:
    from sqlalchemy.engine import URL

    return URL.create(
        "postgresql+asyncpg",
        username=conn.get("user"),
        password=conn.get("password"),
        database=conn["dbname"],
        query={"host": conn["host"], "port": conn["port"]},
    ).render_as_string(hide_password=False)


async def _asyncpg(conn: dict[str, str]) -> Any:
    import asyncpg

    return await asyncpg.connect(
        host=conn["host"],
        port=int(conn["port"]),
        user=conn.get("user"),
        password=conn.get("password"),
        database=conn["dbname"],
    )


# -- no-op functions (module level: APScheduler stores a reference to them) -------------------


async def noop(i: int) -> None:
    EXECUTED.append(i)


async def lag_probe(key: str) -> None:
    from apscheduler import current_job

    started = time.time()
    job = current_job.get()
    fire = job.scheduled_fire_time
    LAG_RECORDS.append(
        {
            "key": key,
            "slot": fire.timestamp() if fire is not None else None,
            "start": started,
            "pid": os.getpid(),
        }
    )


# -- pgqueuer -------------------------------------------------------------------------------


async def pgqueuer_setup(conn: dict[str, str]) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    connection = await _asyncpg(conn)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def pgqueuer_enqueue(conn: dict[str, str], n: int) -> float:
    from pgqueuer import AsyncpgDriver, Queries

    connection = await _asyncpg(conn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        started = time.monotonic()
        await queries.enqueue(["noop"] * n, [str(i).encode() for i in range(n)], [0] * n)
        return time.monotonic() - started
    finally:
        await connection.close()


async def pgqueuer_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver, PgQueuer
    from pgqueuer.models import Job, Schedule
    from pgqueuer.types import QueueExecutionMode

    connection = await _asyncpg(conn)
    pgq = PgQueuer(AsyncpgDriver(connection))
    commands = _commands()
    out: dict[str, Any] = {}
    if args.mode == "throughput":

        @pgq.entrypoint("noop")
        async def run_noop(job: Job) -> None:
            EXECUTED.append(int(job.payload or b"-1"))

        print("ready", flush=True)
        if await _next_command(commands, args.deadline, "go") == "go":
            out["start"] = time.monotonic()
            runner = asyncio.create_task(pgq.run(batch_size=25, mode=QueueExecutionMode.drain))
            await _until(runner, commands, args.deadline)
            out["end"] = time.monotonic() if runner.done() else None
    else:
        for j in range(args.jobs):
            key = f"lag{j}"

            def make(key: str) -> Callable[[Schedule], Any]:
                async def probe(schedule: Schedule) -> None:
                    LAG_RECORDS.append(
                        {
                            "key": key,
                            "start": time.time(),
                            "next_run": schedule.next_run.timestamp(),
                            "pid": os.getpid(),
                        }
                    )

                return probe

            pgq.schedule(key, "* * * * * *")(make(key))
        runner = asyncio.create_task(pgq.run(batch_size=25))
        await asyncio.sleep(0.5)  # its schedules are inserted at the start of run()
        print("ready", flush=True)
        await _next_command(commands, args.deadline, "stop")
        pgq.shutdown.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            async with asyncio.timeout(30):
                await runner
    with contextlib.suppress(Exception):
        await connection.close()
    return out


async def _until(runner: asyncio.Task[Any], commands: asyncio.Queue[str], deadline: float) -> None:
    """Wait for ``runner`` to return by itself (drain) or for ``stop``; then make it stop."""
    stop = asyncio.create_task(_next_command(commands, deadline, "stop"))
    await asyncio.wait({runner, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not runner.done():
        runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await runner
    if not stop.done():
        await _wait_stop(stop)


async def _wait_stop(stop: asyncio.Task[str]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await stop


# -- procrastinate --------------------------------------------------------------------------


def _procrastinate_app(conn: dict[str, str]) -> Any:
    import procrastinate

    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_dsn(conn)))


async def procrastinate_setup(conn: dict[str, str]) -> None:
    app = _procrastinate_app(conn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_enqueue(conn: dict[str, str], n: int) -> float:
    app = _procrastinate_app(conn)

    @app.task(name="noop")
    async def run_noop(i: int) -> None:
        EXECUTED.append(i)

    async with app.open_async():
        started = time.monotonic()
        for chunk in range(0, n, 5000):
            await run_noop.batch_defer_async(
                *({"i": i} for i in range(chunk, min(n, chunk + 5000)))
            )
        return time.monotonic() - started


async def procrastinate_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    app = _procrastinate_app(conn)
    commands = _commands()
    out: dict[str, Any] = {}
    if args.mode == "throughput":

        @app.task(name="noop")
        async def run_noop(i: int) -> None:
            EXECUTED.append(i)

        async with app.open_async():
            print("ready", flush=True)
            if await _next_command(commands, args.deadline, "go") == "go":
                out["start"] = time.monotonic()
                runner = asyncio.create_task(
                    app.run_worker_async(concurrency=10, wait=False, install_signal_handlers=False)
                )
                await _until(runner, commands, args.deadline)
                out["end"] = time.monotonic() if runner.done() else None
        return out
    for j in range(args.jobs):
        key = f"lag{j}"

        def make(key: str) -> Callable[[int], Any]:
            async def probe(timestamp: int) -> None:
                LAG_RECORDS.append(
                    {"key": key, "slot": float(timestamp), "start": time.time(), "pid": os.getpid()}
                )

            probe.__name__ = key
            return probe

        app.periodic(cron="* * * * * *", periodic_id=key)(app.task(name=key)(make(key)))
    async with app.open_async():
        runner = asyncio.create_task(
            app.run_worker_async(concurrency=10, install_signal_handlers=False)
        )
        print("ready", flush=True)
        await _next_command(commands, args.deadline, "stop")
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
            async with asyncio.timeout(30):
                await runner
    return out


# -- APScheduler 4 ----------------------------------------------------------------------------


def _apscheduler(conn: dict[str, str], role: str) -> Any:
    from apscheduler import AsyncScheduler, SchedulerRole
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(_sqlalchemy_url(conn))
    return AsyncScheduler(
        SQLAlchemyDataStore(engine),
        AsyncpgEventBroker.from_async_sqla_engine(engine),
        role=SchedulerRole[role],
    ), engine


async def apscheduler_setup(conn: dict[str, str]) -> None:
    scheduler, engine = _apscheduler(conn, "scheduler")
    async with scheduler:
        pass
    await engine.dispose()


async def apscheduler_enqueue(conn: dict[str, str], n: int) -> float:
    """No batch API: ``add_job`` one by one (50 in flight at a time)."""
    scheduler, engine = _apscheduler(conn, "scheduler")
    async with scheduler:
        await scheduler.configure_task("noop", func=noop, max_running_jobs=None)
        started = time.monotonic()
        for chunk in range(0, n, 50):
            await asyncio.gather(
                *(scheduler.add_job("noop", args=[i]) for i in range(chunk, min(n, chunk + 50)))
            )
        seconds = time.monotonic() - started
    await engine.dispose()
    return seconds


async def apscheduler_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    from apscheduler import ConflictPolicy, JobReleased
    from apscheduler.triggers.interval import IntervalTrigger

    commands = _commands()
    out: dict[str, Any] = {}
    if args.mode == "throughput":
        scheduler, engine = _apscheduler(conn, "worker")
        last: list[float] = []

        def released(event: JobReleased) -> None:
            if event.scheduler_id == scheduler.identity:
                last[:] = [time.monotonic()]

        async with scheduler:
            await scheduler.configure_task("noop", func=noop, max_running_jobs=None)
            scheduler.subscribe(released, {JobReleased})
            print("ready", flush=True)
            if await _next_command(commands, args.deadline, "go") == "go":
                out["start"] = time.monotonic()
                await scheduler.start_in_background()
                await _next_command(commands, args.deadline, "stop")
                out["end"] = last[0] if last else None
            await scheduler.stop()
        await engine.dispose()
        return out
    scheduler, engine = _apscheduler(conn, "both")
    async with scheduler:
        for j in range(args.jobs):
            key = f"lag{j}"
            await scheduler.add_schedule(
                lag_probe,
                IntervalTrigger(seconds=1),
                id=key,
                args=[key],
                conflict_policy=ConflictPolicy.do_nothing,
            )
        await scheduler.start_in_background()
        print("ready", flush=True)
        await _next_command(commands, args.deadline, "stop")
        await scheduler.stop()
    await engine.dispose()
    return out


# -- command line -----------------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> int:
    conn = json.loads(args.conn)
    system = args.system
    if args.command == "setup":
        await globals()[f"{system}_setup"](conn)
        print("ok", flush=True)
        return 0
    if args.command == "enqueue":
        seconds = await globals()[f"{system}_enqueue"](conn, args.n)
        print(json.dumps({"seconds": seconds, "n": args.n}), flush=True)
        return 0
    out = await globals()[f"{system}_worker"](args, conn)
    out |= {"executed": EXECUTED, "records": LAG_RECORDS, "pid": os.getpid()}
    await asyncio.to_thread(Path(args.result).write_text, json.dumps(out))
    print("done", flush=True)
    return 0


def versions() -> dict[str, str]:
    from importlib.metadata import version

    names = ("pgqueuer", "procrastinate", "apscheduler", "psycopg", "asyncpg", "sqlalchemy")
    out = {name: version(name) for name in names}
    out["uvloop"] = version("uvloop")
    out["python"] = sys.version.split()[0]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=("setup", "enqueue", "worker", "versions"))
    p.add_argument("system", nargs="?", choices=SYSTEMS)
    p.add_argument("--conn", default="{}", help="libpq parameters as JSON")
    p.add_argument("-n", type=int, default=20_000)
    p.add_argument("--mode", choices=("throughput", "lag"), default="throughput")
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--result")
    p.add_argument("--deadline", type=float, default=None)
    args = p.parse_args(argv)
    if args.command == "versions":
        print(json.dumps(versions()))
        return 0
    if args.deadline is None:
        args.deadline = time.monotonic() + 900
    if args.system == "pgqueuer" and args.command == "worker":
        import uvloop

        return uvloop.run(_main(args))
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
