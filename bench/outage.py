"""Outage cost: what one scheduler instance does while its database is away.

    python bench/outage.py                        # private PostgreSQL, every kind, 20 s each
    python bench/outage.py --url mysql+asyncmy://root@127.0.0.1:3306/test
    python bench/outage.py --kinds refused --seconds 3 --quick

One instance with the library's defaults (polling interval PT10S, heartbeat PT10S) and a
recurring job due every second (so that due times pass during the outage: the condition that
made the poller spin) reaches its database through a TCP proxy (``Gate``).
Once the job has run, the database goes away for ``--seconds`` in one of these ways:

* ``refused``: the proxy stops listening and resets every connection (a stopped server);
* ``reset``: every new connection is accepted and reset at once (a server that is restarting,
  a load balancer without a backend);
* ``timeout``: open and new connections are held and never answered (a partition, a frozen
  server); bounded by ``statement_timeout`` and the connect timeout;
* ``read-only`` (PostgreSQL): the database's sessions are terminated and new ones are read-only
  (``default_transaction_read_only``: a demoted primary, a switchover's fenced seconds);
* ``login-refused`` (PostgreSQL): the instance's role loses ``LOGIN`` and its sessions are
  terminated (a rotated password, a revoked grant).

Measured during the outage: connection attempts per second (every ``create_connection`` of the
instance's event loop, refused ones included), database errors per second (the scheduler's
``database_error`` observer hook: each failed statement), and the process's CPU as a share of
one core (the proxy's part is negligible: it forwards nothing then). After the outage: the
seconds until the job runs again. The expected shape: the retry loops back off from 50 ms to
the polling interval, so a few attempts a second at the start and one per loop per interval
after, whatever the kind; before the fix of issue 31 the poller retried at once whenever the
job's due time had passed (hundreds of attempts a second, a full core).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.common import fresh_schema, is_mysql_url, private_postgres

KINDS = ("refused", "reset", "timeout", "read-only", "login-refused")
POSTGRES_ONLY = ("read-only", "login-refused")
ROLE = "ekbatan_outage_bench"


class Attempts:
    """Connection attempts of one event loop (``create_connection``, refused ones too)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.count = 0
        for name in ("create_connection", "create_unix_connection"):
            original = getattr(loop, name)
            setattr(loop, name, self._counting(original))

    def _counting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(*args, **kwargs)

        return counted


def _errors() -> Any:
    """A scheduler observer that counts failed statements (``.count``)."""
    from ekbatan_fastapi.engine.observer import SchedulerObserver

    class Errors(SchedulerObserver):
        def __init__(self) -> None:
            self.count = 0

        def database_error(self, operation: str, error: BaseException) -> None:
            self.count += 1

    return Errors()


class Gate:
    """A loopback TCP proxy in front of the database that can make it go away: ``refuse``
    (stop listening, reset every connection), ``reset`` (accept each new connection and reset
    it at once), ``blackhole`` (forward nothing more; new connections are accepted and never
    answered), ``open`` (serve new connections again; the others are reset)."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        socket_dir = url.query.get("host")
        mysql = url.get_backend_name() in ("mysql", "mariadb")
        port = url.port or (3306 if mysql else 5432)
        self._unix = f"{socket_dir}/.s.PGSQL.{port}" if isinstance(socket_dir, str) else None
        self._target = (url.host or "127.0.0.1", port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.url = (
            url.set(host="127.0.0.1", port=self.port)
            .difference_update_query(["host"])
            .render_as_string(hide_password=False)
        )
        self.mode = "open"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._abort_all()
        self.mode = "open"
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def refuse(self) -> None:
        self.mode = "refuse"
        if self._server is not None:
            self._server.close()
            self._server = None
        self._abort_all()

    async def reset(self) -> None:
        await self.refuse()
        self.mode = "reset"
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def blackhole(self) -> None:
        self.mode = "blackhole"

    async def close(self) -> None:
        await self.refuse()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            _reset(writer)
            return
        self._writers.add(writer)
        if self.mode == "blackhole":
            return  # held open, never answered
        try:
            if self._unix:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            _reset(writer)
            return
        self._writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                while self.mode == "blackhole":  # swallowed: nothing more goes through
                    await asyncio.sleep(0.1)
                    data = b""
                if data:
                    sink.write(data)
                    await sink.drain()
        _reset(sink)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), not a polite FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _admin(db_url: str, *statements: str) -> None:
    engine = create_async_engine(db_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


def _terminate(database: str, role: str | None = None) -> str:
    who = f"usename = '{role}'" if role else f"datname = '{database}'"
    return (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE {who} AND pid <> pg_backend_pid()"
    )


@contextlib.asynccontextmanager
async def outage(kind: str, proxy: Gate, db_url: str) -> AsyncIterator[None]:
    """The database is away in the way ``kind`` says, for the body of the ``with``."""
    database = make_url(db_url).database or ""
    admin = make_url(db_url).set(database="postgres").render_as_string(hide_password=False)
    if kind == "refused":
        await proxy.refuse()
    elif kind == "reset":
        await proxy.reset()
    elif kind == "timeout":
        await proxy.blackhole()
    elif kind == "read-only":
        await _admin(
            admin,
            f'ALTER DATABASE "{database}" SET default_transaction_read_only = on',
            _terminate(database),
        )
    elif kind == "login-refused":
        await _admin(admin, f"ALTER ROLE {ROLE} NOLOGIN", _terminate(database, ROLE))
    try:
        yield
    finally:
        if kind in ("refused", "reset", "timeout"):
            await proxy.open()
        elif kind == "read-only":
            await _admin(
                admin,
                f'ALTER DATABASE "{database}" RESET default_transaction_read_only',
                _terminate(database),
            )
        elif kind == "login-refused":
            await _admin(admin, f"ALTER ROLE {ROLE} LOGIN")


async def measure(server_url: str, kind: str, seconds: float) -> dict[str, Any]:
    from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedules, job_registry

    class Tick(DistributedJob):
        def __init__(self) -> None:
            self.runs = 0
            self.ran = asyncio.Event()

        def name(self) -> str:
            return "outage-tick"

        def schedule(self) -> Any:
            return Schedules.fixed_rate(timedelta(seconds=1))

        async def execute(self, ctx: ExecutionContext) -> None:
            self.runs += 1
            self.ran.set()

    loop = asyncio.get_running_loop()
    async with fresh_schema(server_url, "ekbatan_outage") as db_url:
        proxy = Gate(db_url)
        await proxy.open()
        app_url = make_url(proxy.url)
        if kind == "login-refused":
            await _admin(
                db_url,
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') "
                f"THEN CREATE ROLE {ROLE} LOGIN SUPERUSER; END IF; END $$",
                f"ALTER ROLE {ROLE} LOGIN",
            )
            app_url = app_url.set(username=ROLE, password=None)
        job = Tick()
        errors = _errors()
        registry = (
            job_registry()
            .connection_provider(app_url.render_as_string(hide_password=False))
            .with_jobs([job])
            .customize_scheduler(
                lambda b: b.scheduler_name(f"outage-{uuid.uuid4().hex[:8]}").observer(errors)
            )
            .build()
        )
        attempts = Attempts(loop)
        await registry.start()
        try:
            assert await registry.wait_until_ready(30), registry.status()
            for _ in range(2):
                job.ran.clear()
                await asyncio.wait_for(job.ran.wait(), 30)
            # its result recorded: the next slot (a second away) is the poller's planned due
            # time, which passes during the outage
            for _ in range(3000):
                if not registry.scheduler.running:
                    break
                await asyncio.sleep(0.01)
            async with outage(kind, proxy, db_url):
                connects, failed = attempts.count, errors.count
                cpu, began = time.process_time(), time.monotonic()
                await asyncio.sleep(seconds)
                wall = time.monotonic() - began
                cpu = time.process_time() - cpu
                connects, failed = attempts.count - connects, errors.count - failed
                job.ran.clear()
            back = time.monotonic()
            await asyncio.wait_for(job.ran.wait(), 60)
            recovered = time.monotonic() - back
        finally:
            await registry.stop()
            await registry.connection.dispose()
            await proxy.close()
    return {
        "kind": kind,
        "seconds": round(wall, 2),
        "connects": connects,
        "connects_per_s": round(connects / wall, 1),
        "errors_per_s": round(failed / wall, 1),
        "cpu_percent_of_a_core": round(100 * cpu / wall, 1),
        "runs_again_after_s": round(recovered, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a server on this machine (default: a private PostgreSQL)")
    p.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS)
    )
    p.add_argument("--seconds", type=float, default=20.0, help="length of each outage")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"unknown outage kind {kind!r}; choose from {', '.join(KINDS)}")
    if args.url and is_mysql_url(args.url):
        skipped = [k for k in kinds if k in POSTGRES_ONLY]
        if skipped:
            print(f"(skipping {', '.join(skipped)}: PostgreSQL only)", file=sys.stderr)
        kinds = [k for k in kinds if k not in POSTGRES_ONLY]
    results = []
    with private_postgres(args.url) as server:
        for kind in kinds:
            result = asyncio.run(measure(server.url, kind, args.seconds))
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    print("| outage | connects/s | failed statements/s | CPU (% of a core) | runs again after |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['kind']} | {r['connects_per_s']} | {r['errors_per_s']} | "
            f"{r['cpu_percent_of_a_core']} | {r['runs_again_after_s']} s |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
