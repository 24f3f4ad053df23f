"""Every benchmark in one run, on one database server, written to docs/benchmarks/side-by-side.md.

    python bench/run_all.py                     # the full run (60-90 minutes on 2 cores)
    python bench/run_all.py --quick             # a smoke run (small sizes), written to a temp dir
    python bench/run_all.py --short             # issue 32's table only (30-40 minutes)
    python bench/run_all.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test \
        --mysql-url mysql+asyncmy://root@127.0.0.1:3306/test   # + ours' owner death on MariaDB

One private PostgreSQL cluster (``common.private_postgres``: the machine's PostgreSQL 15 binaries,
Unix socket, fsync on, pg_stat_statements) serves every figure, ours and the peers', each in a
fresh database. In order:

1. the database's limit for our SQL (``db_limit.py``: pgbench, same statements, table, N, clients);
2. our throughput (``throughput.py`` as a subprocess: N no-op one-time tasks, K = 1 2 4, both
   strategies, median of 3) and our batch enqueue (``client.schedule_many``);
3. the peers' throughput and enqueue (``peers_run.py``, in ``bench/.venv-peers``), K = 1 2;
4. slot lag, ours and each peer's (``slot_lag.py``): 10 jobs x 1 s, 2 processes, 60 s;
5. failover after SIGKILL (``failover.py``): the library's defaults (liveness lock), 20 trials;
6. idle cost (``idle_cost.py``): 100 recurring jobs, 60 s;
7. a cProfile of one throughput worker (lock-and-fetch, K=1) and of the slot-lag workers;
8. slot lag per minute (``owner_death_peers.py minute``): every system on ``* * * * *``, 10 jobs,
   2 processes, 4 minutes, the systems at the same time;
9. owner death (``owner_death_peers.py death``): SIGKILL the process that started the latest
   execution just before the next slot, 5 trials per system.

``--systems`` chooses the systems (``ekbatan-fastapi`` and any of the peers, comma-separated;
default every one), ``--only`` the sections (comma-separated: db_limit, throughput, lag,
failover, idle, minute, death; default all). A clean summary table ends the output.

It writes ``results.json`` and PNG charts (matplotlib from the peers' environment) next to the
Markdown, and merges its section into ``docs/benchmarks/side-by-side.md`` between two markers:
whatever else the file holds (another harness's section) is kept, re-read right before writing.
Every section is bounded in time; a section that fails is reported as such, the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import pstats
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

try:
    from bench import common, db_limit, failover, idle_cost, owner_death_peers, peers_run, slot_lag
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import db_limit  # type: ignore[no-redef]
    import failover  # type: ignore[no-redef]
    import idle_cost  # type: ignore[no-redef]
    import owner_death_peers  # type: ignore[no-redef]
    import peers_run  # type: ignore[no-redef]
    import slot_lag  # type: ignore[no-redef]

BEGIN = "<!-- bench/run_all.py: begin (generated; edit outside these markers) -->"
END = "<!-- bench/run_all.py: end -->"
DEFAULT_OUT = common.ROOT / "docs" / "benchmarks" / "side-by-side.md"
OURS = "ekbatan-fastapi"
SECTIONS = ("db_limit", "throughput", "lag", "failover", "idle", "minute", "death")
ALL_SYSTEMS = (OURS, *peers_run.SYSTEMS)
MARIADB_ROW = f"{OURS} (MariaDB)"
"""Ours on the MySQL/MariaDB server of ``--mysql-url``: the owner-death section only."""
TARGETS = {
    "throughput_k2": "ahead of pgqueuer in the same run (>= 15,500 on the reference figures)",
    "fetch_k2": ">= 4,000/s",
    "efficiency": ">= 0.5 of the database's limit",
    "lag": "p99 <= 20 ms, max <= 50 ms, 0 duplicates, 0 skipped",
    "failover": "<= 2 s p99 over 20 trials (liveness lock)",
    "idle": "<= 1 poll statement per polling interval",
}


# -- sizes ------------------------------------------------------------------------------------


SHORT_SYSTEMS = (OURS, "dbos", "chancy", "oban")
"""``--short``: the systems of issue 32's table."""
SHORT_SECTIONS = ("throughput", "lag", "minute", "death")
"""``--short``: the sections of issue 32's table (throughput, 1 s and per-minute slot lag,
owner death)."""


def sizes(quick: bool, short: bool = False) -> dict[str, Any]:
    """The workloads: ``quick`` a smoke run; ``short`` the full sizes but one repeat of our
    throughput at 1 and 2 processes (the peers' throughput, the lags and the owner deaths
    unchanged: 20,000 jobs, 60 s, 4 minutes, 5 trials)."""
    if short and not quick:
        return sizes(False) | {"processes": [1, 2], "repeat": 1}
    if quick:
        return {
            "n": 1000,
            "processes": [1, 2],
            "repeat": 1,
            "peer_n": 1000,
            "lag_jobs": 3,
            "lag_duration": 6.0,
            "failover_trials": 2,
            "idle_jobs": 10,
            "idle_duration": 3.0,
            "idle_settle": 1.0,
            "minute_jobs": 2,
            "minutes": 1,
            "death_trials": 1,
        }
    return {
        "n": 20_000,
        "processes": [1, 2, 4],
        "repeat": 3,
        "peer_n": 20_000,
        "lag_jobs": 10,
        "lag_duration": 60.0,
        "failover_trials": 20,
        "idle_jobs": 100,
        "idle_duration": 60.0,
        "idle_settle": 11.0,
        "minute_jobs": owner_death_peers.MINUTE_JOBS,
        "minutes": owner_death_peers.MINUTES,
        "death_trials": owner_death_peers.DEFAULT_TRIALS,
    }


# -- sections ---------------------------------------------------------------------------------


async def _section(
    results: dict[str, Any],
    name: str,
    work: Callable[[], Awaitable[Any]],
) -> None:
    """Run one section; record its result, its time and the machine's load before it."""
    busy = await common.cpu_busy(1.0)
    began = time.monotonic()
    print(
        f"\n=== {name} (machine busy {busy:.0%} before)" if busy is not None else f"\n=== {name}",
        flush=True,
    )
    try:
        results[name] = await work()
    except Exception as exc:  # a failed section is reported; the others still run
        results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"!!! {name} failed: {exc}", flush=True)
    results.setdefault("timings", {})[name] = round(time.monotonic() - began, 1)
    results.setdefault("load_before", {})[name] = busy


async def ours_throughput(
    server: common.ServerInfo, size: dict[str, Any], work: Path, profile: bool
) -> dict[str, Any]:
    out = work / "throughput.json"
    cmd = [sys.executable, str(common.BENCH / "throughput.py"), "--url", server.url]
    cmd += ["-n", str(size["n"]), "-k", *map(str, size["processes"])]
    cmd += ["--repeat", str(size["repeat"]), "--json", str(out), "--timeout", "300"]
    if size["repeat"] > 1:
        cmd += ["--settle", "10", "--max-foreign", "0.5", "--retries", "1"]
    await _subprocess(cmd, timeout=1500)
    data = json.loads(out.read_text())
    result: dict[str, Any] = {
        "command": "python bench/throughput.py " + shlex.join(cmd[2:]).replace(server.url, "URL"),
        "summary": data["summary"],
        "runs": data["runs"],
        "environment": data.get("environment", {}),
    }
    if profile:
        prof_dir = work / "profile"
        cmd = [sys.executable, str(common.BENCH / "throughput.py"), "--url", server.url]
        cmd += ["-n", str(size["n"]), "-k", "1", "--strategy", "lock-and-fetch", "--repeat", "1"]
        cmd += ["--cprofile-dir", str(prof_dir)]
        await _subprocess(cmd, timeout=600)
        files = sorted(prof_dir.glob("*.pstats"))
        if files:
            result["profile"] = profile_summary(files[0])
    return result


async def _subprocess(cmd: Sequence[str], timeout: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=common.ROOT
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            for _ in range(1_000_000):
                raw = await proc.stdout.readline()
                if not raw:
                    break
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                print(f"    {line}", flush=True)
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode not in (0, 1):  # throughput.py exits 1 when a check failed: reported
        raise RuntimeError(f"{cmd[1]} exited {proc.returncode}:\n" + "\n".join(lines[-30:]))
    return "\n".join(lines)


def profile_summary(path: Path, limit: int = 18) -> dict[str, Any]:
    """The functions with the most own time (tottime) and the call tree's heavy hitters."""
    stream = io.StringIO()
    stats = pstats.Stats(str(path), stream=stream)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", filename)
        short = short.replace(str(common.ROOT) + "/", "")
        rows.append(
            {"function": f"{short}:{line}({name})", "calls": nc, "tottime": tt, "cumtime": ct}
        )
    by_tottime = sorted(rows, key=lambda r: -r["tottime"])[:limit]
    wanted = ("ekbatan_fastapi/", "sqlalchemy/", "asyncpg/", "asyncio/")
    by_cum = sorted(
        (r for r in rows if any(w in r["function"] for w in wanted)),
        key=lambda r: -r["cumtime"],
    )[:limit]
    return {"total_seconds": total, "by_tottime": by_tottime, "by_cumtime": by_cum}


async def ours_enqueue(server: common.ServerInfo, n: int) -> dict[str, Any]:
    from ekbatan_fastapi import ExecutionContext, OneTimeJob, create_schema, job_registry

    class Noop(OneTimeJob):
        def name(self) -> str:
            return "bench-noop"

        async def execute(self, ctx: ExecutionContext) -> None:
            return None

    async with common.fresh_database(server.url, "ekbatan_enqueue") as db_url:
        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            await create_schema(engine)
        finally:
            await engine.dispose()
        registry = job_registry().connection_provider(db_url).with_job(Noop()).build()
        try:
            began = time.monotonic()
            created = await registry.client.schedule_many(
                "bench-noop", ((f"i{i}", None, None) for i in range(n))
            )
            seconds = time.monotonic() - began
        finally:
            await registry.connection.dispose()
    return {"n": n, "created": created, "seconds": seconds, "rate": n / seconds}


async def peers_throughput(
    server: common.ServerInfo, size: dict[str, Any], peers: Sequence[str] = peers_run.SYSTEMS
) -> list[Any]:
    out: list[Any] = []
    for system in peers:
        # pgqueuer runs take seconds: the median of several, as for ours; the slow peers once
        repeats = size["repeat"] if system == "pgqueuer" else 1
        for rep, k in ((rep, k) for rep in range(1, repeats + 1) for k in (1, 2)):
            run = await peers_run.peer_throughput(server, system, n=size["peer_n"], processes=k)
            run.repeat = rep
            print(
                f"    {system} K={k}: {peers_run.format_throughput([run]).splitlines()[-1]}",
                flush=True,
            )
            out.append(run.as_dict())
    return out


async def lag_all(
    server: common.ServerInfo,
    size: dict[str, Any],
    peers: Sequence[str],
    work: Path,
    profile: bool,
    ours_too: bool = True,
) -> list[dict[str, Any]]:
    runs = []
    if ours_too:
        ours = await slot_lag.run_ours(
            server, processes=2, jobs=size["lag_jobs"], duration=size["lag_duration"]
        )
        runs.append(ours)
        print(slot_lag.format_table([ours]), flush=True)
    else:
        profile = False
    if peers:
        for system in peers:
            try:
                run = await peers_run.peer_lag(
                    server,
                    system,
                    processes=2,
                    jobs=size["lag_jobs"],
                    duration=size["lag_duration"],
                )
            except Exception as exc:
                run = slot_lag.LagRun(
                    system,
                    2,
                    size["lag_jobs"],
                    1.0,
                    size["lag_duration"],
                    None,
                    [f"{type(exc).__name__}: {exc}"],
                )
            print(slot_lag.format_table([run]).splitlines()[-1], flush=True)
            runs.append(run)
    out = [r.as_dict() for r in runs]
    if profile and out:  # a separate, shorter run: the profiler must not inflate the headline lag
        prof = work / "lag-profile"
        await slot_lag.run_ours(
            server, processes=2, jobs=size["lag_jobs"], duration=20.0, cprofile_dir=prof
        )
        files = sorted(prof.glob("*.pstats"))
        if files:
            summary = profile_summary(files[0])
            busy = summary["total_seconds"]
            idle = sum(r["tottime"] for r in summary["by_tottime"] if "epoll" in r["function"])
            out[0]["profile"] = summary | {"idle_fraction": idle / busy if busy else None}
    return out


# -- the document -----------------------------------------------------------------------------


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value else "n/a"


def _ours_rate(results: dict[str, Any], strategy: str, k: int) -> float | None:
    for s in results.get("ours_throughput", {}).get("summary", []) or []:
        if s["strategy"] == strategy and s["processes"] == k:
            return s.get("median")
    return None


def _peer(results: dict[str, Any], system: str, k: int) -> dict[str, Any] | None:
    """The peer's run with the median rate among its ok runs (or its first run)."""
    peers = results.get("peers_throughput")
    if not isinstance(peers, list):
        return None
    runs = [p for p in peers if p["system"] == system and p["processes"] == k]
    ok = sorted((p for p in runs if p.get("ok") and p.get("rate")), key=lambda p: p["rate"])
    if ok:
        return ok[(len(ok) - 1) // 2]
    return runs[0] if runs else None


def _limit(
    results: dict[str, Any], strategy: str, clients: int, *, history: bool = False
) -> float | None:
    """The database's limit for our statements; ``history``: the completion that also writes
    the history (the SQL our throughput runs send, history being on by default)."""
    for s in results.get("db_limit", {}).get("summary", []) or []:
        if (
            s["strategy"] == strategy
            and s["clients"] == clients
            and bool(s.get("history")) == history
        ):
            return s.get("median")
    return None


def _lag(results: dict[str, Any], system: str) -> dict[str, Any] | None:
    lag = results.get("slot_lag")
    if not isinstance(lag, list):
        return None
    for run in lag:
        if run["system"] == system:
            return run
    return None


def _lag_cell(run: dict[str, Any] | None) -> tuple[str, str]:
    if run is None:
        return "not run", "not run"
    r = run.get("result")
    if not r:
        return "n/a (" + ("; ".join(run.get("errors", []))[:80] or "no result") + ")", "n/a"
    return (
        " / ".join(common.fmt_ms(r[k]) for k in ("p50_ms", "p99_ms", "max_ms")),
        f"{r['duplicates']} / {r['skipped']} of {r['slots_expected']}",
    )


def verdicts(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(figure, what was measured, met?) for every target."""
    out: list[tuple[str, str, bool | None]] = []
    ours2 = _ours_rate(results, "lock-and-fetch", 2)
    pgq = _peer(results, "pgqueuer", 2)
    pgq_rate = pgq["rate"] if pgq and pgq.get("ok") else None
    if ours2 and pgq_rate:
        out.append(
            (
                "no-op executions/s, 2 processes, lock-and-fetch",
                f"{_rate(ours2)} vs pgqueuer {_rate(pgq_rate)} ({ours2 / pgq_rate:.2f}x)",
                ours2 > pgq_rate,
            )
        )
    fetch2 = _ours_rate(results, "fetch", 2)
    if fetch2:
        out.append(("the same, fetch strategy", f"{_rate(fetch2)} (goal >= 4,000)", fetch2 >= 4000))
    limit2 = _limit(results, "lock-and-fetch", 2)
    same2 = _limit(results, "lock-and-fetch", 2, history=True)
    if ours2 and (same2 or limit2):
        eff = ours2 / (same2 or limit2 or 1.0)
        without = f"; vs the SQL without it {ours2 / limit2:.2f}" if same2 and limit2 else ""
        out.append(
            (
                "efficiency vs the database's limit for the same SQL (history insert included "
                "where measured), 2 processes, lock-and-fetch",
                f"{eff:.2f} ({_rate(ours2)} / {_rate(same2 or limit2)}){without}",
                eff >= 0.5,
            )
        )
    run = _lag(results, OURS)
    if run and run.get("result"):
        r = run["result"]
        ok = (
            r["p99_ms"] is not None
            and r["p99_ms"] <= 20
            and (r["max_ms"] or 0) <= 50
            and r["duplicates"] == 0
            and r["skipped"] == 0
        )
        lag, dup = _lag_cell(run)
        out.append(("slot lag p50 / p99 / max ms; duplicates / skipped", f"{lag}; {dup}", ok))
    fo = results.get("failover")
    if isinstance(fo, dict) and fo.get("summary", {}).get("p99_s") is not None:
        s = fo["summary"]
        out.append(
            (
                "failover after SIGKILL, p99",
                f"{s['p99_s']:.3f} s (max {s['max_s']:.3f} s)",
                s["p99_s"] <= s["goal_s"],
            )
        )
    idle = results.get("idle")
    if isinstance(idle, dict) and "polls_per_interval" in idle:
        out.append(
            (
                "idle: poll statements per polling interval",
                f"{idle['polls_per_interval']:.2f}",
                idle["polls_per_interval"] <= 1.0,
            )
        )
    return out


def _render_setup(results: dict[str, Any]) -> list[str]:
    """The section's title, the command and the environment."""
    L: list[str] = []
    w = L.append
    env = results["environment"]
    pv = results.get("peer_versions") or {}
    w("## Side by side: ours, the peers and the database's limit (`bench/run_all.py`)")
    w("")
    w(
        f"Measured {env['date']} on this project's machine: {env['cores']} cores "
        f"({env['machine']}), shared by the database server, the workers and the harness. "
        "Every figure below comes from one run of"
    )
    w("")
    w("```bash")
    w(results["command"])
    w("```")
    w("")
    w(f"- database: {results['server']['kind']} (one fresh database per figure)")
    w(
        f"- ekbatan-fastapi {env['ekbatan_fastapi']}, Python {env['python']}, SQLAlchemy "
        f"{env['sqlalchemy']}, asyncpg {env['asyncpg']}"
    )
    if pv:
        w(
            f"- peers (bench/.venv-peers, `bench/requirements-peers.txt`): pgqueuer "
            f"{pv.get('pgqueuer')}, procrastinate {pv.get('procrastinate')} (psycopg "
            f"{pv.get('psycopg')}), APScheduler {pv.get('apscheduler')} (SQLAlchemy "
            f"{pv.get('sqlalchemy')}, asyncpg {pv.get('asyncpg')}), uvloop {pv.get('uvloop')}, "
            f"oban {pv.get('oban')}, dbos {pv.get('dbos')}, chancy {pv.get('chancy')}; "
            f"Python {pv.get('python')}"
        )
    else:
        w(f"- peers: not run ({results.get('peers_skipped', 'no peers environment')})")
    load = results.get("load_before", {})
    if load:
        shown = ", ".join(f"{k} {v:.0%}" for k, v in load.items() if v is not None)
        w(
            f"- the machine's CPU busy fraction just before each section (other load skews the "
            f"absolute figures; the ratios within a section are the headline): {shown}"
        )
    timings = ", ".join(f"{k} {v}" for k, v in results.get("timings", {}).items())
    w(f"- sections took (s): {timings}")
    w("")
    return L


def _render_headline(results: dict[str, Any], charts: list[str], doc_dir: Path) -> list[str]:
    """The ratios of this run against the targets, and the charts."""
    L: list[str] = []
    w = L.append
    w("### Headline: the ratios measured in this run")
    w("")
    n_peers = len(peers_run.SYSTEMS)
    blank = " |" * n_peers
    w(f"| figure | ekbatan-fastapi | {' | '.join(peers_run.SYSTEMS)} | target |")
    w("| --- |" + " ---: |" * (n_peers + 1) + " --- |")
    for k in (1, 2):
        cells = [_rate(_ours_rate(results, "lock-and-fetch", k))]
        for system in peers_run.SYSTEMS:
            p = _peer(results, system, k)
            cells.append(_rate(p["rate"]) if p and p.get("ok") else "n/a")
        target = TARGETS["throughput_k2"] if k == 2 else ""
        w(
            f"| no-op executions/s, {k} process{'es' if k > 1 else ''} (20,000 queued; ours: "
            f"lock-and-fetch) | {' | '.join(cells)} | {target} |"
        )
    w(
        f"| the same, ours with the fetch (optimistic) strategy, 2 processes | "
        f"{_rate(_ours_rate(results, 'fetch', 2))} |{blank} {TARGETS['fetch_k2']} |"
    )
    enq = results.get("ours_enqueue", {})
    cells = [_rate(enq.get("rate")) if isinstance(enq, dict) else "n/a"]
    for system in peers_run.SYSTEMS:
        p = _peer(results, system, 1)
        cells.append(_rate(p.get("enqueue_rate")) if p else "n/a")
    w(
        f"| enqueue 20,000, batch API (/s; APScheduler: no batch API, 50 `add_job` in flight) | "
        f"{' | '.join(cells)} | |"
    )
    lag_cells = [_lag_cell(_lag(results, s)) for s in (OURS, *peers_run.SYSTEMS)]
    w(
        f"| 1-second schedule, 2 processes: lag p50 / p99 / max (ms) | "
        f"{' | '.join(c[0] for c in lag_cells)} | {TARGETS['lag']} |"
    )
    w(f"| same run: duplicates / skipped slots | {' | '.join(c[1] for c in lag_cells)} | |")
    fo = results.get("failover")
    if isinstance(fo, dict) and "summary" in fo:
        s = fo["summary"]
        w(
            f"| failover after SIGKILL, the defaults (liveness lock): p50 / p99 / max (s) | "
            f"{s['p50_s']:.2f} / {s['p99_s']:.2f} / {s['max_s']:.2f} |{blank} "
            f"{TARGETS['failover']} |"
        )
    idle = results.get("idle")
    if isinstance(idle, dict) and "polls_per_interval" in idle:
        w(
            f"| idle, 100 recurring jobs: statements/s (poll statements per interval) | "
            f"{idle['statements_per_second']:.2f} ({idle['polls_per_interval']:.2f}) |{blank} "
            f"{TARGETS['idle']} |"
        )
    w("")
    checks = verdicts(results)
    if checks:
        w("Targets (shared/BENCHMARK-TARGETS.md) against this run:")
        w("")
        for figure, measured, ok in checks:
            mark = "met" if ok else ("**missed**" if ok is False else "?")
            w(f"- {figure}: {measured}: {mark}")
        w("")
    for chart in charts:
        rel = os.path.relpath(chart, doc_dir)
        w(f"![{Path(chart).stem}]({rel})")
        w("")
    return L


def _render_db_limit(results: dict[str, Any]) -> list[str]:
    """The database's limit for our SQL."""
    L: list[str] = []
    w = L.append
    w("### The database's limit for our SQL (`bench/db_limit.py`)")
    w("")
    dl = results.get("db_limit", {})
    if "summary" in dl:
        w(
            "pgbench runs the claim and complete statements of `PostgresRepository` verbatim "
            f"(the pause-aware variant a scheduler uses) on `scheduled_tasks` with the same "
            f"{dl.get('n', 20000):,} rows, batch {dl.get('batch', 50)}, one client per worker "
            "process; executions/s = rows deleted / pgbench's time. Efficiency = our throughput "
            "(median, same K) / this."
        )
        w("")
        w(
            db_limit.format_table(
                [db_limit.LimitSummary(**s) for s in dl["summary"]],
                {int(k): v for k, v in dl.get("single_row", {}).items()},
            )
        )
        w("")
        w(
            "| strategy | processes = clients | ours (median, history on) | database limit "
            "(+ history insert) | efficiency (same SQL) | limit without history | "
            "efficiency vs it |"
        )
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for strategy in ("lock-and-fetch", "fetch"):
            for k in (1, 2):
                ours, limit = _ours_rate(results, strategy, k), _limit(results, strategy, k)
                same = _limit(results, strategy, k, history=True)
                eff = f"{ours / limit:.2f}" if ours and limit else "n/a"
                eff_same = f"{ours / same:.2f}" if ours and same else "n/a"
                w(
                    f"| {strategy} | {k} | {_rate(ours)} | {_rate(same)} | {eff_same} "
                    f"| {_rate(limit)} | {eff} |"
                )
        w("")
        w(
            "Our throughput runs with the execution history on (the library's default); the "
            "history insert's cost is in the `+ history insert` rows above."
        )
    else:
        w(f"not measured: {dl.get('error', 'skipped')}")
    w("")
    return L


def _render_throughput(results: dict[str, Any]) -> list[str]:
    """Ours and the peers' throughput."""
    L: list[str] = []
    w = L.append
    w("### Throughput (`bench/throughput.py`, `bench/peers_run.py`)")
    w("")
    ot = results.get("ours_throughput", {})
    if "summary" in ot:
        w(f"Ours: `{ot['command']}`")
        w("")
        w(
            "| strategy | processes | executions/s (median) | min - max | runs ok | duplicates "
            "| worker CPU us/exec | foreign load |"
        )
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for s in ot["summary"]:
            w(
                f"| {s['strategy']} | {s['processes']} | {_rate(s['median'])} | "
                f"{_rate(s['low'])} - {_rate(s['high'])} | {s['ok_runs']}/{s['runs']} | "
                f"{s['duplicates']} | {_rate(s.get('cpu_us'))} | "
                f"{s['foreign']:.2f} cores |"
                if s.get("foreign") is not None
                else f"| {s['strategy']} | {s['processes']} | {_rate(s['median'])} | "
                f"{_rate(s['low'])} - {_rate(s['high'])} | {s['ok_runs']}/{s['runs']} | "
                f"{s['duplicates']} | {_rate(s.get('cpu_us'))} | n/a |"
            )
    else:
        w(f"ours: not measured: {ot.get('error', 'skipped')}")
    w("")
    peers = results.get("peers_throughput")
    if isinstance(peers, list) and peers:
        w(
            "Peers (one run each; settings as in shared/BENCHMARK-TARGETS.md; timed from the "
            "workers' run call until nothing is left; every job checked executed once):"
        )
        w("")
        w(
            peers_run.format_throughput(
                [
                    peers_run.PeerThroughput(
                        **{
                            k: v
                            for k, v in p.items()
                            if k in peers_run.PeerThroughput.__dataclass_fields__
                        }
                    )
                    for p in peers
                ]
            )
        )
    else:
        w(f"peers: not measured: {results.get('peers_skipped') or peers}")
    w("")
    return L


def _render_lag(results: dict[str, Any]) -> list[str]:
    """The slot lag, and where ours goes."""
    L: list[str] = []
    w = L.append
    w("### Slot lag (`bench/slot_lag.py`)")
    w("")
    lag = results.get("slot_lag")
    if isinstance(lag, list):
        w(
            "Lag = start of the function - the slot's intended time, over the slots whose time "
            "lies in the measured window (after a 3 s warm-up); every process on this machine, "
            "one clock. Skipped = slots of the 1-second grid no process ran."
        )
        w("")
        w(slot_lag.format_table([_lag_run(r) for r in lag]))
        ours_lag = _lag(results, OURS)
        if ours_lag and ours_lag.get("breakdown"):
            w("")
            w("Where our lag goes (each execution's claiming poll, traced in the workers):")
            w("")
            run = _lag_run(ours_lag)
            run.breakdown = ours_lag["breakdown"]
            w(slot_lag.format_breakdown(run))
        prof = (ours_lag or {}).get("profile")
        if prof and prof.get("idle_fraction") is not None:
            w("")
            w(
                f"A cProfile of one of our slot-lag workers (a separate 20 s run, so that the "
                f"profiler does not inflate the figures above): {prof['total_seconds']:.1f} s "
                f"profiled, {prof['idle_fraction']:.1%} of it waiting in `epoll` (idle)."
            )
    else:
        w(f"not measured: {lag}")
    w("")
    return L


def _render_failover(results: dict[str, Any]) -> list[str]:
    """Failover after SIGKILL."""
    L: list[str] = []
    w = L.append
    fo = results.get("failover")
    w("### Failover after SIGKILL (`bench/failover.py`)")
    w("")
    if isinstance(fo, dict) and "summary" in fo:
        run = failover.FailoverRun(
            [failover.Trial(**t) for t in fo["trials"]],
            fo["heartbeat"],
            fo["limit"],
            fo["summary"]["goal_s"],
            fo["summary"].get("liveness_lock", "auto"),
            fo["summary"].get("database", "postgresql"),
        )
        w(failover.format_table(run))
        w("")
        w(
            "Each trial: a one-time job is scheduled; the instance that starts it is SIGKILLed "
            "a few ms after its claim (the freshest heartbeat the row gets); the figure is the "
            "survivor's start of the same instance minus the kill. The dead window is 4 s; the "
            "survivor's housekeeper checks for dead executions once per heartbeat interval "
            "and again at the moment the freshest picked row would die (the time its last "
            "check returned), so the figure is the dead window plus that check and a claim."
        )
    else:
        w(f"not measured: {fo}")
    w("")
    return L


def _render_idle(results: dict[str, Any]) -> list[str]:
    """The idle cost."""
    L: list[str] = []
    w = L.append
    idle = results.get("idle")
    w("### Idle cost (`bench/idle_cost.py`)")
    w("")
    if isinstance(idle, dict) and "polls_per_interval" in idle:
        run_idle = idle_cost.IdleRun(**{k: idle[k] for k in idle_cost.IdleRun.__dataclass_fields__})
        w(idle_cost.format_table(run_idle))
        w("")
        w(
            "The window starts after the first housekeeping round (its hourly cleanup runs at "
            "the first round, then once an hour). Per heartbeat interval (PT10S) an idle "
            "instance sends one dead-execution check and refreshes its row in "
            "`ekbatan_scheduler_instances`; per polling interval, one poll."
        )
    else:
        w(f"not measured: {idle}")
    w("")
    return L


def _render_side_by_side(results: dict[str, Any]) -> list[str]:
    """Every system side by side (the newer figures)."""
    L: list[str] = []
    w = L.append
    L.extend(render_newer(results))
    if any(k in results for k in ("minute_lag", "owner_death")):
        w("### Every system side by side")
        w("")
        w(summary_table(results))
        w("")
    return L


def _render_profile(results: dict[str, Any]) -> list[str]:
    """A cProfile of one throughput worker."""
    L: list[str] = []
    w = L.append
    prof = (results.get("ours_throughput") or {}).get("profile")
    if prof:
        w("### Where the time goes: cProfile of one throughput worker (lock-and-fetch, K=1)")
        w("")
        w(f"Total profiled time {prof['total_seconds']:.2f} s. Own time (tottime), top entries:")
        w("")
        w("| function | calls | tottime s | cumtime s |")
        w("| --- | ---: | ---: | ---: |")
        for r in prof["by_tottime"]:
            w(f"| `{r['function']}` | {r['calls']} | {r['tottime']:.3f} | {r['cumtime']:.3f} |")
        w("")
        w("Cumulative time in the scheduler, SQLAlchemy, asyncpg and asyncio:")
        w("")
        w("| function | calls | tottime s | cumtime s |")
        w("| --- | ---: | ---: | ---: |")
        for r in prof["by_cumtime"]:
            w(f"| `{r['function']}` | {r['calls']} | {r['tottime']:.3f} | {r['cumtime']:.3f} |")
        w("")
    return L


def render(results: dict[str, Any], charts: list[str], doc_dir: Path) -> str:
    sections = [
        _render_setup(results),
        _render_headline(results, charts, doc_dir),
        _render_db_limit(results),
        _render_throughput(results),
        _render_lag(results),
        _render_failover(results),
        _render_idle(results),
        _render_side_by_side(results),
        _render_profile(results),
    ]
    return "\n".join(line for section in sections for line in section)


def _minute(results: dict[str, Any], system: str) -> dict[str, Any] | None:
    runs = results.get("minute_lag")
    if not isinstance(runs, list):
        return None
    return next((r for r in runs if r["system"] == system), None)


def _death(results: dict[str, Any], system: str) -> dict[str, Any] | None:
    runs = results.get("owner_death_mysql" if system == MARIADB_ROW else "owner_death")
    if not isinstance(runs, list):
        return None
    return next((r for r in runs if r["system"] == system), None)


def summary_table(results: dict[str, Any]) -> str:
    """One row per system measured: the headline figures of this run side by side."""
    systems = [s for s in ALL_SYSTEMS if _measured(results, s)]
    if _death(results, MARIADB_ROW):
        systems.insert(1 if OURS in systems else 0, MARIADB_ROW)
    rows = []
    for system in systems:
        if system == MARIADB_ROW:  # owner death only
            k1 = k2 = "n/a"
        elif system == OURS:
            k1 = _rate(_ours_rate(results, "lock-and-fetch", 1))
            k2 = _rate(_ours_rate(results, "lock-and-fetch", 2))
        else:
            p1, p2 = _peer(results, system, 1), _peer(results, system, 2)
            k1 = _rate(p1["rate"]) if p1 and p1.get("ok") else "n/a"
            k2 = _rate(p2["rate"]) if p2 and p2.get("ok") else "n/a"
        lag = _lag(results, system)
        lag_cell = "n/a"
        if lag and lag.get("result"):
            r = lag["result"]
            lag_cell = f"{common.fmt_ms(r['p50_ms'])} / {common.fmt_ms(r['p99_ms'])}"
        elif lag:
            lag_cell = "n/a (" + "; ".join(lag.get("errors", []))[:40] + ")"
        minute = _minute(results, system)
        minute_cell = "n/a"
        if minute and minute.get("result"):
            r = minute["result"]
            minute_cell = f"{common.fmt_ms(r['p50_ms'])} / {common.fmt_ms(r['p99_ms'])}"
            if r["skipped"] or r["duplicates"]:
                minute_cell += f" ({r['skipped']} skipped, {r['duplicates']} dup.)"
        death = _death(results, system)
        death_cell = lost_cell = "n/a"
        if death and death["trials"]:
            d = death["summary"]
            lates = [t["late_s"] for t in death["trials"] if t.get("late_s") is not None]
            span = f"{min(lates):.2f}-{max(lates):.2f} s" if lates else "never"
            sched = "1 s" if death["period"] <= 1.0 else "1 min"
            death_cell = f"{d['next_slot_ran']}/{d['trials']} ({sched}), late {span}"
            lost_cell = ", ".join(map(str, d["lost"])) + f"; dup. {d['duplicates']}"
        rows.append(f"| {system} | {k1} | {k2} | {lag_cell} | {minute_cell} | {death_cell} "
                    f"| {lost_cell} |")  # fmt: skip
    return "\n".join(
        [
            "| system | no-op jobs/s, 1 process | 2 processes | 1 s slot lag p50 / p99 ms "
            "| per-minute lag p50 / p99 ms | owner death: next slot ran, late by "
            "| owner death: slots lost per trial; duplicates |",
            "| --- | ---: | ---: | --- | --- | --- | --- |",
            *rows,
        ]
    )


def _measured(results: dict[str, Any], system: str) -> bool:
    if system == OURS:
        return any(k in results for k in ("ours_throughput", "slot_lag", "owner_death"))
    return bool(
        _peer(results, system, 1)
        or _lag(results, system)
        or _minute(results, system)
        or _death(results, system)
    )


def render_newer(results: dict[str, Any]) -> list[str]:
    """The per-minute and owner-death sections (issue 32)."""
    L: list[str] = []
    w = L.append
    minute = results.get("minute_lag")
    if minute is not None:
        w("### Slot lag per minute (`bench/owner_death_peers.py minute`)")
        w("")
        if isinstance(minute, list):
            w(
                "Every system on `* * * * *` (ours: `Schedules.cron`), 2 processes, the systems "
                "at the same time, each on its own database; lag = start of the function - the "
                "minute, over the whole minutes measured."
            )
            w("")
            w(
                owner_death_peers.format_minute(
                    [
                        owner_death_peers.MinuteRun(
                            r["system"],
                            r["jobs"],
                            r["minutes"],
                            _LagResultView(**r["result"]) if r.get("result") else None,  # type: ignore[arg-type]
                            r["errors"],
                            r.get("settings", ""),
                        )
                        for r in minute
                    ]
                )
            )
        else:
            w(f"not measured: {minute}")
        w("")
    death = results.get("owner_death")
    mariadb = results.get("owner_death_mysql")
    if isinstance(death, list) and isinstance(mariadb, list):
        death = death + mariadb
    elif death is None:
        death = mariadb
    if death is not None:
        w("### Owner death (`bench/owner_death_peers.py death`)")
        w("")
        if isinstance(death, list):
            w(
                "2 processes, 3 recurring jobs on the finest schedule each system supports; the "
                "process that started the most recent execution is SIGKILLed 0.5 s before the "
                "next slot (2 s before the minute on a minute schedule). Late by = the job's "
                "first start after the kill - its next slot (the largest of the 3 jobs); lost "
                "= slots of the observed window no process ran, over the 3 jobs. Executions "
                "are rows committed by the function itself, so the victim's are kept."
            )
            w("")
            runs = [_death_run(r) for r in death]
            w(owner_death_peers.format_death(runs))
            for run in runs:
                w("")
                w(f"{run.system}:")
                w("")
                w(owner_death_peers.format_death_trials(run))
        else:
            w(f"not measured: {death}")
        w("")
    return L


def _death_run(r: dict[str, Any]) -> owner_death_peers.DeathRun:
    return owner_death_peers.DeathRun(
        r["system"],
        r["period"],
        [owner_death_peers.DeathTrial(**t) for t in r["trials"]],
        r.get("settings", ""),
        r.get("errors", []),
    )


def _lag_run(r: dict[str, Any]) -> slot_lag.LagRun:
    result = r.get("result")
    lr = None
    if result:
        lr = _LagResultView(**result)
    return slot_lag.LagRun(
        r["system"],
        r["processes"],
        r["jobs"],
        r["period"],
        r["duration"],
        lr,
        r["errors"],
        r.get("settings", ""),
    )  # type: ignore[arg-type]


class _LagResultView:
    """Attribute access to a stored LagResult dict (for format_table)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def merge_markdown(path: Path, section: str) -> str:
    """The file's text with ``section`` between the markers: replaced where they are,
    appended otherwise; everything else in the file is kept as it is on disk right now."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    try:
        current = path.read_text()
    except FileNotFoundError:
        current = "# Benchmarks\n"
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + block + tail
    return current.rstrip() + "\n\n" + block + "\n"


def make_charts(results_path: Path, out_dir: Path) -> list[str]:
    python = peers_run.PEERS_PY
    if not python.exists():
        return []
    try:
        done = subprocess.run(
            [str(python), str(common.BENCH / "charts.py"), str(results_path), str(out_dir)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return []
    if done.returncode != 0:
        print(f"charts failed:\n{done.stderr[-2000:]}", flush=True)
        return []
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


# -- main -------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    size = sizes(args.quick, args.short)
    results: dict[str, Any] = {
        "command": "python bench/run_all.py " + " ".join(args.argv),
        "quick": args.quick,
        "sizes": size,
        "environment": common.describe_environment(),
    }
    peers_reason = peers_run.available() if not args.no_peers else "--no-peers"
    if peers_reason:
        results["peers_skipped"] = peers_reason
    else:
        results["peer_versions"] = await peers_run.versions()
    with tempfile.TemporaryDirectory(prefix="ekbatan-runall-") as tmp:
        work = Path(tmp)
        with common.private_postgres(args.url) as server:
            engine = create_async_engine(server.url, poolclass=NullPool)
            try:
                version = await common.server_version(engine)
            finally:
                await engine.dispose()
            results["server"] = {"kind": server.kind, "version": version}
            profile = not (args.quick or args.short)

            async def limit() -> dict[str, Any]:
                runs = await db_limit.measure(
                    server, n=size["n"], clients=(1, 2), repeat=size["repeat"]
                )
                runs += await db_limit.measure(
                    server,
                    n=size["n"],
                    clients=(1, 2),
                    repeat=size["repeat"],
                    history=True,
                )
                single = await db_limit.measure_single_row(
                    server, n=size["n"], clients=(1, 2, 4), duration=1 if args.quick else 3
                )
                return {
                    "n": size["n"],
                    "batch": db_limit.DEFAULT_BATCH,
                    "summary": [s.__dict__ for s in db_limit.summarize(runs)],
                    "runs": [r.__dict__ | {"rows_per_second": r.rows_per_second} for r in runs],
                    "single_row": {str(k): v for k, v in single.items()},
                }

            only, chosen = args.only, args.systems
            ours_in = OURS in chosen
            peers = [] if peers_reason else [x for x in peers_run.SYSTEMS if x in chosen]
            if "db_limit" in only and ours_in:
                await _section(results, "db_limit", limit)
            if "throughput" in only and ours_in:
                await _section(
                    results, "ours_throughput", lambda: ours_throughput(server, size, work, profile)
                )
                await _section(results, "ours_enqueue", lambda: ours_enqueue(server, size["n"]))
            if "throughput" in only and peers:
                await _section(
                    results, "peers_throughput", lambda: peers_throughput(server, size, peers)
                )
            if "lag" in only and (ours_in or peers):
                await _section(
                    results,
                    "slot_lag",
                    lambda: lag_all(server, size, peers, work, profile, ours_too=ours_in),
                )

            async def fail() -> dict[str, Any]:
                run = await failover.run_failover(server, trials=size["failover_trials"])
                print(failover.format_table(run), flush=True)
                return run.as_dict() | {"heartbeat": run.heartbeat, "limit": run.limit}

            if "failover" in only and ours_in:
                await _section(results, "failover", fail)

            async def idle() -> dict[str, Any]:
                run = await idle_cost.run_idle(
                    server,
                    jobs=size["idle_jobs"],
                    duration=size["idle_duration"],
                    settle=size["idle_settle"],
                )
                print(idle_cost.format_table(run), flush=True)
                return run.as_dict()

            if "idle" in only and ours_in:
                await _section(results, "idle", idle)
            known = owner_death_peers.systems()
            harnessed = [known[x] for x in ([OURS] if ours_in else []) + peers]

            async def minute() -> list[dict[str, Any]]:
                runs = await owner_death_peers.run_minute(
                    server, harnessed, jobs=size["minute_jobs"], minutes=size["minutes"]
                )
                print(owner_death_peers.format_minute(runs), flush=True)
                return [r.as_dict() for r in runs]

            if "minute" in only and harnessed:
                await _section(results, "minute_lag", minute)

            async def death() -> list[dict[str, Any]]:
                runs = await owner_death_peers.run_death_all(
                    server, harnessed, trials=size["death_trials"]
                )
                print(owner_death_peers.format_death(runs), flush=True)
                return [r.as_dict() for r in runs]

            if "death" in only and harnessed:
                await _section(results, "owner_death", death)
    return results


async def run_with_mysql(args: argparse.Namespace) -> dict[str, Any]:
    """``run``, then (``--mysql-url``, the death section chosen) ours' owner death on that
    MySQL/MariaDB server: the same harness and trials, its own row."""
    results = await run(args)
    if not args.mysql_url or "death" not in args.only or OURS not in args.systems:
        return results
    trials = sizes(args.quick, args.short)["death_trials"]

    async def death_mysql() -> list[dict[str, Any]]:
        with common.private_postgres(args.mysql_url) as mysql:
            run = await owner_death_peers.run_death(mysql, owner_death_peers.Ours(), trials=trials)
        run.system = MARIADB_ROW
        print(owner_death_peers.format_death([run]), flush=True)
        print(owner_death_peers.format_death_trials(run), flush=True)
        return [run.as_dict()]

    await _section(results, "owner_death_mysql", death_mysql)
    return results


def write_outputs(results: dict[str, Any], md_path: Path, assets: Path) -> None:
    assets.mkdir(parents=True, exist_ok=True)
    results_path = assets / "results.json"
    results_path.write_text(json.dumps(common.jsonable(results), indent=1, default=str))
    charts = make_charts(results_path, assets)
    section = render(results, charts, md_path.parent)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    merged = merge_markdown(md_path, section)  # re-read right before writing
    md_path.write_text(merged)
    print(f"\nwrote {md_path}, {results_path} and {len(charts)} charts", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: a private one)")
    p.add_argument("--quick", action="store_true", help="small sizes; written to a temp dir")
    p.add_argument(
        "--mysql-url",
        help="a MySQL/MariaDB server on this machine: ours is also measured there in the "
        "owner-death section (e.g. mysql+asyncmy://root@127.0.0.1:3306/test)",
    )
    p.add_argument(
        "--short",
        action="store_true",
        help="every row of issue 32's table and nothing else: the sections "
        f"{','.join(SHORT_SECTIONS)} and the systems {','.join(SHORT_SYSTEMS)} (unless --only "
        "or --systems say otherwise), our throughput once at 1 and 2 processes",
    )
    p.add_argument("--no-peers", action="store_true", help="skip the peers")
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, of: {', '.join(ALL_SYSTEMS)} (default: all)",
    )
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated sections, of: {', '.join(SECTIONS)} (default: all)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="the Markdown file (docs/benchmarks/side-by-side.md; --quick: a temporary directory)",
    )
    args = p.parse_args(argv)
    args.argv = argv
    if args.systems is None:
        args.systems = ",".join(SHORT_SYSTEMS if args.short else ALL_SYSTEMS)
    if args.only is None:
        args.only = ",".join(SHORT_SECTIONS if args.short else SECTIONS)
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    for value, allowed, flag in (
        (args.systems, ALL_SYSTEMS, "--systems"),
        (args.only, SECTIONS, "--only"),
    ):
        bad = [v for v in value if v not in allowed]
        if bad:
            p.error(f"{flag}: unknown {bad}; choose from {', '.join(allowed)}")
    if args.out is None:
        if args.quick:
            args.out = Path(tempfile.mkdtemp(prefix="ekbatan-runall-quick-")) / "BENCHMARKS.md"
        else:
            args.out = DEFAULT_OUT
    began = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        results = asyncio.run(run_with_mysql(args))
        results["total_seconds"] = round(time.monotonic() - began, 1)
        # docs/benchmarks/ holds both the page and its charts; elsewhere, a benchmarks/ beside it
        assets = args.out.parent if args.out == DEFAULT_OUT else args.out.parent / "benchmarks"
        write_outputs(results, args.out, assets)
        print("\n" + summary_table(results), flush=True)
        failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
        print(f"total {results['total_seconds']} s; failed sections: {failed or 'none'}")
        return 1 if failed else 0
    return 130


if __name__ == "__main__":
    sys.exit(main())


_ = dt  # (dates come from common.describe_environment)
