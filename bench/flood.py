"""The flood of issue 27: unauthenticated clients loop on ``GET /jobs`` while a 1-second job
must keep running on time and a readiness probe must keep telling the truth.

    .venv/bin/python bench/flood.py                          # 64 clients, 15 s, limit=10000
    .venv/bin/python bench/flood.py --limit 1000             # the largest page allowed now
    .venv/bin/python bench/flood.py --limit 1000 --vary-offset   # a different page per client
    .venv/bin/python bench/flood.py --url mysql+asyncmy://root@127.0.0.1:3306/test

What one run does:

1. Creates a database of its own on the server of ``--url`` (the machine's PostgreSQL 15 by
   default; dropped at the end), the library's tables, and ``--rows`` (10,000) rows of a task
   name no instance knows (one-time rows due tomorrow: the report lists them, nothing claims
   them).
2. Starts the application in a process of its own (``--serve``): uvicorn on 127.0.0.1, one
   worker, ``jobs_router``, and one job, ``tick``: a fixed rate of 1 s (it sleeps 50 ms),
   polling PT1S, heartbeats PT2S, dead after 4 missed heartbeats (8 s), the default pool of 5
   connections. It waits until ``tick`` has run, then 3 s more.
3. Starts ``--clients`` (64) HTTP clients in another process (``--clients-worker``: bare
   HTTP/1.1 over TCP, one kept-alive connection each), each looping on
   ``GET /jobs?limit=<--limit>`` (with ``--vary-offset``: ``&offset=<7 x its number>``, so
   no two ask for the same page) for
   ``--seconds`` (15). Meanwhile this process sends the probe ``GET /jobs?limit=1`` every
   0.5 s (10 s timeout) and records its answers.
4. After the flood, waits 3 s for the last results, then reads ``tick``'s runs from the
   execution history: the slots of its 1 s grid between the flood's start and end (by the
   database's clock), and how many runs each had (0: missed; 2 or more: duplicated).

Prints the runs per slot, the probe's answers (status and, for a 503, whether it said
"unreachable"), the flood's answers and latencies, and the scheduler's own event-loop lag
as the last probe saw it. Run from another checkout (``PYTHONPATH=<checkout>``) to measure
that checkout's library with the same harness.
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
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
HERE = Path(__file__).resolve()
TICK = "tick"
OTHER = "flood-other-service"


@dataclasses.dataclass
class Options:
    url: str = DEFAULT_URL
    clients: int = 64
    seconds: float = 15.0
    rows: int = 10_000
    limit: int = 10_000
    vary_offset: bool = False
    probe_every: float = 0.5
    settle: float = 3.0
    """Seconds before the flood (the job's first runs) and after it (its last results)."""


@dataclasses.dataclass
class Result:
    options: dict[str, Any]
    slots: list[int]
    """Runs of each 1 s slot between the flood's start and end (0: missed)."""
    probe: dict[str, int]
    """The probe's answers: ``200``, ``503 unreachable``, ``503 other``, ``429``, ..."""
    probe_ms: dict[str, float | None]
    flood: dict[str, Any]
    loop_lag: dict[str, Any]
    library: str

    @property
    def on_time(self) -> int:
        return sum(1 for runs in self.slots if runs >= 1)

    @property
    def duplicates(self) -> int:
        return sum(runs - 1 for runs in self.slots if runs > 1)


# -- the application (``--serve``) ------------------------------------------------------------


def build_app(db_url: str) -> Any:
    from fastapi import FastAPI

    from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules
    from ekbatan_fastapi.settings import EkbatanSettings
    from ekbatan_fastapi.web import create_ekbatan_lifespan, jobs_router

    class Tick(DistributedJob):
        def name(self) -> str:
            return TICK

        def schedule(self) -> Schedule:
            return Schedules.fixed_rate(dt.timedelta(seconds=1))

        async def execute(self, ctx: ExecutionContext) -> None:
            await asyncio.sleep(0.05)

    settings = EkbatanSettings(
        jobs={
            "polling-interval": "PT1S",
            "heartbeat-interval": "PT2S",
            "missed-heartbeats-limit": 4,
            "shutdown-max-wait": "PT5S",
        },
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": db_url}}}]}]},
    )
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(settings=settings, jobs=[Tick()], discover=False)
    )
    app.include_router(jobs_router)
    return app


def serve(db_url: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build_app(db_url), host="127.0.0.1", port=port, log_level="warning")


# -- the flood (``--clients-worker``) -----------------------------------------------------------


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str
) -> tuple[int, int]:
    """One ``GET`` on a kept-alive HTTP/1.1 connection: (status, body bytes). A bare client
    (httpx costs a few milliseconds of CPU per request, which 64 clients in one process on a
    busy machine turn into the figure measured)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return status, length


async def flood(base: str, clients: int, seconds: float, limit: int, vary: bool) -> dict[str, Any]:
    """``clients`` connections looping on ``GET /jobs?limit=...`` for ``seconds``."""
    statuses: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    by_status: dict[str, list[float]] = collections.defaultdict(list)
    received = 0
    deadline = time.monotonic() + seconds
    host = base.removeprefix("http://")
    address, _, port = host.partition(":")

    async def client(number: int) -> None:
        nonlocal received
        path = f"/jobs?limit={limit}" + (f"&offset={7 * number}" if vary else "")
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                if connection is None:
                    connection = await asyncio.open_connection(address, int(port))
                async with asyncio.timeout(30):
                    status, size = await _get(*connection, host, path)
            except (
                OSError,
                ValueError,
                IndexError,
                asyncio.IncompleteReadError,
                TimeoutError,
            ) as error:
                statuses[type(error).__name__] += 1
                if connection is not None:
                    connection[1].close()
                connection = None
                await asyncio.sleep(0.1)
                continue
            latencies.append(time.monotonic() - began)
            by_status[str(status)].append(latencies[-1])
            statuses[str(status)] += 1
            received += size
        if connection is not None:
            connection[1].close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return {
        "requests": sum(statuses.values()),
        "statuses": dict(statuses),
        "latency_ms": common.summarize_ms(latencies),
        "latency_ms_by_status": {k: common.summarize_ms(v) for k, v in by_status.items()},
        "megabytes": round(received / 1e6, 1),
    }


# -- the harness --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _probe_kind(response: Any) -> str:
    if response.status_code != 503:
        return str(response.status_code)
    with contextlib.suppress(ValueError):
        body = response.json()
        said = " ".join([*body.get("problems", []), str(body.get("detail", ""))]).lower()
        if "unreachable" in said or "no answer within" in said:
            return "503 unreachable"
    return "503 other"


async def _db_now(engine: Any) -> dt.datetime:
    async with engine.connect() as conn:
        now = (await conn.execute(select(text("CURRENT_TIMESTAMP")))).scalar_one()
    return now if now.tzinfo else now.replace(tzinfo=dt.UTC)


async def _fill(db_url: str, rows: int) -> None:
    from ekbatan_fastapi import scheduled_tasks

    engine = create_async_engine(db_url, poolclass=NullPool)
    tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    try:
        async with engine.begin() as conn:
            for start in range(0, rows, 2000):
                await conn.execute(
                    insert(scheduled_tasks),
                    [
                        {
                            "task_name": OTHER,
                            "task_instance": f"order-{i}",
                            "execution_time": tomorrow + dt.timedelta(seconds=i),
                            "picked": False,
                            "version": 1,
                            "consecutive_failures": 0,
                            "priority": 0,
                        }
                        for i in range(start, min(rows, start + 2000))
                    ],
                )
    finally:
        await engine.dispose()


async def _wait_ready(base: str, server: asyncio.subprocess.Process, within: float) -> None:
    import httpx

    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            if server.returncode is not None:
                raise RuntimeError(f"the application exited with {server.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                tick = await http.get(f"{base}/jobs/{TICK}")
                tasks = tick.json().get("tasks") if tick.status_code == 200 else None
                if tasks and tasks[0]["last_success"]:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError("the application did not run tick in time")


async def _slots(engine: Any, since: dt.datetime, until: dt.datetime) -> list[int]:
    """Runs per 1 s slot of tick's grid in [since, until), from the execution history."""
    async with engine.connect() as conn:
        times = [
            row[0] if row[0].tzinfo else row[0].replace(tzinfo=dt.UTC)
            for row in await conn.execute(
                text(
                    "SELECT execution_time FROM ekbatan_execution_history WHERE task_name = :n "
                    "ORDER BY execution_time"
                ),
                {"n": TICK},
            )
        ]
    if not times:
        return []
    first = times[0]
    runs = collections.Counter(round((t - first).total_seconds()) for t in times)
    low = max(0, math.ceil((since - first).total_seconds()))
    high = math.ceil((until - first).total_seconds())
    return [runs.get(k, 0) for k in range(low, high)]


async def run(options: Options) -> Result:
    import httpx

    import ekbatan_fastapi

    here = HERE
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with common.fresh_schema(options.url, "ekbatan_flood") as db_url:
        await _fill(db_url, options.rows)
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        server = await asyncio.create_subprocess_exec(
            sys.executable, str(here), "--serve", "--db", db_url, "--port", str(port), env=env
        )
        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            await _wait_ready(base, server, 60)
            await asyncio.sleep(options.settle)
            since = await _db_now(engine)
            worker = await asyncio.create_subprocess_exec(
                *(sys.executable, str(here), "--clients-worker", "--base", base),
                *("--clients", str(options.clients), "--seconds", str(options.seconds)),
                *(
                    "--limit",
                    str(options.limit),
                    *(["--vary-offset"] if options.vary_offset else []),
                ),
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            probe: collections.Counter[str] = collections.Counter()
            probe_times: list[float] = []
            last: dict[str, Any] = {}
            async with httpx.AsyncClient(timeout=10) as http:
                output = asyncio.ensure_future(worker.communicate())
                while not output.done():
                    began = time.monotonic()
                    try:
                        answer = await http.get(f"{base}/jobs?limit=1")
                        probe[_probe_kind(answer)] += 1
                        with contextlib.suppress(ValueError, KeyError):
                            last = answer.json()["scheduler"]
                    except httpx.HTTPError as error:
                        probe[f"error {type(error).__name__}"] += 1
                    probe_times.append(time.monotonic() - began)
                    await asyncio.sleep(max(0.0, options.probe_every - (time.monotonic() - began)))
                stdout, _ = await output
            until = await _db_now(engine)
            await asyncio.sleep(options.settle)
            slots = await _slots(engine, since, until)
        finally:
            if server.returncode is None:
                server.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(server.wait(), 30)
                except TimeoutError:
                    server.kill()
                    await server.wait()
            await engine.dispose()
    return Result(
        options=dataclasses.asdict(options)
        | {"url": make_url(options.url).render_as_string(hide_password=True)},
        slots=slots,
        probe=dict(probe),
        probe_ms=common.summarize_ms(probe_times),
        flood=json.loads(stdout.decode().strip().splitlines()[-1]),
        loop_lag={
            "events": last.get("loop_lag_events"),
            "max_seconds": last.get("max_loop_lag_seconds"),
        },
        library=str(Path(ekbatan_fastapi.__file__).parent.parent),
    )


def report(result: Result) -> str:
    flood = result.flood
    lines = [
        f"library: {result.library}",
        f"flood: {result.options['clients']} clients x {result.options['seconds']:g} s on "
        f"GET /jobs?limit={result.options['limit']}"
        + (" (a different offset each)" if result.options["vary_offset"] else "")
        + f", {result.options['rows']} rows",
        f"tick (1 s fixed rate): {result.on_time} of {len(result.slots)} slots ran, "
        f"{len(result.slots) - result.on_time} missed, {result.duplicates} duplicate runs",
        f"  runs per slot: {' '.join(str(r) for r in result.slots)}",
        "probe GET /jobs?limit=1 every 0.5 s: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(result.probe.items()))
        + f"; latency median {common.fmt_ms(result.probe_ms.get('p50'))}, "
        f"max {common.fmt_ms(result.probe_ms.get('max'))}",
        f"flood answers: {flood['requests']} requests, "
        + ", ".join(f"{k}: {v}" for k, v in sorted(flood["statuses"].items()))
        + f"; {flood['megabytes']} MB; latency median "
        f"{common.fmt_ms(flood['latency_ms'].get('p50'))}, p99 "
        f"{common.fmt_ms(flood['latency_ms'].get('p99'))}",
        "  by status: "
        + ", ".join(
            f"{k}: median {common.fmt_ms(v.get('p50'))}, max {common.fmt_ms(v.get('max'))}"
            for k, v in sorted(flood.get("latency_ms_by_status", {}).items())
        ),
        f"scheduler's event-loop lag (last probe): {result.loop_lag['events']} events, "
        f"max {result.loop_lag['max_seconds']} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL, help=f"a database server (default {DEFAULT_URL})")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--limit", type=int, default=10_000)
    p.add_argument("--vary-offset", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as JSON too")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--clients-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.db, args.port)
        return 0
    if args.clients_worker:
        summary = asyncio.run(
            flood(args.base, args.clients, args.seconds, args.limit, args.vary_offset)
        )
        print(json.dumps(summary))
        return 0
    options = Options(
        url=args.url,
        clients=args.clients,
        seconds=args.seconds,
        rows=args.rows,
        limit=args.limit,
        vary_offset=args.vary_offset,
    )
    result = asyncio.run(run(options))
    print(report(result))
    if args.json:
        print(json.dumps(dataclasses.asdict(result) | {"on_time": result.on_time}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
