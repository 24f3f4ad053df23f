"""The database's own limit for our hot-path SQL: pgbench runs the claim and complete statements
of ``PostgresRepository`` on the same ``scheduled_tasks`` table, with the same row count and the
same number of clients as ``throughput.py`` has worker processes.

    python bench/db_limit.py                     # private PostgreSQL cluster, N=20000, c=1 2
    python bench/db_limit.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test
    python bench/db_limit.py --quick             # N=2000, one repeat

One pgbench transaction is what one worker does per batch, with the task store's statement
texts verbatim (read from a ``PostgresRepository`` instance, the pause-aware variant that a
scheduler uses once the operations tables exist):

* ``lock-and-fetch``: the claim (``FOR UPDATE SKIP LOCKED`` CTE, ``LIMIT batch``), then the
  batched, version-guarded completion (``DELETE ... USING unnest(...)``) of the rows claimed;
* ``fetch``: the candidate select, the optimistic version-guarded claim of those candidates,
  then the completion.

pgbench can only carry one row from a statement to the next (``\\gset``), so each statement's
final ``SELECT`` is wrapped in one more CTE that aggregates the claimed rows into the arrays the
next statement takes; the statements themselves are unchanged. Each client runs
``N / (batch x clients)`` transactions, so the clients drain the N rows exactly; the rate is
rows deleted / pgbench's elapsed time (initial connections excluded). The table is reloaded
(and VACUUM ANALYZE + CHECKPOINT) before every run, as ``throughput.py`` does.

Also measured, as context for the fsync ceiling: a single-row version-checked UPDATE
(``--single-row``), the statement a design with one round trip per execution is bound by.

It prints a table; ``--json FILE`` writes every run. Every pgbench run is bounded by
``--timeout``; the server must be on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common, throughput
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

TABLE = "scheduled_tasks"
DEFAULT_N = 20_000
DEFAULT_BATCH = 50
"""The library's default batch size for one job: ``max(50, 3 x jobs)``."""
STRATEGIES = ("lock-and-fetch", "fetch")


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    candidate = common.PG15_BIN / "pgbench"
    if candidate.exists():
        return str(candidate)
    raise SystemExit("pgbench not found (apt-get install postgresql-client)")


# -- the scripts ------------------------------------------------------------------------------


def _repository_sql() -> dict[str, str]:
    """The statement texts of the PostgreSQL task store (pause-aware variant), verbatim, as
    its ``statements()`` gives them."""
    from ekbatan_fastapi.store.dialects import open_store

    engine = create_async_engine("postgresql+asyncpg://localhost/unused")
    return open_store(engine, "postgresql", TABLE).tasks.statements()


_FINAL_SELECT = re.compile(r"\n(SELECT c\.\*, x\.db_now, .*)\Z", re.S)
_FINAL_UPDATE = re.compile(r"\n(UPDATE \S+ AS t\s.*RETURNING [^\n]*)\s*\Z", re.S)

_AGGREGATE = """
SELECT COALESCE(array_agg(task_name) FILTER (WHERE task_name IS NOT NULL), '{{}}') AS names,
       COALESCE(array_agg(task_instance) FILTER (WHERE task_name IS NOT NULL), '{{}}')
           AS instances,
       COALESCE(array_agg(version{bump}) FILTER (WHERE task_name IS NOT NULL), '{{}}')
           AS versions,
       {history}count(task_name) AS claimed
FROM {source}"""
"""The claimed rows carried to the completion as the arrays it reads; the completion's other
arrays are NULL for no-op successes (see ``build_scripts``), so they are not built here."""

# With the history: the completion's history arrays, as the scheduler sends them for no-op
# executions that succeeded (started and finished now, no error). Its keys and versions are
# the results' (``finish(same_keys=True)``); its outcomes, error classes and messages go as NULL.
_HISTORY_ARRAYS = """COALESCE(array_agg(execution_time) FILTER (WHERE task_name IS NOT NULL),
           '{{}}') AS h_times,
       COALESCE(array_agg(now()) FILTER (WHERE task_name IS NOT NULL), '{{}}') AS h_started,
       COALESCE(array_agg(now()) FILTER (WHERE task_name IS NOT NULL), '{{}}') AS h_finished,
       """


def _one_line(sql: str) -> str:
    """pgbench reads one SQL command per line unless it ends with ';'... keep it simple."""
    return " ".join(line.strip() for line in sql.strip().splitlines() if line.strip()) + ";"


_ARRAYS = re.compile(r":(names|instances|versions|next_times|kinds|h_[a-z]+)\b")


def _rename(sql: str, prefix: str) -> str:
    """Point a statement's array parameters at the variables a ``\\gset <prefix>`` set."""
    return _ARRAYS.sub(lambda m: f":{prefix}{m.group(1)}", sql)


def build_scripts(with_history: bool = False) -> dict[str, str]:
    """pgbench scripts, one per strategy, from the task store's statements."""
    sql = _repository_sql()
    history = _HISTORY_ARRAYS.format(bump="") if with_history else ""
    lf = _FINAL_SELECT.search(sql["lock_and_fetch"])
    if lf is None:
        raise RuntimeError("the lock-and-fetch statement changed shape; update db_limit.py")
    lock_and_fetch = (
        sql["lock_and_fetch"][: lf.start()]
        + f", result AS ({lf.group(1)})"
        + _AGGREGATE.format(bump="", source="result", history=history)
    )
    claim_match = _FINAL_UPDATE.search(sql["claim"])
    if claim_match is None:
        raise RuntimeError("the optimistic claim statement changed shape; update db_limit.py")
    claim = (
        sql["claim"][: claim_match.start()]
        + f", claimed AS ({claim_match.group(1)})"
        + _AGGREGATE.format(bump="", source="claimed", history=history)
    )
    candidates = f"WITH result AS ({sql['fetch_candidates'].strip()})" + _AGGREGATE.format(
        bump="", source="result", history=""
    )
    # With the history, the completion is the repository's statement that also inserts it.
    finish = _rename(sql["finish_history" if with_history else "finish"], "c_")
    # Columns with no value in any row (no-op successes: no next time, no error) or one value
    # in every row (kind 3, delete; outcome succeeded) the scheduler sends as NULL arrays
    # (``unnest`` pads them, the statement fills in the value); so does the script. The
    # history's keys are the results' (``finish(same_keys=True)``).
    for column in ("next_times", "kinds", "h_outcomes", "h_classes", "h_messages"):
        finish = finish.replace(f"CAST(:c_{column} AS", "CAST(NULL AS")
    claim = _rename(claim, "f_")
    tail = [_one_line(finish)]
    return {
        "lock-and-fetch": "\n".join([_one_line(lock_and_fetch), "\\gset c_", *tail]) + "\n",
        "fetch": "\n".join(
            [_one_line(candidates), "\\gset f_", _one_line(claim), "\\gset c_", *tail]
        )
        + "\n",
    }


SINGLE_ROW = (
    "\\set i random(1, {n})\n"
    "UPDATE scheduled_tasks SET last_heartbeat = now(), version = version + 1 "
    "WHERE task_name = 'bench-noop' AND task_instance = 'i' || :i AND version >= 1;\n"
)


# -- running ----------------------------------------------------------------------------------


@dataclasses.dataclass
class LimitRun:
    strategy: str
    clients: int
    n: int
    batch: int
    repeat: int
    transactions: int
    tps: float | None
    seconds: float | None
    rows_deleted: int
    left: int
    history: bool = False
    error: str | None = None

    @property
    def rows_per_second(self) -> float | None:
        if not self.seconds:
            return None
        return self.rows_deleted / self.seconds


@dataclasses.dataclass
class LimitSummary:
    strategy: str
    clients: int
    median: float | None
    low: float | None
    high: float | None
    runs: int
    ok_runs: int
    history: bool = False


def _pgbench_env(server: common.ServerInfo, database: str) -> tuple[list[str], dict[str, str]]:
    conn = server.libpq(database)
    env = dict(os.environ)
    if "password" in conn:
        env["PGPASSWORD"] = conn["password"]
    args = ["-h", conn["host"], "-p", conn["port"], "-U", conn["user"]]
    return args, env


def _parse_tps(output: str) -> float | None:
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
    if match is None:
        match = re.search(r"tps = ([0-9.]+)", output)
    return float(match.group(1)) if match else None


async def _pgbench(
    server: common.ServerInfo,
    database: str,
    script: Path,
    clients: int,
    *,
    transactions: int | None = None,
    duration: int | None = None,
    defines: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> tuple[float | None, str]:
    conn_args, env = _pgbench_env(server, database)
    args = [pgbench_binary(), *conn_args, "-n", "-M", "prepared", "-c", str(clients)]
    args += ["-j", str(clients), "-f", str(script)]
    if transactions is not None:
        args += ["-t", str(transactions)]
    if duration is not None:
        args += ["-T", str(duration)]
    for key, value in (defines or {}).items():
        args += ["-D", f"{key}={value}"]
    args.append(database)
    code, out, err = await common.run_bounded(args, timeout=timeout, env=env)
    output = out + err
    if code != 0:
        raise RuntimeError(f"pgbench failed ({code}):\n{output[-3000:]}")
    return _parse_tps(output), output


async def _load(db_url: str, n: int) -> None:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        await throughput.load_table(engine, n, "sql")
    finally:
        await engine.dispose()


async def _left(db_url: str) -> int:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(f"SELECT count(*) FROM {TABLE}"))).scalar_one())
    finally:
        await engine.dispose()


async def measure(
    server: common.ServerInfo,
    *,
    n: int = DEFAULT_N,
    clients: Sequence[int] = (1, 2),
    strategies: Sequence[str] = STRATEGIES,
    batch: int = DEFAULT_BATCH,
    repeat: int = 3,
    history: bool = False,
    timeout: float = 120.0,
    verbose: bool = True,
) -> list[LimitRun]:
    """Run every (repeat, strategy, clients) in a fresh database on ``server``."""
    scripts = build_scripts(with_history=history)
    runs: list[LimitRun] = []
    with tempfile.TemporaryDirectory(prefix="ekbatan-dblimit-") as work:
        paths = {}
        for strategy in strategies:
            paths[strategy] = Path(work) / f"{strategy}.sql"
            paths[strategy].write_text(scripts[strategy])
        async with common.fresh_database(server.url, "ekbatan_dblimit") as db_url:
            database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
            for rep in range(1, repeat + 1):
                for strategy in strategies:
                    for c in clients:
                        per_client = math.ceil(n / (batch * c))
                        await _load(db_url, n)
                        error = None
                        tps: float | None = None
                        try:
                            tps, _ = await _pgbench(
                                server,
                                database,
                                paths[strategy],
                                c,
                                transactions=per_client,
                                defines={
                                    "names": "{bench-noop}",
                                    "limit": str(batch),
                                    "picked_by": "pgbench",
                                },
                                timeout=timeout,
                            )
                        except (RuntimeError, TimeoutError) as exc:
                            error = str(exc)[-500:] or type(exc).__name__
                        left = await _left(db_url)
                        total = per_client * c
                        seconds = total / tps if tps else None
                        run = LimitRun(
                            strategy=strategy,
                            clients=c,
                            n=n,
                            batch=batch,
                            repeat=rep,
                            transactions=total,
                            tps=tps,
                            seconds=seconds,
                            rows_deleted=n - left,
                            left=left,
                            history=history,
                            error=error,
                        )
                        runs.append(run)
                        if verbose:
                            rate = run.rows_per_second
                            print(
                                f"run {rep} {strategy:<14} c={c}: "
                                f"{f'{rate:,.0f}' if rate else 'n/a'} rows/s "
                                f"(tps {tps or 0:,.0f} x batch {batch}; deleted "
                                f"{run.rows_deleted}, left {left})"
                                + (f" ERROR {error}" if error else ""),
                                flush=True,
                            )
    return runs


async def measure_single_row(
    server: common.ServerInfo,
    *,
    n: int = DEFAULT_N,
    clients: Sequence[int] = (1, 2, 4),
    duration: int = 3,
    verbose: bool = True,
) -> dict[int, float | None]:
    """tps of a single-row version-checked UPDATE (each a commit: the fsync ceiling)."""
    out: dict[int, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="ekbatan-dblimit-") as work:
        script = Path(work) / "single.sql"
        script.write_text(SINGLE_ROW.format(n=n))
        async with common.fresh_database(server.url, "ekbatan_dblimit") as db_url:
            database = db_url.rsplit("/", 1)[1].split("?", 1)[0]
            await _load(db_url, n)
            for c in clients:
                try:
                    tps, _ = await _pgbench(
                        server, database, script, c, duration=duration, timeout=duration + 60
                    )
                except (RuntimeError, TimeoutError) as exc:
                    if verbose:
                        print(f"single-row c={c}: ERROR {exc}", flush=True)
                    tps = None
                out[c] = tps
                if verbose:
                    print(f"single-row UPDATE c={c}: {tps or 0:,.0f} tps", flush=True)
    return out


def summarize(runs: Sequence[LimitRun]) -> list[LimitSummary]:
    groups: dict[tuple[str, int, bool], list[LimitRun]] = {}
    for run in runs:
        groups.setdefault((run.strategy, run.clients, run.history), []).append(run)
    out = []
    for (strategy, clients, history), group in groups.items():
        # fetch with several clients loses optimistic claims to the other clients, so the
        # exact transaction count may not drain the table: the rate is rows deleted / time.
        ok = [r for r in group if r.error is None and r.rows_deleted > 0 and r.rows_per_second]
        rates = [r.rows_per_second for r in ok if r.rows_per_second is not None]
        out.append(
            LimitSummary(
                strategy=strategy,
                clients=clients,
                median=statistics.median(rates) if rates else None,
                low=min(rates) if rates else None,
                high=max(rates) if rates else None,
                runs=len(group),
                ok_runs=len(ok),
                history=history,
            )
        )
    return out


def format_table(
    summaries: Sequence[LimitSummary], single: dict[int, float | None], client: str = "pgbench"
) -> str:
    lines = [
        f"| SQL ({client}, same table, same N) | clients | executions/s (median) | min - max "
        "| runs ok |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        what = f"{s.strategy} claim + complete" + (" + history insert" if s.history else "")
        rate = f"{s.median:,.0f}" if s.median else "n/a"
        span = f"{s.low:,.0f} - {s.high:,.0f}" if s.low and s.high else "n/a"
        lines.append(f"| {what} | {s.clients} | {rate} | {span} | {s.ok_runs}/{s.runs} |")
    for c, tps in single.items():
        lines.append(
            f"| single-row version-checked UPDATE (tps) | {c} | "
            f"{f'{tps:,.0f}' if tps else 'n/a'} | | |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or (2000 if args.quick else DEFAULT_N)
    repeat = args.repeat or (1 if args.quick else 3)
    with common.private_postgres(args.url) as server:
        runs = await measure(
            server,
            n=n,
            clients=args.clients,
            strategies=args.strategy,
            batch=args.batch_size,
            repeat=repeat,
            timeout=args.timeout,
        )
        if args.history:
            runs += await measure(
                server,
                n=n,
                clients=args.clients,
                strategies=args.strategy,
                batch=args.batch_size,
                repeat=repeat,
                history=True,
                timeout=args.timeout,
            )
        single: dict[int, float | None] = {}
        if args.single_row:
            single = await measure_single_row(
                server, n=n, clients=(1, 2, 4), duration=1 if args.quick else 3
            )
        engine = create_async_engine(server.url, poolclass=NullPool)
        try:
            version = await common.server_version(engine)
        finally:
            await engine.dispose()
        info = {"server": server.kind, "server_version": version, "n": n, "batch": args.batch_size}
    return report(runs, single, info, args.json)


def report(
    runs: Sequence[LimitRun],
    single: dict[int, float],
    info: dict[str, Any],
    json_path: Path | None,
    *,
    client: str = "pgbench",
) -> dict[str, Any]:
    """Print the runs' table under ``info``; the result (also written to ``json_path``)."""
    summaries = summarize(runs)
    print()
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print(format_table(summaries, single, client=client))
    result = {
        "info": info,
        "runs": [dataclasses.asdict(r) | {"rows_per_second": r.rows_per_second} for r in runs],
        "summary": [dataclasses.asdict(s) for s in summaries],
        "single_row": {str(k): v for k, v in single.items()},
    }
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    return result


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: a private one)")
    p.add_argument("-n", type=int, default=None, help=f"rows per run ({DEFAULT_N})")
    p.add_argument("-c", "--clients", type=int, nargs="+", default=[1, 2])
    p.add_argument("--strategy", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument("--repeat", type=int, default=None, help="runs per figure (median; 3)")
    p.add_argument("--history", action="store_true", help="also with the history insert")
    p.add_argument("--single-row", action="store_true", help="also the single-row UPDATE")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per pgbench run")
    p.add_argument("--quick", action="store_true", help="N=2000, one repeat")
    p.add_argument("--json", type=Path)
    p.add_argument("--print-scripts", action="store_true", help="print the pgbench scripts")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.print_scripts:
        for name, script in build_scripts(with_history=args.history).items():
            print(f"-- {name}\n{script}")
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        result = asyncio.run(run(args))
        return 0 if all(r["error"] is None for r in result["runs"]) else 1
    return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["LimitRun", "LimitSummary", "build_scripts", "measure", "measure_single_row"]
_ = subprocess  # (pgbench runs through asyncio's subprocess API)
