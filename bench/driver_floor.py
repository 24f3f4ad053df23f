"""The driver's floor: the client CPU per row of the PostgreSQL task store's own claim and
completion statements, sent by one asyncpg connection in a plain loop, with no scheduler.

    python bench/driver_floor.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/driver_floor.py                  # embedded PostgreSQL in a temp dir

Each round claims 50 due rows (the default batch) with the lock-and-fetch statement (verbatim
from ``PostgresTaskStore.statements()``, the pause-aware variant a scheduler uses, as
``db_limit.py`` hands it to pgbench) and records them with the
completion that also writes the history, as the scheduler sends it for no-op successes (the
results' keys and versions, the history's times; NULL where every row has the same value).
What it measures is what no scheduler on this driver can go below: asyncpg's encoding and
decoding, its protocol and the socket, per row. ``bench/throughput.py``'s "worker CPU
us/exec" (1 process, lock-and-fetch) is the same work plus the scheduler's; the difference
is what the scheduler itself costs per execution (docs/BENCHMARKS.md).

It prints a table; it never asserts. The server must be on this machine.

    python bench/driver_floor.py --url ... --callgrind /tmp/floor-cg

``--callgrind DIR`` runs it once more under valgrind's callgrind, instrumented only in the
timed loop, and prints the machine instructions per row, which other load on the machine
does not change (``throughput.py --callgrind-dir`` counts the scheduler's the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

try:
    from bench import common, throughput
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.postgresql.statements import Statement

BATCH = 50
"""Rows per claim: the library's default batch size for one job (``max(50, 3 x jobs)``); the
statements' text is ``statements()``'s, made for it."""


@dataclass
class FloorRun:
    rows: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_seconds / self.rows * 1e6 if self.rows else 0.0


async def measure(db_url: str, n: int, toggle: Any = None) -> FloorRun:
    """Load ``n`` due rows into a fresh table and drain them in rounds of ``BATCH``
    (``toggle``: callgrind's instrumentation on around the rounds only)."""
    engine = create_async_engine(db_url)
    try:
        await throughput.load_table(engine, n, "sql")
        sql = open_store(engine, "postgresql", throughput.TABLE).tasks.statements()
    finally:
        await engine.dispose()
    poll = Statement("poll", sql["lock_and_fetch"])
    finish = Statement("finish", sql["finish_history"])
    params = {"limit": BATCH, "picked_by": "floor", "names": [throughput.TASK_NAME]}
    poll_args = poll.args(params)
    conn = await asyncpg.connect(common.asyncpg_dsn(db_url))
    try:
        done = 0
        if toggle is not None:
            toggle.on()
        cpu, wall = time.process_time(), time.perf_counter()
        while True:
            rows = [r for r in await conn.fetch(poll.sql, *poll_args) if r[0] is not None]
            if not rows:
                break
            now = dt.datetime.now(dt.UTC)
            results = {
                "names": [r[0] for r in rows],
                "instances": [r[1] for r in rows],
                "versions": [r[10] for r in rows],
                "next_times": None,
                "kinds": None,
                "picked_by": "floor",
                "h_times": [r[3] for r in rows],
                "h_started": [now] * len(rows),
                "h_finished": [now] * len(rows),
                "h_outcomes": None,
                "h_classes": None,
                "h_messages": None,
            }
            done += len(await conn.fetch(finish.sql, *finish.args(results)))
        run = FloorRun(done, time.perf_counter() - wall, time.process_time() - cpu)
        if toggle is not None:
            toggle.off()
        return run
    finally:
        await conn.close()


async def run(url: str | None, n: int, repeat: int, toggle: Any = None) -> list[FloorRun]:
    runs: list[FloorRun] = []
    with throughput.embedded_server() if url is None else contextlib.nullcontext(url) as server:
        for _ in range(repeat):
            async with throughput.fresh_database(server) as db_url:
                runs.append(await measure(db_url, n, toggle))
    return runs


def instructions_per_row(url: str, n: int, folder: Path) -> float:
    """Run one measurement under callgrind (this script, ``--callgrind-inner``) and read its
    count: machine instructions per row of the timed loop."""
    folder.mkdir(parents=True, exist_ok=True)
    for dump in folder.glob("floor.*"):
        dump.unlink()
    command = [
        *common.callgrind_command(folder / "floor.%p"),
        *(sys.executable, __file__, "--url", url, "-n", str(n), "--callgrind-inner"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # its own output says why (valgrind's and Python's, last lines)
        shown = make_url(url).render_as_string(hide_password=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(
            f"the run under callgrind (driver_floor.py --url {shown} --callgrind-inner) exited "
            f"with {done.returncode}; it needs valgrind's callgrind.h and cc (Debian: "
            f"apt-get install valgrind gcc) and the server reachable. Its last lines:\n{tail}"
        )
    return common.callgrind_instructions(folder, "floor.") / n


def format_table(runs: Sequence[FloorRun], n: int) -> str:
    cpu = statistics.median(r.cpu_us_per_row for r in runs)
    rate = statistics.median(r.rate for r in runs)
    return "\n".join(
        [
            "| rows | batch | runs | rows/s (median) | client CPU us/row (median) | min - max |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {n} | {BATCH} | {len(runs)} | {rate:,.0f} | {cpu:.1f} | "
            f"{min(r.cpu_us_per_row for r in runs):.1f} - "
            f"{max(r.cpu_us_per_row for r in runs):.1f} |",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: embedded)")
    p.add_argument("-n", type=int, default=20_000, help="rows per run (20000)")
    p.add_argument("--repeat", type=int, default=3, help="runs (median; 3)")
    p.add_argument(
        "--callgrind",
        type=Path,
        metavar="DIR",
        help="then count the instructions per row under valgrind (needs --url; dumps in DIR)",
    )
    p.add_argument("--callgrind-inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.url is not None and throughput.is_mysql(args.url):
        print("driver_floor.py measures asyncpg (PostgreSQL) only", file=sys.stderr)
        return 2
    if args.callgrind is not None and args.url is None:
        print("--callgrind needs --url (a server outside valgrind)", file=sys.stderr)
        return 2
    if args.callgrind_inner:  # under valgrind: one run, instrumented in its loop only
        asyncio.run(run(args.url, args.n, 1, common.callgrind_toggle()))
        return 0
    runs = asyncio.run(run(args.url, args.n, args.repeat))
    print(f"python {sys.version.split()[0]}, asyncpg {asyncpg.__version__}")
    print(format_table(runs, args.n))
    if args.callgrind is not None:
        count = instructions_per_row(args.url, args.n, args.callgrind)
        print(f"instructions per row (callgrind, one run of {args.n:,} rows): {count:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
