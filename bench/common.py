"""Shared pieces of the benchmark harnesses (db_limit, slot_lag, failover, idle_cost, run_all).

* ``private_postgres()``: a PostgreSQL cluster of the benchmark's own, in a temporary
  directory, reachable only over a Unix socket, with ``pg_stat_statements`` preloaded and
  fsync on; the machine's PostgreSQL 15 binaries when they are installed (the version of the
  reference figures), the embedded PostgreSQL otherwise. The shared server at 127.0.0.1:5432
  is never restarted or reconfigured.
* ``ServerInfo``: how to reach a server from SQLAlchemy/asyncpg, from libpq tools (pgbench)
  and from the peers' drivers.
* percentiles, process helpers (spawn, RSS, bounded waits) and the run's environment.
* callgrind (``callgrind_toggle``, ``callgrind_command``, ``callgrind_instructions``): machine
  instructions of a harness's timed part only, which a busy machine does not change.
* the harnesses' own pieces (``fresh_schema``, ``harness_parser``, ``worker_registry``,
  ``stdin_commands``, ``wait_for_stop``, ``write_result``): their worker processes' common steps.

Only stdlib and SQLAlchemy/asyncpg here: the peers' environment imports nothing from this file.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import datetime as dt
import ipaddress
import json
import math
import os
import platform
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:  # the library itself only where a worker needs it (see the module's doc)
    from ekbatan_fastapi import JobRegistry, SchedulerBuilder

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PG15_BIN = Path("/usr/lib/postgresql/15/bin")

__all__ = [
    "ServerInfo",
    "asyncpg_dsn",
    "check_local",
    "describe_environment",
    "fresh_database",
    "is_mysql_url",
    "percentile",
    "private_postgres",
    "process_rss_kib",
    "summarize_ms",
]


# -- servers ----------------------------------------------------------------------------------


@dataclasses.dataclass
class ServerInfo:
    """A PostgreSQL server on this machine, as every client of the harness needs it."""

    url: str
    """``postgresql+asyncpg://`` URL of its maintenance database (``postgres``)."""
    kind: str
    stat_statements: bool = False
    """``pg_stat_statements`` is preloaded (statements can be counted server-side)."""

    def with_database(self, database: str) -> str:
        parsed = make_url(self.url)
        return parsed.set(database=database).render_as_string(hide_password=False)

    def libpq(self, database: str) -> dict[str, str]:
        """host/port/user/dbname for libpq tools, psycopg and asyncpg."""
        parsed = make_url(self.url)
        host = parsed.query.get("host") or parsed.host or "127.0.0.1"
        if isinstance(host, tuple):
            host = host[0]
        out = {
            "host": str(host),
            "port": str(parsed.port or 5432),
            "user": parsed.username or "postgres",
            "dbname": database,
        }
        if parsed.password:
            out["password"] = parsed.password
        return out


def asyncpg_dsn(url: str) -> str:
    """A ``postgresql+asyncpg://`` URL as the DSN ``asyncpg.connect`` takes (its query, such as
    a socket directory, kept)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def check_local(url: str) -> None:
    """Refuse any server that is not on this machine (loopback or a Unix socket)."""
    parsed = make_url(url)
    socket_dir = parsed.query.get("host")
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        return
    host = parsed.host
    if host is None or host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"refusing {host!r}: the benchmarks only talk to a server on this machine")


def _as_postgres_user() -> list[str]:
    """The command prefix that runs PostgreSQL's binaries as a non-root user."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def _run(cmd: Sequence[str], timeout: float = 120.0) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


@contextlib.contextmanager
def _pg15_cluster() -> Iterator[ServerInfo]:
    base = Path(tempfile.mkdtemp(prefix="ekbatan-bench-pg15-"))
    data, sock, log = base / "data", base / "sock", base / "server.log"
    sock.mkdir()
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in (base, sock):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    prefix = _as_postgres_user()
    started = False
    try:
        _run(
            [
                *prefix,
                str(PG15_BIN / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ]
        )
        # The machine's server's settings (autovacuum off, 128 MB shared buffers, fsync on),
        # reachable only over a socket in our directory; pg_stat_statements for idle_cost.
        options = (
            "-c listen_addresses='' -c port=5432 "
            f"-c unix_socket_directories={sock} "
            "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
            "-c autovacuum=off -c shared_buffers=128MB -c max_connections=200 "
            "-c fsync=on -c synchronous_commit=on -c max_wal_size=1GB"
        )
        _run(
            [
                *prefix,
                str(PG15_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ]
        )
        started = True
        version = _run(
            [
                str(PG15_BIN / "psql"),
                "-h",
                str(sock),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atc",
                "SHOW server_version",
            ]
        ).strip()
        yield ServerInfo(
            url=f"postgresql+asyncpg://postgres@/postgres?host={sock}",
            kind=f"private PostgreSQL {version} cluster (the machine's binaries, Unix socket, "
            "fsync on, autovacuum off, shared_buffers 128MB, pg_stat_statements)",
            stat_statements=True,
        )
    finally:
        if started:
            with contextlib.suppress(Exception):
                _run(
                    [
                        *prefix,
                        str(PG15_BIN / "pg_ctl"),
                        "-D",
                        str(data),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        "60",
                        "stop",
                    ]
                )
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _embedded_cluster() -> Iterator[ServerInfo]:
    from ekbatan_fastapi.store.embedded import start_embedded_postgres

    base = Path(tempfile.mkdtemp(prefix="ekbatan-bench-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    try:
        version = server.psql("SHOW server_version;").splitlines()[2].strip()
        yield ServerInfo(
            url=server.url("postgres"),
            kind=f"embedded PostgreSQL {version} (embedded-postgres, Unix socket, fsync on)",
            stat_statements=False,
        )
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(url: str | None = None) -> Iterator[ServerInfo]:
    """``url`` given: that server (on this machine); else a private cluster of our own."""
    if url is not None and is_mysql_url(url):  # MySQL/MariaDB: as given, no server counters
        check_local(url)
        yield ServerInfo(url=url, kind="given server (MySQL/MariaDB)")
        return
    if url is not None:
        check_local(url)
        parsed = make_url(url).set(drivername="postgresql+asyncpg")
        yield ServerInfo(
            url=parsed.render_as_string(hide_password=False),
            kind="given server",
            stat_statements=_has_stat_statements(parsed.render_as_string(hide_password=False)),
        )
        return
    if (PG15_BIN / "pg_ctl").exists() and shutil.which("runuser"):
        with _pg15_cluster() as server:
            yield server
        return
    with _embedded_cluster() as server:
        yield server


def is_mysql_url(url: str) -> bool:
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


def _has_stat_statements(url: str) -> bool:
    async def probe() -> bool:
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                value = (await conn.execute(text("SHOW shared_preload_libraries"))).scalar_one()
            return "pg_stat_statements" in str(value)
        finally:
            await engine.dispose()

    # a thread of its own: the caller may already be inside an event loop
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        try:
            return pool.submit(asyncio.run, probe()).result(timeout=60)
        except Exception:
            return False


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, prefix: str = "ekbatan_bench") -> AsyncIterator[str]:
    """An empty database on the server for one harness; dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    mysql = is_mysql_url(server_url)
    quoted, force = (f"`{name}`", "") if mysql else (f'"{name}"', " WITH (FORCE)")
    admin = create_async_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {quoted}"))
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with contextlib.suppress(Exception):
            async with admin.connect() as conn:
                await conn.execute(text(f"DROP DATABASE {quoted}{force}"))
        await admin.dispose()


@contextlib.asynccontextmanager
async def fresh_schema(server_url: str, prefix: str) -> AsyncIterator[str]:
    """``fresh_database`` with the library's tables created in it."""
    from ekbatan_fastapi import create_schema

    async with fresh_database(server_url, prefix) as db_url:
        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            await create_schema(engine)
        finally:
            await engine.dispose()
        yield db_url


@contextlib.asynccontextmanager
async def fresh_task_store(server_url: str, prefix: str) -> AsyncIterator[tuple[AsyncEngine, Any]]:
    """A pooled engine (as an application's, so MySQL/MariaDB's names table is used from 500
    names on) on a ``fresh_schema`` and the library's task store on it."""
    from ekbatan_fastapi.store.dialects import open_store

    async with fresh_schema(server_url, prefix) as db_url:
        engine = create_async_engine(db_url, pool_size=2, max_overflow=0)
        try:
            yield engine, open_store(engine, engine.dialect.name).tasks
        finally:
            await engine.dispose()


async def server_version(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(text("SHOW server_version"))).scalar_one())


def mysql_numbers(backend: str, n: int) -> str:
    """A derived table ``s`` of the integers 1..n, column ``i``: MariaDB's Sequence engine, or
    on MySQL a recursive CTE (``cte_max_recursion_depth`` must allow n)."""
    if backend == "mariadb":
        return f"(SELECT seq AS i FROM seq_1_to_{int(n)}) AS s"
    return (
        f"(WITH RECURSIVE s (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {int(n)}) "
        "SELECT i FROM s) AS s"
    )


def other_service_rows(
    backend: str, count: int, *, prefix: str, instance: str, table: str = "scheduled_tasks"
) -> list[str]:
    """The statements that insert ``count`` rows of ten task names a scheduler does not know
    (``<prefix>0`` ... ``<prefix>9``, instances ``<instance><i>``): half due a day ago, half
    due tomorrow, generated in the database. ``backend``: ``postgresql``, ``mariadb`` (the
    Sequence engine) or ``mysql`` (a recursive CTE, after raising its depth limit)."""
    n = int(count)
    columns = "task_name, task_instance, execution_time, picked, version, priority"
    if backend == "postgresql":
        return [
            f"INSERT INTO {table} ({columns}) SELECT '{prefix}' || (i % 10), '{instance}' || i, "
            "CASE WHEN i % 2 = 0 THEN now() - interval '1 day' ELSE now() + interval '1 day' "
            f"END, false, 1, 0 FROM generate_series(1, {n}) AS i"
        ]
    setup = [] if backend == "mariadb" else ["SET SESSION cte_max_recursion_depth = 4294967295"]
    numbers = mysql_numbers(backend, n)
    return [
        *setup,
        f"INSERT INTO {table} ({columns}) SELECT CONCAT('{prefix}', i % 10), "
        f"CONCAT('{instance}', i), IF(i % 2 = 0, UTC_TIMESTAMP(6) - INTERVAL 1 DAY, "
        f"UTC_TIMESTAMP(6) + INTERVAL 1 DAY), 0, 1, 0 FROM {numbers}",
    ]


# -- statistics -------------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of right-aligned (numeric) columns, as BENCHMARKS.md takes them."""
    lines = ["| " + " | ".join(headers) + " |", "|" + " ---: |" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p99/max/mean in milliseconds of values in seconds."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "p50": percentile(ms, 50),
        "p99": percentile(ms, 99),
        "max": max(ms) if ms else None,
        "mean": sum(ms) / len(ms) if ms else None,
        "count": float(len(ms)),
    }


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


# -- processes --------------------------------------------------------------------------------


def process_rss_kib(pid: int) -> int | None:
    """Resident set size of a process in KiB (Linux), None when unknown."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a process (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_times() -> tuple[int, int] | None:
    """The machine's CPU time from ``/proc/stat``: (all, idle + iowait), in ticks; None where
    it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(values), values[3] + values[4]


def busy_since(before: tuple[int, int] | None) -> float | None:
    """The machine's busy share of its CPU time since ``before`` (a ``cpu_times()``); None
    where either reading is missing or no tick passed."""
    after = cpu_times()
    if before is None or after is None or after[0] <= before[0]:
        return None
    return 1.0 - (after[1] - before[1]) / (after[0] - before[0])


async def cpu_busy(sample: float = 0.5) -> float | None:
    """The machine's CPU busy fraction over ``sample`` seconds (None off Linux)."""
    before = cpu_times()
    await asyncio.sleep(sample)
    return busy_since(before)


class Child:
    """A harness worker process: line protocol on stdout, stderr to a log file."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, name: str) -> None:
        self.proc = proc
        self.log = log
        self.name = name

    @classmethod
    async def spawn(cls, args: Sequence[str], log: Path, name: str) -> Child:
        with log.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                cwd=str(ROOT),
            )
        return cls(proc, log, name)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def readline(self, within: float) -> str | None:
        """The next stdout line, None at EOF; TimeoutError after ``within`` seconds."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(max(within, 0.001)):
            line = await self.proc.stdout.readline()
        return line.decode().rstrip("\n") if line else None

    async def expect(self, word: str, within: float) -> str:
        """Wait for a line starting with ``word``; return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        for _ in range(100_000):
            line = await self.readline(deadline - loop.time())
            if line is None:
                raise RuntimeError(f"{self.name} exited before {word!r}; log:\n{tail(self.log)}")
            if line.startswith(word):
                return line
        raise RuntimeError(f"{self.name}: too much output before {word!r}")

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(ConnectionError, RuntimeError):
            self.proc.stdin.write(f"{line}\n".encode())
            await self.proc.stdin.drain()

    async def close(self, within: float = 30.0) -> None:
        """Close stdin, drain stdout, wait; kill after ``within`` seconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(within):
                while await self.proc.stdout.read(65536):
                    pass
                await self.proc.wait()
        except TimeoutError:
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.wait()


async def run_bounded(
    args: Sequence[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[int, str, str]:
    """Run a command to its end within ``timeout`` seconds (killed and TimeoutError past it):
    its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def read_stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str]) -> None:
    """Thread body: forward stdin lines into an asyncio queue ('eof' at the end)."""
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line.strip())
    loop.call_soon_threadsafe(queue.put_nowait, "eof")


# -- harness scripts and their workers ------------------------------------------------------


def harness_parser(description: str | None) -> argparse.ArgumentParser:
    """A harness's command line: ``--url`` first; the script adds its own options."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: a private one)")
    return p


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """The hidden options of a script's worker mode: ``--worker`` and ``--deadline``."""
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)


def worker_registry(
    url: str,
    jobs: Iterable[Any],
    *,
    name: str,
    polling_interval: float | None = None,
    shutdown_max_wait: float = 5.0,
    customize: Callable[[SchedulerBuilder], None] | None = None,
) -> JobRegistry:
    """A worker's registry: ``jobs`` on ``url``, its scheduler named ``name``; the library's
    defaults but for the polling interval (when given) and what ``customize`` sets."""
    from ekbatan_fastapi import job_registry

    def customize_scheduler(b: SchedulerBuilder) -> None:
        b.scheduler_name(name)
        if polling_interval is not None:
            b.polling_interval(dt.timedelta(seconds=polling_interval))
        if customize is not None:
            customize(b)

    return (
        job_registry()
        .connection_provider(url)
        .with_jobs(jobs)
        .shutdown_max_wait(dt.timedelta(seconds=shutdown_max_wait))
        .customize_scheduler(customize_scheduler)
        .build()
    )


def stdin_commands() -> asyncio.Queue[str]:
    """stdin's lines as a queue of the running loop ('eof' at the end), read by a thread."""
    commands: asyncio.Queue[str] = asyncio.Queue()
    args = (asyncio.get_running_loop(), commands)
    threading.Thread(target=read_stdin_lines, args=args, daemon=True).start()
    return commands


async def wait_for_stop(
    commands: asyncio.Queue[str],
    deadline: float,
    on_command: Callable[[str], None] | None = None,
    *,
    most: int | None = None,
) -> None:
    """Until a ``stop`` line or stdin's end, at the latest until ``deadline`` (monotonic; at
    least 1 s from now); ``on_command`` sees every other line. ``most``: stop waiting after
    that many lines anyway."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            seen = 0
            while most is None or seen < most:
                seen += 1
                command = await commands.get()
                if command in ("stop", "eof"):
                    break
                if on_command is not None:
                    on_command(command)


async def write_result(path: str, value: Any) -> None:
    """A worker's last step: its result as JSON to ``path``, then ``done`` on stdout."""
    await asyncio.to_thread(Path(path).write_text, json.dumps(value))
    print("done", flush=True)


# -- environment ------------------------------------------------------------------------------


def describe_environment() -> dict[str, str]:
    from importlib.metadata import version

    import ekbatan_fastapi

    def git_head() -> str:
        with contextlib.suppress(Exception):
            return subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        return "?"

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": str(os.cpu_count()),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "ekbatan_fastapi": f"{ekbatan_fastapi.__version__} (git {git_head()})",
        "sqlalchemy": version("sqlalchemy"),
        "asyncpg": version("asyncpg"),
    }


def monotonic() -> float:
    """CLOCK_MONOTONIC: one clock for every process on Linux, so timestamps compare."""
    return time.monotonic()


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


# -- callgrind: instructions instead of seconds --------------------------------------------

_TOGGLE_C = """#include <valgrind/callgrind.h>
void on(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void off(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""


class CallgrindToggle:
    """``enable()``/``disable()`` (as a ``cProfile.Profile``'s) start and stop callgrind's
    instrumentation around a timed part; no-ops outside valgrind."""

    def __init__(self, library: Any) -> None:
        self._library = library

    def on(self) -> None:
        self._library.on()

    def off(self) -> None:
        self._library.off()

    enable, disable = on, off


def callgrind_toggle() -> CallgrindToggle:
    """Compile callgrind's client requests (``valgrind/callgrind.h``) with ``cc`` into a
    temporary library and load it."""
    folder = Path(tempfile.mkdtemp(prefix="callgrind-toggle-"))
    (folder / "toggle.c").write_text(_TOGGLE_C)
    library = folder / "toggle.so"
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(folder / "toggle.c")],
        check=True,
    )
    return CallgrindToggle(ctypes.CDLL(str(library)))


def callgrind_command(out: Path) -> list[str]:
    """The prefix that runs a command under callgrind, instrumentation off until the command
    toggles it, its dumps written to ``out`` (``%p``: the process id)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def callgrind_instructions(folder: Path, prefix: str) -> int:
    """The instructions counted in every callgrind dump under ``folder`` whose name starts with
    ``prefix`` (each dump's ``totals:`` line; the toggled part's dump and the nearly empty one
    at exit)."""
    total = 0
    for dump in folder.glob(f"{prefix}*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total
