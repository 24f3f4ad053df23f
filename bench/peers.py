"""The peers' side of the side-by-side runs: runs inside ``bench/.venv-peers`` (see
``requirements-peers.txt``), never in the library's environment, and imports nothing from it.

    bench/.venv-peers/bin/python bench/peers.py setup   SYSTEM --conn '{"host": ...}'
    bench/.venv-peers/bin/python bench/peers.py enqueue SYSTEM --conn ... -n 20000
    bench/.venv-peers/bin/python bench/peers.py worker  SYSTEM --conn ... --mode throughput|lag

SYSTEM is ``pgqueuer``, ``procrastinate``, ``apscheduler``, ``oban``, ``dbos`` or ``chancy``;
``--conn`` holds libpq
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
* oban 0.7.0 (Python 3.12+): ``Oban(pool=..., queues={"default": 10})`` (queue limit 10, its
  defaults otherwise: stager 1 s, leader election every 30 s); cron is per minute only
  (``@worker(cron="* * * * *")``), inserted by the elected leader; ``enqueue_many`` batches.
* dbos 3.4.0: ``DBOS(config={"name": "bench", "system_database_url": ..., "executor_id":
  <one per process>})``; throughput through a queue registered with ``DBOS.register_queue``
  (its defaults: no concurrency limit, polled every 1 s), enqueued by ``DBOSClient`` (no batch
  API: 32 in flight); schedules through ``DBOS.apply_schedules`` with the cron
  ``* * * * * *`` (seconds field): every process fires every slot, deduplicated by workflow id.
* chancy 0.26.0: ``Queue("default", concurrency=10, executor=Chancy.Executor.Async,
  eager_polling=True)``, its default plugins (leadership, recovery, pruner, metrics,
  workflows) and, for schedules, ``Cron(poll_interval=1)`` with ``* * * * * *`` (its
  default poll is 60 s: used for the per-minute schedules); ``push_many`` batches.

``--schedule minute`` runs every recurring job on ``* * * * *`` instead of each system's
1-second schedule; ``--record`` also inserts each execution into ``bench_executions``
(system, job, slot, enqueued, pid, start), committed before the function returns, so that
the executions of a process killed with SIGKILL are kept (``owner_death_peers.py``).

Worker protocol (stdout lines): ``ready``; then on stdin ``go`` (throughput) and ``stop``;
at the end it writes its result file (JSON) and prints ``done``. Every loop and wait is
bounded by ``--deadline`` (a ``time.monotonic()`` value).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SYSTEMS = ("pgqueuer", "procrastinate", "apscheduler", "oban", "dbos", "chancy")
SECOND_CRON = "* * * * * *"
MINUTE_CRON = "* * * * *"
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


def _cron(args: argparse.Namespace) -> str:
    """The recurring jobs' cron: each second (a seconds field), or each minute."""
    return SECOND_CRON if args.schedule == "second" else MINUTE_CRON


def _pg_url(conn: dict[str, str]) -> str:
    """A plain ``postgresql://`` URL (socket directory and port in the query), for DBOS."""
    from sqlalchemy.engine import URL

    return URL.create(
        "postgresql",
        username=conn.get("user"),
        password=conn.get("password"),
        database=conn["dbname"],
        query={"host": conn["host"], "port": conn["port"]},
    ).render_as_string(hide_password=False)


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
    await record(key, fire.timestamp() if fire is not None else None, started)


class _Recorder:
    """With ``--record``: each execution as a row of ``bench_executions``, committed before the
    function returns (one autocommit connection per event loop), so that a SIGKILL loses none."""

    def __init__(self) -> None:
        self.system = ""
        self.conn: dict[str, str] | None = None
        self._connections: dict[int, tuple[Any, asyncio.Lock]] = {}

    async def insert(self, row: dict[str, Any]) -> None:
        import psycopg

        assert self.conn is not None
        loop = id(asyncio.get_running_loop())
        if loop not in self._connections:
            connection = await psycopg.AsyncConnection.connect(_dsn(self.conn), autocommit=True)
            self._connections[loop] = (connection, asyncio.Lock())
        connection, lock = self._connections[loop]
        async with lock:
            await connection.execute(
                "INSERT INTO bench_executions "
                "(system, job, slot, enqueued, next_run, pid, start, note) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    self.system,
                    row["key"],
                    row.get("slot"),
                    row.get("enqueued"),
                    row.get("next_run"),
                    row["pid"],
                    row["start"],
                    row.get("note"),
                ),
            )


RECORDER = _Recorder()


async def record(key: str, slot: float | None, start: float, **extra: Any) -> None:
    """One execution of a recurring job: kept in memory (the result file) and, with
    ``--record``, in the database before the function returns."""
    row = {"key": key, "slot": slot, "start": start, "pid": os.getpid(), **extra}
    LAG_RECORDS.append(row)
    if RECORDER.conn is not None:
        await RECORDER.insert(row)


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
                    started = time.time()
                    await record(key, None, started, next_run=schedule.next_run.timestamp())

                return probe

            pgq.schedule(key, _cron(args))(make(key))
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
                await record(key, float(timestamp), time.time())

            probe.__name__ = key
            return probe

        app.periodic(cron=_cron(args), periodic_id=key)(app.task(name=key)(make(key)))
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
    from apscheduler.triggers.cron import CronTrigger
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
                IntervalTrigger(seconds=1)
                if args.schedule == "second"
                else CronTrigger.from_crontab(MINUTE_CRON),
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


# -- shared by the newer peers ------------------------------------------------------------------

LAST: list[float] = []
"""The monotonic time of this process's latest no-op execution (its last completion, to
within the function's own few microseconds)."""


def _executed(i: int) -> None:
    EXECUTED.append(i)
    LAST[:] = [time.monotonic()]


async def _serve(
    args: argparse.Namespace,
    commands: asyncio.Queue[str],
    start: Callable[[], Any],
    out: dict[str, Any],
) -> bool:
    """Throughput: wait for ``go``, call ``start`` (the peer's own start call, timed), wait
    for ``stop``; out gets start and end (the last execution). False without ``go``."""
    if await _next_command(commands, args.deadline, "go") != "go":
        return False
    out["start"] = time.monotonic()
    started = start()
    if asyncio.iscoroutine(started):
        await started
    await _next_command(commands, args.deadline, "stop")
    out["end"] = LAST[0] if LAST else None
    return True


# -- oban ---------------------------------------------------------------------------------------


def _oban_worker_class(name: str, process: Callable[..., Any], cron: str | None = None) -> Any:
    """An Oban worker class named ``name`` in this module (Oban finds a job's worker by its
    module and name, so every process must build the same names)."""
    from oban import worker

    cls = type(name, (), {"process": process, "__module__": __name__, "__qualname__": name})
    if cron is None:
        return worker(queue="default")(cls)
    return worker(queue="default", cron=cron)(cls)


async def _oban_noop(self: Any, job: Any) -> None:
    _executed(int(job.args["i"]))


async def oban_setup(conn: dict[str, str]) -> None:
    from oban import Oban
    from oban.schema import install

    pool = await Oban.create_pool(_dsn(conn))
    try:
        await install(pool)
    finally:
        await pool.close()


async def oban_enqueue(conn: dict[str, str], n: int) -> float:
    from oban import Oban

    noop = _oban_worker_class("ObanNoop", _oban_noop)
    pool = await Oban.create_pool(_dsn(conn))
    try:
        async with Oban(pool=pool) as oban:  # client mode: no queues, no leadership
            started = time.monotonic()
            for chunk in range(0, n, 5000):
                await oban.enqueue_many(
                    noop.new({"i": i}) for i in range(chunk, min(n, chunk + 5000))
                )
            return time.monotonic() - started
    finally:
        await pool.close()


async def oban_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    from datetime import datetime

    from oban import Oban

    commands = _commands()
    out: dict[str, Any] = {}
    pool = await Oban.create_pool(_dsn(conn))
    holder: list[Any] = []
    if args.mode == "throughput":
        _oban_worker_class("ObanNoop", _oban_noop)
    else:
        # Oban's cron has minute precision only: every job on "* * * * *", whatever --schedule
        for j in range(args.jobs):
            key = f"lag{j}"

            def make(key: str) -> Callable[..., Any]:
                async def process(self: Any, job: Any) -> None:
                    started = time.time()
                    slot = datetime.fromisoformat(job.meta["cron_at"]).timestamp()
                    leader = bool(holder and holder[0].is_leader)
                    await record(key, slot, started, note="leader" if leader else "follower")

                return process

            _oban_worker_class(f"ObanLag{j}", make(key), cron=MINUTE_CRON)
    oban = Oban(pool=pool, queues={"default": 10}, node=f"bench-{args.index}-{os.getpid()}")
    holder.append(oban)
    try:
        if args.mode == "throughput":
            print("ready", flush=True)
            if await _serve(args, commands, oban.start, out):
                await oban.stop()
        else:
            await oban.start()
            print("ready", flush=True)
            await _next_command(commands, args.deadline, "stop")
            await oban.stop()
    finally:
        await pool.close()
    return out


# -- dbos ---------------------------------------------------------------------------------------

DBOS_QUEUE = "bench"
DBOS_APP = "bench"


def _dbos(conn: dict[str, str], index: int) -> Any:
    """DBOS configured for this database (``DBOS.launch()`` comes later), with the no-op and
    probe workflows registered (both async: they run on this process's event loop)."""
    from datetime import datetime

    from dbos import DBOS

    DBOS(
        config={
            "name": DBOS_APP,
            "system_database_url": _pg_url(conn),
            "executor_id": f"bench-{index}-{os.getpid()}",
            "log_level": "WARNING",
        }
    )

    @DBOS.workflow(name="noop")
    async def noop_workflow(i: int) -> None:
        _executed(i)

    @DBOS.workflow(name="probe")
    async def probe_workflow(scheduled_at: datetime, context: Any) -> None:
        await record(str(context), scheduled_at.timestamp(), time.time())

    return DBOS, probe_workflow


async def dbos_setup(conn: dict[str, str]) -> None:
    dbos, _ = _dbos(conn, 0)
    dbos.launch()  # creates the system tables (its migrations)
    try:
        await dbos.register_queue_async(DBOS_QUEUE)
    finally:
        await asyncio.to_thread(dbos.destroy, destroy_registry=True)


async def dbos_enqueue(conn: dict[str, str], n: int) -> float:
    """No batch API: ``DBOSClient.enqueue`` from 32 threads at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from dbos import DBOSClient

    def run() -> float:
        client = DBOSClient(
            system_database_url=_pg_url(conn),
            application_name=DBOS_APP,
            system_database_pool_size=32,
        )
        try:
            options: Any = {"queue_name": DBOS_QUEUE, "workflow_name": "noop"}
            started = time.monotonic()
            with ThreadPoolExecutor(32) as pool:
                for _ in pool.map(lambda i: client.enqueue(options, i), range(n)):
                    pass
            return time.monotonic() - started
        finally:
            client.destroy()

    return await asyncio.to_thread(run)


async def dbos_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    commands = _commands()
    out: dict[str, Any] = {}
    dbos, probe = _dbos(conn, args.index)
    try:
        if args.mode == "throughput":
            print("ready", flush=True)
            await _serve(args, commands, dbos.launch, out)
        else:
            dbos.launch()
            await dbos.apply_schedules_async(
                [
                    {
                        "schedule_name": f"lag{j}",
                        "workflow_fn": probe,
                        "schedule": _cron(args),
                        "context": f"lag{j}",
                    }
                    for j in range(args.jobs)
                ]
            )
            print("ready", flush=True)
            await _next_command(commands, args.deadline, "stop")
    finally:
        await asyncio.to_thread(dbos.destroy, destroy_registry=True)
    return out


# -- chancy -------------------------------------------------------------------------------------

CHANCY_QUEUE = "default"


async def chancy_noop(*, i: int) -> None:
    _executed(i)


async def chancy_probe(*, key: str, job: Any) -> None:
    """The slot is not handed to the job: its ``created_at`` (when the cron plugin pushed it)
    is kept, and ``peers_run.chancy_slots`` derives the slot from it."""
    started = time.time()
    await record(key, None, started, enqueued=job.created_at.timestamp())


def _chancy(conn: dict[str, str], cron_poll: int | None) -> Any:
    from chancy import Chancy
    from chancy.plugins.cron import Cron

    plugins = [Cron(poll_interval=cron_poll)] if cron_poll else [Cron()]
    log = logging.getLogger("bench.chancy")  # its default logger prints every job at INFO
    log.setLevel(logging.WARNING)
    return Chancy(_dsn(conn), plugins=plugins, log=log)


async def chancy_setup(conn: dict[str, str]) -> None:
    from chancy import Chancy, Queue

    async with _chancy(conn, None) as chancy:
        await chancy.migrate()
        await chancy.declare(
            Queue(
                CHANCY_QUEUE,
                concurrency=10,
                executor=Chancy.Executor.Async,
                eager_polling=True,
            )
        )


async def chancy_enqueue(conn: dict[str, str], n: int) -> float:
    from chancy import Job

    async with _chancy(conn, None) as chancy:
        jobs = [
            Job(func=f"{__name__}.chancy_noop", queue=CHANCY_QUEUE, kwargs={"i": i})
            for i in range(n)
        ]
        started = time.monotonic()
        async for _ in chancy.push_many(jobs, batch_size=1000):
            pass
        return time.monotonic() - started


async def chancy_worker(args: argparse.Namespace, conn: dict[str, str]) -> dict[str, Any]:
    from chancy import Job, QueuedJob, Worker
    from chancy.plugins.cron import Cron

    # the executor hands the job to a keyword-only parameter annotated QueuedJob
    chancy_probe.__annotations__["job"] = QueuedJob
    commands = _commands()
    out: dict[str, Any] = {}
    # the cron plugin polls each second for the 1-second schedule; its default (60 s) per minute
    cron_poll = 1 if args.schedule == "second" else None
    async with _chancy(conn, cron_poll) as chancy:
        worker = Worker(
            chancy, worker_id=f"bench-{args.index}-{os.getpid()}", register_signal_handlers=False
        )
        if args.mode == "throughput":
            print("ready", flush=True)
            if await _serve(args, commands, worker.start, out):
                await worker.stop()
            return out
        if args.index == 0:  # the schedules are rows: one process stores them
            await Cron.schedule(
                chancy,
                _cron(args),
                *(
                    Job(
                        func=f"{__name__}.chancy_probe",
                        queue=CHANCY_QUEUE,
                        kwargs={"key": f"lag{j}"},
                        unique_key=f"lag{j}",
                    )
                    for j in range(args.jobs)
                ),
            )
        await worker.start()
        print("ready", flush=True)
        await _next_command(commands, args.deadline, "stop")
        await worker.stop()
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
    # a thread of its own: DBOS replaces the loop's default executor and shuts it down
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        await asyncio.get_running_loop().run_in_executor(
            pool, Path(args.result).write_text, json.dumps(out)
        )
    print("done", flush=True)
    return 0


def versions() -> dict[str, str]:
    from importlib.metadata import version

    names = ("pgqueuer", "procrastinate", "apscheduler", "psycopg", "asyncpg", "sqlalchemy")
    out = {name: version(name) for name in names}
    for name in ("oban", "dbos", "chancy", "croniter"):
        try:
            out[name] = version(name)
        except Exception:  # an older peers environment: reported as missing
            out[name] = "not installed"
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
    p.add_argument("--schedule", choices=("second", "minute"), default="second")
    p.add_argument("--record", action="store_true", help="also a committed row per execution")
    p.add_argument("--index", type=int, default=0, help="the worker's number (0 stores schedules)")
    p.add_argument("--result")
    p.add_argument("--deadline", type=float, default=None)
    args = p.parse_args(argv)
    if args.command == "versions":
        print(json.dumps(versions()))
        return 0
    if args.deadline is None:
        args.deadline = time.monotonic() + 900
    if args.record:
        RECORDER.system = args.system
        RECORDER.conn = json.loads(args.conn)
    if args.system in ("pgqueuer", "oban") and args.command == "worker":  # both use uvloop
        import uvloop

        return uvloop.run(_main(args))
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
