"""MariaDB's own limit for our hot-path SQL: ``mysqlslap`` (MariaDB's C load client) runs the
lock-and-fetch claim and the completion of ``ekbatan_fastapi/store/mysql/statements.py`` on
the same ``scheduled_tasks`` table, with the same row count and one client per worker process
of ``throughput.py``, as ``db_limit.py`` does with pgbench on PostgreSQL.

    python bench/db_limit_mysql.py --url mysql+asyncmy://root@127.0.0.1:3306/ekbatan_mylimit
    python bench/db_limit_mysql.py --url ... --quick          # N=2000, one repeat
    python bench/db_limit_mysql.py --url ... --print-script   # what mysqlslap runs

One batch is what one worker sends per batch of 50 (one name, the pause-aware poll), each
statement one round trip, in two transactions as the store runs them:

    SET @keys = NULL, @owned = NULL
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED          -- statements.READ_COMMITTED
    <statements.lock_due_per_name(t, p, 1)>                  -- + three capture columns
    EXECUTE IMMEDIATE CONCAT(<statements.claim(t)>)          -- :keys, :now from the capture
    COMMIT
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED
    EXECUTE IMMEDIATE CONCAT(<statements.delete_owned(t)>)   -- :keys, :owned (version + 1)
    COMMIT

mysqlslap cannot carry rows from one statement to the next, so the locking read also assigns
MariaDB user variables in three extra columns (``LENGTH(@keys := CONCAT_WS(',', @keys,
...))``: each row's key pair, its (key, version + 1) triple, and the clock), which the next
statements splice into our statement texts where asyncmy would have put the literal values
(the driver interpolates client-side, so the server parses a text with literals either way).
The clients connect with ``autocommit = 0`` (``--init-command``), as asyncmy does, so the
transaction starts with its first statement. Each client runs ``N / (batch x clients)``
batches (mysqlslap's ``--number-of-queries`` counts statements over all clients); the rate is
rows deleted / mysqlslap's elapsed time. The table is reloaded (and analyzed) before every
run, as ``throughput.py`` does.

Also measured: a single-row version-checked ``UPDATE`` and its ``COMMIT`` per round
(``--single-row``: the redo-log flush ceiling, as ``db_limit.py --single-row`` for
PostgreSQL), and per run the deltas of InnoDB's global status counters (``SHOW GLOBAL
STATUS``: the server is shared, so other sessions' work counts too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common, db_limit, throughput
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import db_limit  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

from ekbatan_fastapi.store.mysql import statements as q
from ekbatan_fastapi.store.tables import PAUSED

TABLE = db_limit.TABLE
PICKED_BY = "mysqlslap"
COUNTERS = (
    "Com_commit",
    "Innodb_os_log_fsyncs",
    "Innodb_data_fsyncs",
    "Innodb_os_log_written",
    "Innodb_rows_read",
    "Innodb_rows_updated",
    "Innodb_rows_deleted",
    "Handler_read_key",
    "Handler_read_next",
    "Innodb_row_lock_waits",
    "Innodb_deadlocks",
)
"""``SHOW GLOBAL STATUS`` counters reported per batch."""


def mysqlslap_binary() -> str:
    for name in ("mariadb-slap", "mysqlslap"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("mysqlslap not found (apt-get install mariadb-client)")


# -- the script -------------------------------------------------------------------------------


def _one_line(sql: str) -> str:
    return " ".join(line.strip() for line in sql.strip().splitlines() if line.strip())


def _literal(sql: str) -> str:
    return "'" + sql.replace("\\", "\\\\").replace("'", "''") + "'"


_SPLICED = {
    ":now": "QUOTE(@now)",
    ":keys": "'(', COALESCE(@keys, '(NULL, NULL)'), ')'",
    ":owned": "'(', COALESCE(@owned, '(NULL, NULL, NULL)'), ')'",
}
_CAPTURE = (
    ", LENGTH(@now := UTC_TIMESTAMP(6)) AS c_now"
    ", LENGTH(@keys := CONCAT_WS(',', @keys, CONCAT('(', QUOTE(task_name), ', ', "
    "QUOTE(task_instance), ')'))) AS c_keys"
    ", LENGTH(@owned := CONCAT_WS(',', @owned, CONCAT('(', QUOTE(task_name), ', ', "
    "QUOTE(task_instance), ', ', version + 1, ')'))) AS c_owned"
)
"""(Not ``(@x := ...) IS NULL``: MariaDB folds ``IS NULL`` of a NOT NULL expression to false
and never assigns.)"""


def _execute_immediate(statement: str) -> str:
    """``EXECUTE IMMEDIATE CONCAT(...)`` of ``statement`` with its ``:now``, ``:keys`` and
    ``:owned`` taken from the user variables and ``:picked_by`` as a literal."""
    sql = _one_line(statement).replace(":picked_by", f"'{PICKED_BY}'")
    parts = re.split(r"(:now|:keys|:owned)\b", sql)
    pieces = [_SPLICED[p] if p in _SPLICED else _literal(p) for p in parts if p]
    if re.search(r":[a-z_]+\b", "".join(p for p in parts if p not in _SPLICED)):
        raise RuntimeError(f"a parameter left unbound in {sql!r}; update db_limit_mysql.py")
    return f"EXECUTE IMMEDIATE CONCAT({', '.join(pieces)})"


def build_script(batch: int = db_limit.DEFAULT_BATCH) -> list[str]:
    """mysqlslap's statements for one batch, from the statements module."""
    t, p = TABLE, PAUSED
    lock = _one_line(q.lock_due_per_name(t, p, 1))
    lock = lock.replace(":name_0", f"'{throughput.TASK_NAME}'").replace(":limit", str(batch))
    if lock.count(" AS db_now FROM ") != 1 or re.search(r":[a-z_]+\b", lock):
        raise RuntimeError("the lock-and-fetch statement changed shape; update db_limit_mysql.py")
    lock = lock.replace(" AS db_now FROM ", f" AS db_now{_CAPTURE} FROM ", 1)
    return [
        "SET @keys = NULL, @owned = NULL",
        q.READ_COMMITTED,
        lock,
        _execute_immediate(q.claim(t)),
        "COMMIT",
        q.READ_COMMITTED,
        _execute_immediate(q.delete_owned(t)),
        "COMMIT",
    ]


def single_row_script(n: int, rounds: int) -> list[str]:
    """``rounds`` single-row version-checked UPDATEs, each committed (the flush ceiling)."""
    out = []
    for i in range(rounds):
        instance = f"i{(i * 7919) % n + 1}"
        out += [
            f"UPDATE {TABLE} SET last_heartbeat = {q.NOW}, version = version + 1 "
            f"WHERE task_name = '{throughput.TASK_NAME}' AND task_instance = '{instance}' "
            "AND version >= 1",
            "COMMIT",
        ]
    return out


# -- running ----------------------------------------------------------------------------------


def _client_args(db_url: str) -> tuple[list[str], dict[str, str]]:
    url = make_url(db_url)
    env = dict(os.environ)
    if url.password:
        env["MYSQL_PWD"] = str(url.password)
    args = ["-h", url.host or "127.0.0.1", "-P", str(url.port or 3306), "-u", url.username or ""]
    return [*args, "--protocol=tcp", f"--create-schema={url.database}"], env


_ELAPSED = re.compile(r"Average number of seconds to run all queries: ([0-9.]+) seconds")


async def mysqlslap(
    db_url: str, statements: Sequence[str], clients: int, queries: int, *, timeout: float
) -> float:
    """Run ``statements`` over and over on ``clients`` connections until they sent ``queries``
    statements in all; mysqlslap's elapsed seconds."""
    conn_args, env = _client_args(db_url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="ekbatan-slap-") as script:
        script.write(";\n".join(statements) + "\n")
        script.flush()
        args = [mysqlslap_binary(), *conn_args, "--no-drop", "--init-command=SET autocommit = 0"]
        args += [f"--query={script.name}", "--delimiter=;", f"--concurrency={clients}"]
        args += ["--iterations=1", f"--number-of-queries={queries}"]
        code, out, err = await common.run_bounded(args, timeout=timeout, env=env)
    output = out + err
    match = _ELAPSED.search(output)
    if code != 0 or match is None:
        raise RuntimeError(f"mysqlslap failed ({code}):\n{output[-3000:]}")
    return float(match.group(1))


async def _status(db_url: str) -> dict[str, int]:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            names = ", ".join(f"'{c}'" for c in COUNTERS)
            rows = await conn.execute(text(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})"))
            return {str(r[0]): int(r[1]) for r in rows}
    finally:
        await engine.dispose()


@dataclasses.dataclass
class SlapRun(db_limit.LimitRun):
    per_batch: dict[str, float] = dataclasses.field(default_factory=dict)
    """Global status deltas over the run, per batch (transaction pair)."""


async def measure(
    server_url: str,
    *,
    n: int = db_limit.DEFAULT_N,
    clients: Sequence[int] = (1, 2),
    batch: int = db_limit.DEFAULT_BATCH,
    repeat: int = 3,
    timeout: float = 120.0,
    verbose: bool = True,
) -> list[SlapRun]:
    """Every (repeat, clients) in a fresh database on ``server_url``."""
    statements = build_script(batch)
    runs: list[SlapRun] = []
    async with common.fresh_database(server_url, "ekbatan_mylimit") as db_url:
        for rep in range(1, repeat + 1):
            for c in clients:
                per_client = math.ceil(n / (batch * c))
                await db_limit._load(db_url, n)
                before = await _status(db_url)
                error, seconds = None, None
                try:
                    seconds = await mysqlslap(
                        db_url, statements, c, len(statements) * per_client * c, timeout=timeout
                    )
                except (RuntimeError, TimeoutError) as exc:
                    error = str(exc)[-500:] or type(exc).__name__
                after = await _status(db_url)
                left = await db_limit._left(db_url)
                total = per_client * c
                delta = {k: (after.get(k, 0) - before.get(k, 0)) / total for k in COUNTERS}
                run = SlapRun(
                    strategy="lock-and-fetch",
                    clients=c,
                    n=n,
                    batch=batch,
                    repeat=rep,
                    transactions=total,
                    tps=total / seconds if seconds else None,
                    seconds=seconds,
                    rows_deleted=n - left,
                    left=left,
                    error=error,
                    per_batch=delta,
                )
                runs.append(run)
                if verbose:
                    rate = run.rows_per_second
                    print(
                        f"run {rep} lock-and-fetch c={c}: {f'{rate:,.0f}' if rate else 'n/a'} "
                        f"rows/s ({seconds or 0:.3f} s; deleted {run.rows_deleted}, left {left}); "
                        "per batch: "
                        + ", ".join(f"{k} {v:,.1f}" for k, v in delta.items() if v)
                        + (f" ERROR {error}" if error else ""),
                        flush=True,
                    )
    return runs


async def measure_single_row(
    server_url: str,
    *,
    n: int = db_limit.DEFAULT_N,
    clients: Sequence[int] = (1, 2, 4),
    rounds: int = 500,
    verbose: bool = True,
) -> dict[int, float | None]:
    """Commits/s of a single-row version-checked UPDATE, ``rounds`` per client."""
    out: dict[int, float | None] = {}
    statements = single_row_script(n, rounds)
    async with common.fresh_database(server_url, "ekbatan_mylimit") as db_url:
        await db_limit._load(db_url, n)
        for c in clients:
            try:
                seconds = await mysqlslap(db_url, statements, c, len(statements) * c, timeout=120)
                out[c] = rounds * c / seconds if seconds else None
            except (RuntimeError, TimeoutError) as exc:
                if verbose:
                    print(f"single-row c={c}: ERROR {exc}", flush=True)
                out[c] = None
            if verbose:
                print(f"single-row UPDATE + COMMIT c={c}: {out[c] or 0:,.0f} tps", flush=True)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or (2000 if args.quick else db_limit.DEFAULT_N)
    repeat = args.repeat or (1 if args.quick else 3)
    common.check_local(args.url)
    runs = await measure(
        args.url,
        n=n,
        clients=args.clients,
        batch=args.batch_size,
        repeat=repeat,
        timeout=args.timeout,
    )
    single: dict[int, float | None] = {}
    if args.single_row:
        single = await measure_single_row(args.url, n=n, rounds=100 if args.quick else 500)
    engine = create_async_engine(args.url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            version, flush = (
                await conn.execute(text("SELECT VERSION(), @@innodb_flush_log_at_trx_commit"))
            ).one()
    finally:
        await engine.dispose()
    info = {"server_version": version, "innodb_flush_log_at_trx_commit": flush, "n": n}
    info["batch"] = args.batch_size
    return db_limit.report(runs, single, info, args.json, client="mysqlslap")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="a MariaDB/MySQL server on this machine")
    p.add_argument("-n", type=int, default=None, help=f"rows per run ({db_limit.DEFAULT_N})")
    p.add_argument("-c", "--clients", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch-size", type=int, default=db_limit.DEFAULT_BATCH)
    p.add_argument("--repeat", type=int, default=None, help="runs per figure (median; 3)")
    p.add_argument("--single-row", action="store_true", help="also the single-row UPDATE")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per mysqlslap run")
    p.add_argument("--quick", action="store_true", help="N=2000, one repeat")
    p.add_argument("--json", type=Path)
    p.add_argument("--print-script", action="store_true", help="print mysqlslap's statements")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.print_script:
        print(";\n".join(build_script(args.batch_size)) + ";")
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        result = asyncio.run(run(args))
        return 0 if all(r["error"] is None for r in result["runs"]) else 1
    return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["SlapRun", "build_script", "measure", "measure_single_row", "mysqlslap"]
