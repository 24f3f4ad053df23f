"""Throughput: N due no-op one-time tasks executed by K worker processes, per polling strategy.

    python bench/throughput.py                       # embedded PostgreSQL in a temp dir
    python bench/throughput.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/throughput.py --url mysql+asyncmy://root@127.0.0.1:3306/test   # MySQL/MariaDB
    python bench/throughput.py --quick               # a small smoke run

For every (strategy, K, repeat) the harness recreates ``scheduled_tasks`` in a fresh database,
inserts N due rows in one ``INSERT ... SELECT generate_series`` (or the task store's batch
insert), starts K worker processes (this script with ``--worker``), waits until each has
imported everything, built its ``JobRegistry`` and opened its pool, and then releases them
all at once (a line on their stdin). The clock runs from that moment (``time.monotonic``,
one clock for every process on Linux) until the last row is deleted (the latest completion
batch any worker recorded). Process start-up and imports are not timed.

Checks, per run: executions == N, no instance executed twice (every worker reports the
instances it ran), N rows deleted by version-guarded completions, nothing left in the table
and nothing left picked. It is a benchmark, not a test: it prints, it never asserts.
Every wait is bounded by ``--timeout``; the harness only talks to a server on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import insert, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]

T = TypeVar("T")
THIS_FILE = Path(__file__).resolve()
TASK_NAME = "bench-noop"
TABLE = "scheduled_tasks"
HISTORY_TABLE = "ekbatan_execution_history"
STRATEGIES = ("fetch", "lock-and-fetch")
DEFAULT_N = 20_000
DEFAULT_PROCESSES = (1, 2, 4)
_QUIET = 0.15
_MONITOR_INTERVAL = 0.05
"""How often the parent checks whether the table is empty (it only decides when to stop;
the timing comes from the workers' completion timestamps)."""


# -- options and results ---------------------------------------------------------------------


@dataclasses.dataclass
class BenchOptions:
    """What to run. ``None`` settings keep the library's defaults."""

    n: int = DEFAULT_N
    processes: Sequence[int] = DEFAULT_PROCESSES
    strategies: Sequence[str] = STRATEGIES
    repeat: int = 3
    timeout: float = 300.0
    """Bound on one run (loading excluded); a run that hits it is reported as timed out."""
    batch_size: int | None = None
    polling_interval: float | None = None
    insert: str = "sql"
    """``sql``: one INSERT ... SELECT generate_series; ``batch``: the repository's batch insert."""
    worker_prefix: Sequence[str] = ()
    """Prepended to the worker command line, e.g. ``py-spy record -o out.svg --``."""
    cprofile_dir: Path | None = None
    """Write a cProfile of the timed part of each worker's run here."""
    callgrind_dir: Path | None = None
    """Run each worker under valgrind's callgrind, instrumented from "go" to "stop" only, its
    dumps written here: the machine instructions per execution, which other load does not
    change (the run itself is some 20x slower)."""
    verbose: bool = True
    pgbouncer: str | None = None
    """Workers reach the database through a private PgBouncer in this pooling mode
    (``transaction``: with ``pooler=pgbouncer-transaction``; ``session``); None: directly."""
    max_foreign: float | None = None
    """Rerun a run during which other processes used more than this many cores."""
    retries: int = 3
    """How many times a noisy run (see ``max_foreign``) is rerun at most."""
    warm: bool = False
    """Start every worker's scheduler first, then insert the rows: the clock runs from their
    commit (a running fleet), not from the release of freshly started workers (whose startup,
    K at once, is then part of the run)."""
    uvloop: bool = False
    """Workers run on uvloop's event loop (as uvicorn does when uvloop is installed)."""
    settle: float = 0.0
    """Before each run, wait up to this many seconds for the machine to be quiet (CPU busy
    at most ``_QUIET``); the busy fraction seen is reported with the run either way."""
    history: bool = True
    """Record every execution in the history table (the library's default); ``--no-history``
    turns it off, to measure what it costs."""
    transactional: bool = False
    """Complete each execution through ``ctx.transaction()`` (one transaction per execution
    with its completion and history), instead of the batched completion."""
    max_concurrency: int | None = None
    record_missed_slots: bool = True
    """The ``record_missed_slots`` setting (``--no-missed-slots``: off)."""
    checkin_url: str | None = None
    """Ping this URL per execution through a ``CheckIns`` observer (``/start`` and success)."""
    """Give the no-op job this cluster-wide concurrency limit (claimed under its lock)."""
    unknown_rows: int = 0
    """Rows of ten task names no worker knows (another service sharing the table), half due a
    day ago and half due tomorrow, inserted with the table before each run; never touched."""


@dataclasses.dataclass
class WorkerReport:
    """What one worker process says about its run."""

    index: int
    pid: int
    executed: int
    instances: list[str]
    recorded: int
    finish_calls: int
    polls: int
    claimed: int
    full_polls: int
    go: float
    started: float | None
    first_claim: float | None
    last_finish: float | None
    timed_out: bool
    last_error: str | None
    cpu_seconds: float = 0.0
    """CPU time (user + system) this worker spent between "go" and "stop"."""
    poll_seconds: float = 0.0
    """Wall time spent awaiting ``repository.poll`` (claim statements)."""
    finish_seconds: float = 0.0
    """Wall time spent awaiting ``repository.finish`` (completion statements)."""


@dataclasses.dataclass
class RunResult:
    """One run of one (strategy, processes) pair."""

    strategy: str
    processes: int
    n: int
    repeat: int
    seconds: float | None
    executed: int
    distinct: int
    recorded: int
    left: int
    picked: int
    polls: int
    claimed: int
    load_seconds: float
    timed_out: bool
    errors: list[str]
    per_worker: list[int] = dataclasses.field(default_factory=list)
    """Executions of each worker (how the work was shared)."""
    busy_before: float | None = None
    """CPU busy fraction of the whole machine just before the run (other load skews it)."""
    busy_during: float | None = None
    """CPU busy fraction of the whole machine from "go" until the table was seen empty."""
    foreign_cores: float | None = None
    """CPU used during the run by processes other than the workers, the PostgreSQL server
    and this harness, in cores (0.5 = half a core): other load that skews the rate."""
    attempts: int = 1
    worker_cpu: float = 0.0
    """CPU seconds all workers spent in the timed part (less sensitive to other load)."""
    finish_calls: int = 0
    poll_seconds: float = 0.0
    finish_seconds: float = 0.0
    history: bool = True
    history_rows: int = 0
    """Rows in the history table after the run: n with history on, 0 with it off."""
    instructions: int | None = None
    """Machine instructions all workers ran from "go" to "stop" (``--callgrind-dir``)."""

    @property
    def instructions_per_execution(self) -> float | None:
        return self.instructions / self.n if self.instructions is not None and self.n else None

    @property
    def worker_cpu_per_execution(self) -> float | None:
        """Microseconds of worker CPU per execution."""
        return self.worker_cpu / self.n * 1e6 if self.n else None

    @property
    def rate(self) -> float | None:
        if self.seconds is None or self.seconds <= 0:
            return None
        return self.n / self.seconds

    @property
    def duplicates(self) -> int:
        """Executions beyond the first of an instance (must be 0)."""
        return self.executed - self.distinct

    @property
    def missing(self) -> int:
        return self.n - self.distinct

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and not self.errors
            and self.executed == self.n
            and self.duplicates == 0
            and self.missing == 0
            and self.recorded == self.n
            and self.left == 0
            and self.picked == 0
            and self.history_rows == (self.n if self.history else 0)
        )

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            rate=self.rate,
            duplicates=self.duplicates,
            missing=self.missing,
            ok=self.ok,
            worker_cpu_per_execution_us=self.worker_cpu_per_execution,
            instructions_per_execution=self.instructions_per_execution,
        )
        return data


@dataclasses.dataclass
class Summary:
    """The median of the repeats of one (strategy, processes) pair."""

    strategy: str
    processes: int
    runs: int
    ok_runs: int
    median: float | None
    low: float | None
    high: float | None
    duplicates: int
    missing: int
    left: int
    picked: int
    cpu_us: float | None = None
    """Median worker CPU per execution, microseconds."""
    foreign: float | None = None
    """The largest foreign CPU load (cores) during the runs kept."""


def summarize(results: Sequence[RunResult]) -> list[Summary]:
    groups: dict[tuple[str, int], list[RunResult]] = collections.defaultdict(list)
    for result in results:
        groups[(result.strategy, result.processes)].append(result)
    out = []
    for (strategy, processes), runs in groups.items():
        rates = [r.rate for r in runs if r.ok and r.rate is not None]
        out.append(
            Summary(
                strategy=strategy,
                processes=processes,
                runs=len(runs),
                ok_runs=sum(r.ok for r in runs),
                median=statistics.median(rates) if rates else None,
                low=min(rates) if rates else None,
                high=max(rates) if rates else None,
                duplicates=sum(r.duplicates for r in runs),
                missing=sum(r.missing for r in runs),
                left=sum(r.left for r in runs),
                picked=sum(r.picked for r in runs),
                cpu_us=statistics.median(cpu) if (cpu := _cpu_list(runs)) else None,
                foreign=max(
                    (r.foreign_cores for r in runs if r.foreign_cores is not None), default=None
                ),
            )
        )
    return out


def _cpu_list(runs: Sequence[RunResult]) -> list[float]:
    return [c for r in runs if r.ok and (c := r.worker_cpu_per_execution) is not None]


def _fmt_rate(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "n/a"


def format_table(summaries: Sequence[Summary], n: int) -> str:
    lines = [
        "| strategy | processes | executions/s (median) | min - max | runs ok | "
        "executed - N | duplicates | left / picked | worker CPU us/exec | foreign load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        lines.append(
            f"| {s.strategy} | {s.processes} | {_fmt_rate(s.median)} | "
            f"{_fmt_rate(s.low)} - {_fmt_rate(s.high)} | {s.ok_runs}/{s.runs} | "
            f"{-s.missing + s.duplicates:+d} | {s.duplicates} | {s.left} / {s.picked} | "
            f"{f'{s.cpu_us:.0f}' if s.cpu_us is not None else 'n/a'} | "
            f"{_fmt_cores(s.foreign)} |"
        )
    return "\n".join(lines)


# -- database helpers ---------------------------------------------------------------------


def is_mysql(url: str) -> bool:
    """A MySQL or MariaDB server (``mysql://``, ``mariadb+asyncmy://``, ...)."""
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


def _with_database(url: str, database: str) -> str:
    parsed = make_url(url)
    driver = f"{parsed.get_backend_name()}+asyncmy" if is_mysql(url) else "postgresql+asyncpg"
    return parsed.set(drivername=driver, database=database).render_as_string(hide_password=False)


@contextlib.asynccontextmanager
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """Create an empty database on the server for this benchmark; drop it afterwards."""
    name = f"ekbatan_bench_{uuid.uuid4().hex[:10]}"
    mysql = is_mysql(server_url)
    admin = create_async_engine(
        _with_database(server_url, make_url(server_url).database or "postgres"),
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
    )
    quoted = f"`{name}`" if mysql else f'"{name}"'
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {quoted}"))
        yield _with_database(server_url, name)
    finally:
        with contextlib.suppress(Exception):
            async with admin.connect() as conn:
                drop = f"DROP DATABASE {quoted}" + ("" if mysql else " WITH (FORCE)")
                await conn.execute(text(drop))
        await admin.dispose()


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """An embedded PostgreSQL in a temporary directory, deleted afterwards."""
    from ekbatan_fastapi.store.embedded import start_embedded_postgres

    base = Path(tempfile.mkdtemp(prefix="ekbatan-bench-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    try:
        yield server.url("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


_INSERT_SQL = f"""
INSERT INTO {TABLE} (task_name, task_instance, task_data, execution_time, picked, version,
                     priority)
SELECT :name, 'i' || g, NULL, now() - interval '1 hour' + g * interval '1 microsecond',
       false, 1, 0
FROM generate_series(1, :n) AS g
"""


async def recreate_table(engine: AsyncEngine) -> None:
    """Drop and create ``scheduled_tasks`` (empty), and empty the history."""
    from ekbatan_fastapi import create_schema

    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with auto.connect() as conn:
        # only when present: MySQL answers IF EXISTS on a missing table with a warning
        if await conn.run_sync(lambda sync: inspect(sync).has_table(TABLE)):
            await conn.execute(text(f"DROP TABLE {TABLE}"))
    await create_schema(engine)
    async with auto.connect() as conn:
        await conn.execute(text(f"TRUNCATE TABLE {HISTORY_TABLE}"))


async def insert_unknown(engine: AsyncEngine, count: int) -> None:
    """``count`` rows of ten task names no worker knows (``other-service-0`` ... ``-9``): half
    due a day ago, half due tomorrow."""
    if count <= 0:
        return
    backend = engine.dialect.name
    async with engine.begin() as conn:
        if backend in ("mysql", "mariadb"):  # asyncmy's dialect may say mysql for MariaDB
            version = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
            backend = "mariadb" if "mariadb" in version.lower() else "mysql"
        for sql in common.other_service_rows(backend, count, prefix="other-service-", instance="u"):
            await conn.execute(text(sql))


async def load_table(
    engine: AsyncEngine, n: int, how: str, *, recreate: bool = True, unknown: int = 0
) -> float:
    """Recreate the table (unless not ``recreate``), with ``unknown`` rows of other task names,
    and insert ``n`` due rows; returns the insert's seconds."""
    if recreate:
        await recreate_table(engine)
        await insert_unknown(engine, unknown)
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    mysql = engine.dialect.name in ("mysql", "mariadb")
    started = time.perf_counter()
    if how == "sql" and mysql:  # no generate_series: a multi-row insert per 5,000 rows
        from ekbatan_fastapi import scheduled_tasks

        base = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        rows = [
            {"task_name": TASK_NAME, "task_instance": f"i{g}", "picked": False, "version": 1}
            | {"execution_time": base + dt.timedelta(microseconds=g), "priority": 0}
            for g in range(1, n + 1)
        ]
        async with engine.begin() as conn:
            for chunk in range(0, n, 5000):
                await conn.execute(insert(scheduled_tasks).values(rows[chunk : chunk + 5000]))
    elif how == "sql":
        async with engine.begin() as conn:
            await conn.execute(text(_INSERT_SQL), {"name": TASK_NAME, "n": n})
    elif how == "batch":
        from ekbatan_fastapi.domain.rows import NewTask
        from ekbatan_fastapi.store.dialects import open_store

        base = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        tasks = [
            NewTask(TASK_NAME, f"i{g}", base + dt.timedelta(microseconds=g))
            for g in range(1, n + 1)
        ]
        dialect = "mysql" if mysql else "postgresql"
        inserted = await open_store(engine, dialect, TABLE).tasks.insert_missing(tasks)
        if len(inserted) != n:
            raise RuntimeError(f"batch insert wrote {len(inserted)} of {n} rows")
    else:
        raise ValueError(f"unknown insert mode {how!r}")
    seconds = time.perf_counter() - started
    if not recreate:
        return seconds
    async with auto.connect() as conn:
        if mysql:
            await conn.execute(text(f"ANALYZE TABLE {TABLE}"))
            return seconds
        await conn.execute(text(f"VACUUM ANALYZE {TABLE}"))
        with contextlib.suppress(Exception):  # needs superuser or pg_checkpoint; optional
            await conn.execute(text("CHECKPOINT"))
    return seconds


async def table_state(engine: AsyncEngine) -> tuple[int, int]:
    """The benchmark's own rows left, and how many of them are picked (``--unknown-rows``
    are not counted)."""
    sql = (
        f"SELECT count(*), COALESCE(SUM(CASE WHEN picked THEN 1 END), 0) FROM {TABLE} "
        "WHERE task_name = :name"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(text(sql), {"name": TASK_NAME})).one()
    return int(row[0]), int(row[1])


async def history_rows(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {HISTORY_TABLE}"))).scalar_one())


async def server_info(engine: AsyncEngine) -> dict[str, str]:
    if engine.dialect.name in ("mysql", "mariadb"):
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog")
                )
            ).one()
        return {
            "server_version": str(row[0]),
            "innodb_flush_log_at_trx_commit": str(row[1]),
            "sync_binlog": str(row[2]),
        }
    async with engine.connect() as conn:
        version = (await conn.execute(text("SHOW server_version"))).scalar_one()
        fsync = (await conn.execute(text("SHOW fsync"))).scalar_one()
        sync_commit = (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()
    return {"server_version": version, "fsync": fsync, "synchronous_commit": sync_commit}


def _process_ticks() -> dict[int, tuple[int, int]]:
    """``pid -> (ppid, utime + stime)`` in clock ticks, for every process (Linux)."""
    out: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            out[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _family(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    """``roots`` and all their descendants."""
    family = set(roots)
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in table.items() if ppid in family} - family
        family |= new
        grew = bool(new)
    return family


class CpuWatch:
    """Splits the machine's CPU time during a run into ours (the workers and their children,
    this harness, and the given server processes) and foreign (anything else: other load,
    which skews the figure)."""

    def __init__(self, roots: set[int], server: set[int]) -> None:
        self.roots = roots | {os.getpid()}
        self.server = set(server)
        self._machine = common.cpu_times()
        self._ours = self._our_ticks()

    def _our_ticks(self) -> dict[int, int]:
        table = _process_ticks()
        pids = _family(self.roots, table) | self.server
        return {pid: table[pid][1] for pid in pids if pid in table}

    def stop(self, server: set[int]) -> tuple[float | None, float | None]:
        """(the machine's busy fraction, foreign CPU in cores) since construction;
        ``server``: the server processes that serve us now (added to those at the start)."""
        self.server |= server
        machine, ours = common.cpu_times(), self._our_ticks()
        if self._machine is None or machine is None or machine[0] <= self._machine[0]:
            return None, None
        total = machine[0] - self._machine[0]
        busy = total - (machine[1] - self._machine[1])
        our_busy = sum(ticks - self._ours.get(pid, 0) for pid, ticks in ours.items())
        cores = os.cpu_count() or 1
        return busy / total, max(0.0, busy - our_busy) / (total / cores)


def _pid_from_file(path: str) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        return {int(Path(path).read_text().strip())}
    return set()


async def server_pids(engine: AsyncEngine) -> set[int]:
    """The server processes working for this benchmark: the backends of its database and the
    shared auxiliary processes (WAL writer, checkpointer, ...). Other databases' backends
    (another test suite on the same server) count as foreign load."""
    if engine.dialect.name in ("mysql", "mariadb"):  # one process, from its pid file
        async with engine.connect() as conn:
            pid_file = (await conn.execute(text("SELECT @@pid_file"))).scalar_one()
        return _pid_from_file(str(pid_file))
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() OR datname IS NULL"
            )
        )
        return {int(row[0]) for row in rows}


async def settle(limit: float) -> float | None:
    """Wait up to ``limit`` seconds for the machine to be quiet; the last busy fraction."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    busy = await common.cpu_busy()
    while busy is not None and busy > _QUIET and loop.time() < deadline:
        busy = await common.cpu_busy(1.0)
    return busy


# -- the parent: one run ---------------------------------------------------------------------


class _Worker:
    """A worker process seen from the parent."""

    def __init__(
        self, index: int, proc: asyncio.subprocess.Process, result: Path, log: Path
    ) -> None:
        self.index = index
        self.proc = proc
        self.result = result
        self.log = log

    async def expect(self, word: str, within: float) -> None:
        """Wait up to ``within`` seconds for a line ``word`` on the worker's stdout."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(max(within, 0.01)):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(
                        f"worker {self.index} exited before saying {word!r}; its log:\n"
                        + _tail(self.log)
                    )
                if line.decode().strip() == word:
                    return

    async def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{word}\n".encode())
        await self.proc.stdin.drain()

    async def close(self, within: float) -> None:
        """Close stdin, drain stdout, wait for the exit; kill the process if it lingers."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        with contextlib.suppress(Exception):
            await self.proc.stdin.wait_closed()
        try:
            async with asyncio.timeout(within):
                while await self.proc.stdout.read(65536):
                    pass
                await self.proc.wait()
        except TimeoutError:
            if self.proc.returncode is None:
                self.proc.kill()
            with contextlib.suppress(Exception):
                await self.proc.stdout.read()
            await self.proc.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _spawn(
    index: int, db_url: str, strategy: str, options: BenchOptions, run_dir: Path, deadline: float
) -> _Worker:
    result = run_dir / f"worker-{index}.json"
    log = run_dir / f"worker-{index}.log"
    prefix = list(options.worker_prefix)
    if options.callgrind_dir is not None:
        options.callgrind_dir.mkdir(parents=True, exist_ok=True)
        dumps = options.callgrind_dir / f"{run_dir.name}-worker-{index}.%p"
        prefix += common.callgrind_command(dumps)
    args = [
        *prefix,
        sys.executable,
        str(THIS_FILE),
        "--worker",
        "--url",
        db_url,
        "--strategy",
        strategy,
        "--index",
        str(index),
        "--result",
        str(result),
        "--deadline",
        repr(deadline),
    ]
    if options.batch_size is not None:
        args += ["--batch-size", str(options.batch_size)]
    if options.polling_interval is not None:
        args += ["--polling-interval", repr(options.polling_interval)]
    if not options.history:
        args.append("--no-history")
    if options.transactional:
        args.append("--transactional")
    if options.uvloop:
        args.append("--uvloop")
    if options.warm:
        args.append("--warm")
    if options.max_concurrency is not None:
        args += ["--max-concurrency", str(options.max_concurrency)]
    if not options.record_missed_slots:
        args.append("--no-missed-slots")
    if options.checkin_url is not None:
        args += ["--checkin-url", options.checkin_url]
    if options.pgbouncer == "transaction":
        args += ["--pooler", "pgbouncer-transaction"]
    if options.cprofile_dir is not None:
        options.cprofile_dir.mkdir(parents=True, exist_ok=True)
        args += ["--cprofile", str(options.cprofile_dir / f"{run_dir.name}-worker-{index}.pstats")]
    elif options.callgrind_dir is not None:
        args.append("--callgrind-toggle")
    with log.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
        )
    return _Worker(index, proc, result, log)


async def run_once(
    db_url: str,
    strategy: str,
    processes: int,
    repeat: int,
    options: BenchOptions,
    work: Path,
    attempt: int = 1,
    worker_url: str | None = None,
) -> RunResult:
    """Load the table, run ``processes`` workers until it is empty, and check the result;
    the workers connect to ``worker_url`` (a pooler) when given."""
    engine = create_async_engine(db_url, pool_size=2, max_overflow=0)
    errors: list[str] = []
    workers: list[_Worker] = []
    reports: list[WorkerReport] = []
    left = picked = history = 0
    go = 0.0
    load_seconds = 0.0
    busy_before: float | None = None
    busy_during: float | None = None
    foreign_cores: float | None = None
    run_dir = work / f"{strategy}-k{processes}-r{repeat}-a{attempt}"
    run_dir.mkdir(parents=True)
    if options.callgrind_dir is not None:  # an earlier invocation's dumps of the same run
        for dump in options.callgrind_dir.glob(f"{run_dir.name}-worker-*"):
            dump.unlink()
    try:
        if options.warm:
            await recreate_table(engine)
            await insert_unknown(engine, options.unknown_rows)
        else:
            load_seconds = await load_table(
                engine, options.n, options.insert, unknown=options.unknown_rows
            )
        busy_before = await settle(options.settle)
        loop = asyncio.get_running_loop()
        start_deadline = loop.time() + options.timeout
        # The workers' own deadline (monotonic, shared by all processes) bounds them even if
        # this process dies: startup timeout + run timeout + shutdown.
        worker_deadline = time.monotonic() + 2 * options.timeout + 30
        for index in range(processes):
            workers.append(
                await _spawn(
                    index, worker_url or db_url, strategy, options, run_dir, worker_deadline
                )
            )
        await asyncio.gather(*(w.expect("ready", start_deadline - loop.time()) for w in workers))
        if options.warm:  # start them all, then give them the rows
            await asyncio.gather(*(w.send("go") for w in workers))
            await asyncio.gather(
                *(w.expect("started", start_deadline - loop.time()) for w in workers)
            )
            load_seconds = await load_table(engine, options.n, options.insert, recreate=False)
        watch = CpuWatch({w.proc.pid for w in workers}, await server_pids(engine))
        go = time.monotonic()
        await asyncio.gather(*(w.send("run" if options.warm else "go") for w in workers))
        timed_out = True
        run_deadline = loop.time() + options.timeout
        while loop.time() < run_deadline:
            await asyncio.sleep(_MONITOR_INTERVAL)
            left, _ = await table_state(engine)
            if left == 0:
                timed_out = False
                busy_during, foreign_cores = watch.stop(await server_pids(engine))
                break
            if any(w.proc.returncode is not None for w in workers):
                errors.append("a worker exited during the run")
                break
        await asyncio.gather(*(w.send("stop") for w in workers), return_exceptions=True)
        await asyncio.gather(*(w.expect("done", 60.0) for w in workers), return_exceptions=True)
        for w in workers:
            try:
                reports.append(WorkerReport(**json.loads(w.result.read_text())))
            except (OSError, ValueError, TypeError) as error:
                errors.append(f"worker {w.index}: no result ({error}); log:\n{_tail(w.log)}")
        left, picked = await table_state(engine)
        history = await history_rows(engine)
    finally:
        await asyncio.gather(*(w.close(60.0) for w in workers), return_exceptions=True)
        await engine.dispose()
    for report in reports:
        if report.timed_out:
            errors.append(f"worker {report.index} hit its deadline")
        if report.last_error:
            errors.append(f"worker {report.index}: {report.last_error}")
    counts = collections.Counter(i for report in reports for i in report.instances)
    finishes = [r.last_finish for r in reports if r.last_finish is not None]
    seconds = max(finishes) - go if finishes and not timed_out else None
    instructions = None
    if options.callgrind_dir is not None:
        dumps_of_run = f"{run_dir.name}-worker-"
        instructions = common.callgrind_instructions(options.callgrind_dir, dumps_of_run)
    return RunResult(
        instructions=instructions,
        strategy=strategy,
        processes=processes,
        n=options.n,
        repeat=repeat,
        seconds=seconds,
        executed=sum(counts.values()),
        distinct=len(counts),
        recorded=sum(r.recorded for r in reports),
        left=left,
        picked=picked,
        polls=sum(r.polls for r in reports),
        claimed=sum(r.claimed for r in reports),
        load_seconds=load_seconds,
        timed_out=timed_out,
        errors=errors,
        per_worker=[r.executed for r in reports],
        busy_before=busy_before,
        busy_during=busy_during,
        foreign_cores=foreign_cores,
        worker_cpu=sum(r.cpu_seconds for r in reports),
        finish_calls=sum(r.finish_calls for r in reports),
        poll_seconds=sum(r.poll_seconds for r in reports),
        finish_seconds=sum(r.finish_seconds for r in reports),
        history=options.history,
        history_rows=history,
    )


def _say(options: BenchOptions, message: str) -> None:
    if options.verbose:
        print(message, flush=True)


async def run_benchmark(
    options: BenchOptions, server_url: str | None = None
) -> tuple[list[RunResult], dict[str, str]]:
    """Run every (repeat, strategy, processes) combination in a fresh database.

    ``server_url``: a server where databases may be created; None starts an embedded one.
    Returns the runs and a description of the environment.
    """
    for strategy in options.strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; use {', '.join(STRATEGIES)}")
    with contextlib.ExitStack() as stack:
        if server_url is None:
            server_url = stack.enter_context(embedded_server())
        common.check_local(server_url)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ekbatan-bench-")))
        async with fresh_database(server_url) as db_url:
            probe = create_async_engine(db_url, poolclass=NullPool)
            try:
                info = await server_info(probe)
            finally:
                await probe.dispose()
            info.update(environment())
            info["history"] = "on" if options.history else "off"
            info["completion"] = (
                "ctx.transaction() per execution" if options.transactional else "batched"
            )
            info["max_concurrency"] = options.max_concurrency
            worker_url = None
            if options.pgbouncer:
                try:
                    from bench.servers import pgbouncer
                except ImportError:  # run as a script: bench/ is on sys.path
                    from servers import pgbouncer  # type: ignore[no-redef]

                bouncer = stack.enter_context(
                    pgbouncer(server_url, mode=options.pgbouncer, pool_size=4)
                )
                worker_url = bouncer.url(db_url)
                info["pooler"] = f"PgBouncer 1.18, {options.pgbouncer} mode, 4 server connections"
            results: list[RunResult] = []
            for repeat in range(1, options.repeat + 1):
                for strategy in options.strategies:
                    for processes in options.processes:
                        attempts: list[RunResult] = []
                        for attempt in range(1, options.retries + 2):
                            result = await run_once(
                                db_url,
                                strategy,
                                processes,
                                repeat,
                                options,
                                work,
                                attempt,
                                worker_url=worker_url,
                            )
                            result.attempts = attempt
                            attempts.append(result)
                            _say(options, _describe(result))
                            if not _noisy(result, options):
                                break
                        results.append(_quietest(attempts))
    return results, info


def _quietest(attempts: Sequence[RunResult]) -> RunResult:
    """Of the attempts of one run, the one disturbed least by other load (a failed attempt
    is kept only when every attempt failed, so that the failure is reported)."""
    ok = [a for a in attempts if a.ok] or list(attempts)
    return min(ok, key=lambda a: a.foreign_cores if a.foreign_cores is not None else 0.0)


def _noisy(result: RunResult, options: BenchOptions) -> bool:
    limit = options.max_foreign
    return limit is not None and result.foreign_cores is not None and result.foreign_cores > limit


def _describe(r: RunResult) -> str:
    seconds = f"{r.seconds:.3f}s" if r.seconds is not None else "n/a"
    per_poll = r.claimed / r.polls if r.polls else 0.0
    text_ = (
        f"run {r.repeat} {r.strategy:<14} K={r.processes}: {_fmt_rate(r.rate):>7}/s "
        f"({seconds}); executed {r.executed} distinct {r.distinct} dup {r.duplicates} "
        f"recorded {r.recorded} left {r.left} picked {r.picked} history {r.history_rows}; "
        f"polls {r.polls} "
        f"(~{per_poll:.1f} claimed, {_ms(r.poll_seconds, r.polls)} each); "
        f"finishes {r.finish_calls} ({_ms(r.finish_seconds, r.finish_calls)} each); "
        f"split {'/'.join(map(str, r.per_worker))}; "
        f"load {r.load_seconds:.2f}s; busy before {_fmt_busy(r.busy_before)} during "
        f"{_fmt_busy(r.busy_during)} (foreign {_fmt_cores(r.foreign_cores)}, "
        f"attempt {r.attempts}); worker CPU {r.worker_cpu_per_execution or 0:.0f} us/exec "
        + (
            f"({r.instructions_per_execution:,.0f} instructions/exec) "
            if r.instructions_per_execution is not None
            else ""
        )
        + f"{'OK' if r.ok else 'FAILED'}"
    )
    for error in r.errors:
        text_ += f"\n    ! {error}"
    return text_


def _ms(total: float, count: int) -> str:
    return f"{total / count * 1000:.2f} ms" if count else "n/a"


def _fmt_cores(value: float | None) -> str:
    return f"{value:.2f} cores" if value is not None else "n/a"


def _fmt_busy(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "n/a"


def environment() -> dict[str, str]:
    from importlib.metadata import version

    import ekbatan_fastapi

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "ekbatan_fastapi": ekbatan_fastapi.__version__,
        "sqlalchemy": version("sqlalchemy"),
        "asyncpg": version("asyncpg"),
        "asyncmy": version("asyncmy"),
        "cores": str(os.cpu_count()),
        "machine": platform.machine(),
    }


# -- the worker -----------------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.polls = 0
        self.claimed = 0
        self.full_polls = 0
        self.recorded = 0
        self.finish_calls = 0
        self.started: float | None = None
        self.first_claim: float | None = None
        self.last_finish: float | None = None
        self.poll_seconds = 0.0
        self.finish_seconds = 0.0


def _instrument(stats: _Stats) -> Any:
    """An observer that counts polls and completions, and times the last completion (it
    changes nothing in the scheduler)."""
    from ekbatan_fastapi import SchedulerObserver

    class Timings(SchedulerObserver):
        batch_size = 0

        def attached(self, scheduler: Any) -> None:
            self.batch_size = scheduler.batch_size

        def poll_answered(self, result: Any, started: float, seconds: float) -> None:
            stats.poll_seconds += seconds
            stats.polls += 1
            stats.claimed += len(result.claimed)
            if len(result.claimed) >= self.batch_size:
                stats.full_polls += 1
            if result.claimed and stats.first_claim is None:
                stats.first_claim = time.monotonic()

        def results_written(self, items: Any, recorded: Any, error: Any, seconds: float) -> None:
            stats.finish_seconds += seconds
            stats.finish_calls += 1
            if recorded:
                stats.recorded += len(recorded)
                stats.last_finish = time.monotonic()

    return Timings()


def _read_stdin(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line.strip())
    loop.call_soon_threadsafe(queue.put_nowait, "eof")


def _customizer(args: argparse.Namespace) -> Any:
    """The worker's scheduler settings, from its command line."""

    def customize(b: Any) -> None:
        b.polling_strategy(args.strategy)
        b.scheduler_name(f"bench-{args.index}-{os.getpid()}")
        if args.batch_size is not None:
            b.batch_size(args.batch_size)
        if args.polling_interval is not None:
            b.polling_interval(dt.timedelta(seconds=args.polling_interval))
        if args.no_history:
            b.history(False)
        if args.pooler:
            b.pooler(args.pooler)
        if args.no_missed_slots:
            b.record_missed_slots(False)
        if args.checkin_url:
            from ekbatan_fastapi.checkin import CheckIns

            b.observer(CheckIns({TASK_NAME: args.checkin_url}))

    return customize


async def _run_on_command(
    args: argparse.Namespace,
    registry: Any,
    commands: asyncio.Queue[str],
    stats: _Stats,
    profiler: cProfile.Profile | common.CallgrindToggle | None,
    remaining: Any,
) -> tuple[float, float, bool]:
    """Wait for "go", run until "stop": (when it went, its CPU seconds, whether it timed out)."""
    timed_out = False
    try:
        async with asyncio.timeout(remaining()):
            command = await commands.get()
    except TimeoutError:
        command, timed_out = "timeout", True
    go = time.monotonic()
    cpu_at_go = time.process_time()
    if command != "go":
        return go, 0.0, timed_out
    if args.warm:  # started first; the rows arrive after "started"
        await registry.start()
        await registry.wait_until_ready(remaining())
        print("started", flush=True)
        await commands.get()  # "run": the rows are committed
        go, cpu_at_go = time.monotonic(), time.process_time()
    if profiler is not None:
        profiler.enable()
    stats.started = time.monotonic()
    if args.warm:
        registry.scheduler.request_poll()  # as a NOTIFY of scheduled rows would
    else:
        await registry.start()
    try:
        async with asyncio.timeout(remaining()):
            await commands.get()  # "stop" (or "eof" when the parent went away)
    except TimeoutError:
        timed_out = True
    cpu_seconds = time.process_time() - cpu_at_go
    if profiler is not None:
        profiler.disable()
    return go, cpu_seconds, timed_out


async def _worker(args: argparse.Namespace) -> int:
    from ekbatan_fastapi import ExecutionContext, OneTimeJob, job_registry

    class NoopJob(OneTimeJob):
        """Does nothing but remember which instance it ran."""

        def __init__(self) -> None:
            self.instances: list[str] = []

        def name(self) -> str:
            return TASK_NAME

        def max_concurrency(self) -> int | None:
            return args.max_concurrency  # type: ignore[no-any-return]

        async def execute(self, ctx: ExecutionContext) -> None:
            self.instances.append(ctx.task_instance)
            if args.transactional:
                async with ctx.transaction():
                    pass  # no effects: only the completion and the history, committed
                stats.recorded += 1
                stats.last_finish = time.monotonic()

    def remaining() -> float:
        return max(0.01, float(args.deadline) - time.monotonic())

    job = NoopJob()
    stats = _Stats()
    timings = _instrument(stats)
    registry = (
        job_registry()
        .connection_provider(args.url)
        .with_job(job)
        .shutdown_max_wait(dt.timedelta(seconds=5))
        .customize_scheduler(_customizer(args))
        .customize_scheduler(lambda b: b.observer(timings))
        .build()
    )
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()
    threading.Thread(target=_read_stdin, args=(loop, commands), daemon=True).start()
    # Open the two connections the poller and the completer use, so that SQLAlchemy's
    # first-connect work is not timed (a running application has a warm pool).
    async with registry.engine.connect() as c1, registry.engine.connect() as c2:
        await c1.execute(text("SELECT 1"))
        await c2.execute(text("SELECT 1"))
    print("ready", flush=True)
    profiler: Any = cProfile.Profile() if args.cprofile else None
    if profiler is None and args.callgrind_toggle:
        profiler = common.callgrind_toggle()  # on at "go", off at "stop", as the profiler
    go, cpu_seconds, timed_out = await _run_on_command(
        args, registry, commands, stats, profiler, remaining
    )
    status = registry.status()
    await registry.stop()
    if args.cprofile:
        profiler.dump_stats(args.cprofile)
    report = WorkerReport(
        index=args.index,
        pid=os.getpid(),
        executed=len(job.instances),
        instances=job.instances,
        recorded=stats.recorded,
        finish_calls=stats.finish_calls,
        polls=stats.polls,
        claimed=stats.claimed,
        full_polls=stats.full_polls,
        go=go,
        started=stats.started,
        first_claim=stats.first_claim,
        last_finish=stats.last_finish,
        timed_out=timed_out,
        last_error=status.last_error,
        cpu_seconds=cpu_seconds,
        poll_seconds=stats.poll_seconds,
        finish_seconds=stats.finish_seconds,
    )
    await asyncio.to_thread(Path(args.result).write_text, json.dumps(dataclasses.asdict(report)))
    print("done", flush=True)
    return 0


# -- command line ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--url", help="a PostgreSQL or MySQL/MariaDB server on this machine (default: embedded)"
    )
    p.add_argument("-n", type=int, default=None, help=f"rows per run (default {DEFAULT_N})")
    p.add_argument(
        "-k", "--processes", type=int, nargs="+", default=None, help="worker processes (1 2 4)"
    )
    p.add_argument("--strategy", nargs="+", choices=STRATEGIES, default=None)
    p.add_argument("--repeat", type=int, default=None, help="runs per figure (median; 3)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run (300)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the library's")
    p.add_argument("--polling-interval", type=float, default=None, help="seconds")
    p.add_argument("--insert", choices=("sql", "batch"), default="sql")
    p.add_argument(
        "--no-history",
        action="store_true",
        help="turn the execution history off (on by default, as in the library)",
    )
    p.add_argument(
        "--transactional",
        action="store_true",
        help="complete each execution through ctx.transaction() (one transaction each)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="give the job this cluster-wide limit (its claims go through the limited path)",
    )
    p.add_argument(
        "--max-foreign",
        type=float,
        default=None,
        help="rerun a run when other processes used more than this many cores during it",
    )
    p.add_argument("--retries", type=int, default=3, help="reruns of a noisy run at most (3)")
    p.add_argument("--quick", action="store_true", help="N=1000, K=1 2, one run")
    p.add_argument(
        "--settle", type=float, default=0.0, help="wait up to S s for a quiet machine per run"
    )
    p.add_argument(
        "--pgbouncer",
        choices=("transaction", "session"),
        help="workers connect through a private PgBouncer in this mode (PostgreSQL only)",
    )
    p.add_argument("--pooler", help=argparse.SUPPRESS)
    p.add_argument("--no-missed-slots", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkin-url", help=argparse.SUPPRESS)
    p.add_argument(
        "--warm",
        action="store_true",
        help="start the workers' schedulers before inserting the rows (clock from the commit)",
    )
    p.add_argument(
        "--uvloop",
        action="store_true",
        help="workers run on uvloop (pip install uvloop; uvicorn's loop when installed)",
    )
    p.add_argument(
        "--unknown-rows",
        type=int,
        default=0,
        help="also F rows of ten task names no worker knows (half due, half due tomorrow)",
    )
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    p.add_argument("--cprofile-dir", type=Path, help="cProfile each worker's timed part")
    p.add_argument(
        "--callgrind-dir",
        type=Path,
        help="count each worker's instructions from go to stop (valgrind; dumps written here)",
    )
    p.add_argument("--worker-prefix", default="", help="e.g. 'py-spy record -o x.svg --'")
    # worker mode (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--cprofile", help=argparse.SUPPRESS)
    p.add_argument("--callgrind-toggle", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.strategy = args.strategy[0] if isinstance(args.strategy, list) else args.strategy
    return args


async def _interruptible(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; SIGTERM cancels it, so that workers and the embedded server are cleaned up
    (the ``finally`` blocks run) instead of being left behind."""
    task = asyncio.current_task()
    assert task is not None
    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await work


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        if args.uvloop:
            import uvloop

            return uvloop.run(_worker(args))
        return asyncio.run(_worker(args))
    quick = args.quick
    options = BenchOptions(
        n=args.n or (1000 if quick else DEFAULT_N),
        processes=tuple(args.processes or ((1, 2) if quick else DEFAULT_PROCESSES)),
        strategies=tuple(args.strategy or STRATEGIES),
        repeat=args.repeat or (1 if quick else 3),
        timeout=args.timeout,
        batch_size=args.batch_size,
        polling_interval=args.polling_interval,
        insert=args.insert,
        worker_prefix=tuple(shlex.split(args.worker_prefix)),
        cprofile_dir=args.cprofile_dir,
        callgrind_dir=args.callgrind_dir,
        settle=args.settle,
        max_foreign=args.max_foreign,
        retries=args.retries,
        history=not args.no_history,
        transactional=args.transactional,
        max_concurrency=args.max_concurrency,
        pgbouncer=args.pgbouncer,
        uvloop=args.uvloop,
        warm=args.warm,
        unknown_rows=args.unknown_rows,
    )
    if args.url:
        common.check_local(args.url)
    try:
        results, info = asyncio.run(_interruptible(run_benchmark(options, args.url)))
    except asyncio.CancelledError:
        print("interrupted (SIGTERM): workers stopped, temporary server removed", file=sys.stderr)
        return 143
    summaries = summarize(results)
    print()
    print(
        f"N={options.n}, repeat={options.repeat}, batch={options.batch_size or 'default'}, "
        f"polling interval={options.polling_interval or 'default'}, "
        f"unknown rows={options.unknown_rows:,}; " + ", ".join(f"{k} {v}" for k, v in info.items())
    )
    print(format_table(summaries, options.n))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "options": {
                        k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in dataclasses.asdict(options).items()
                        if k not in ("cprofile_dir", "callgrind_dir")
                    },
                    "environment": info,
                    "runs": [r.as_dict() for r in results],
                    "summary": [dataclasses.asdict(s) for s in summaries],
                },
                indent=2,
            )
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
