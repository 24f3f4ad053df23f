"""Keeps the harnesses of issue 6 from rotting: db_limit, slot_lag, failover, idle_cost and
run_all's document each run on a tiny size against the suite's PostgreSQL.

No timing is asserted (benchmarks are never part of the suite's pass/fail); only that each
harness completes and that its bookkeeping adds up. The peers' parts are not run here (they
need ``bench/.venv-peers``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import common, db_limit, failover, idle_cost, lagstats, run_all, slot_lag

pytestmark = pytest.mark.bench_smoke


@pytest.fixture
def server(postgres_server_url: str) -> common.ServerInfo:
    return common.ServerInfo(url=postgres_server_url, kind="test server", stat_statements=False)


def test_db_limit_scripts_use_the_task_store_statements_verbatim() -> None:
    scripts = db_limit.build_scripts(with_history=True)
    assert set(scripts) == {"lock-and-fetch", "fetch"}
    assert scripts["lock-and-fetch"].count("\\gset") == 1
    assert scripts["fetch"].count("\\gset") == 2
    assert "FOR UPDATE SKIP LOCKED" in scripts["lock-and-fetch"]
    assert "INSERT INTO ekbatan_execution_history" in scripts["fetch"]


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench is not installed")
async def test_db_limit_drains_the_table(server: common.ServerInfo) -> None:
    runs = await db_limit.measure(server, n=200, clients=(1, 2), repeat=1, verbose=False)
    assert [(r.strategy, r.clients) for r in runs] == [
        ("lock-and-fetch", 1),
        ("lock-and-fetch", 2),
        ("fetch", 1),
        ("fetch", 2),
    ]
    for run in runs:
        assert run.error is None, run
        assert run.rows_deleted > 0
    lock_and_fetch = [r for r in runs if r.strategy == "lock-and-fetch"]
    assert all(r.rows_deleted + r.left == 200 for r in lock_and_fetch)
    # One client drains the table exactly; two may leave a few rows when one's claim window
    # met the other's locked rows (SKIP LOCKED), as the scheduler's polls would.
    (alone,) = [r for r in lock_and_fetch if r.clients == 1]
    assert alone.left == 0 and alone.rows_deleted == 200
    assert all(s.ok_runs == 1 for s in db_limit.summarize(runs))


def test_lag_analysis_counts_duplicates_and_skipped_slots() -> None:
    records: list[dict[str, Any]] = [
        {"key": "a", "slot": 100.25, "start": 100.26, "pid": 1},
        {"key": "a", "slot": 101.25, "start": 101.27, "pid": 1},
        {"key": "a", "slot": 101.25, "start": 101.30, "pid": 2},  # a duplicate
        {"key": "a", "slot": 103.25, "start": 103.28, "pid": 2},  # 102.25 skipped
        {"key": "b", "slot": 100.0, "start": 100.5, "pid": 1},
    ]
    result = lagstats.analyze(records, 1.0, (100.0, 103.5), keys=["a", "b", "c"])
    assert result.duplicates == 1
    # a: 4 slots, 3 ran; b: 100..103, 1 ran; c never ran: 100..103
    assert result.slots_expected == 4 + 4 + 4
    assert result.skipped == 1 + 3 + 4
    assert result.max_ms == pytest.approx(500.0)


@pytest.mark.parametrize("ahead", [False, True], ids=["defaults", "claim-ahead-gc-freeze"])
async def test_slot_lag_harness_runs_two_processes(server: common.ServerInfo, ahead: bool) -> None:
    options: dict[str, Any] = {"claim_ahead": 0.2, "gc_freeze": True} if ahead else {}
    run = await slot_lag.run_ours(server, processes=2, jobs=2, duration=2.0, warmup=1.0, **options)
    assert not run.errors, run.errors
    assert run.result is not None
    assert run.result.executions > 0
    assert run.result.duplicates == 0
    table = slot_lag.format_table([run])
    assert "ekbatan-fastapi" in table
    assert ("claim_ahead PT0.2S, gc.freeze()" in table) is ahead


async def test_failover_harness_measures_a_restart(server: common.ServerInfo) -> None:
    run = await failover.run_failover(server, trials=1, heartbeat=0.25, limit=4, verbose=False)
    assert len(run.trials) == 1
    trial = run.trials[0]
    assert trial.error is None, trial
    assert trial.failover_s is not None and trial.failover_s > 0
    assert trial.first_pid != trial.second_pid
    assert "1 s x" not in failover.format_table(run)


async def test_idle_cost_harness_counts_polls(server: common.ServerInfo) -> None:
    run = await idle_cost.run_idle(server, jobs=5, duration=1.2, settle=0.2, polling_interval=0.3)
    assert not run.errors, run.errors
    assert run.server_counts is None  # the suite's server has no pg_stat_statements
    assert run.client_counts.get("poll (claim due rows)", 0) >= 1
    assert run.rss_kib is not None and run.rss_kib > 0
    assert "poll (claim due rows)" in idle_cost.format_table(run)
    assert run.startup["ready_s"] > 0 and run.startup["cleanup_deleted"] == idle_cost.UNRESOLVED
    assert run.startup["build_s"] > 0 and run.startup["block_start_s"] >= 0
    assert run.startup["probe_cpu_per_s"] >= 0
    assert "the harness's own event-loop probe" in idle_cost.format_table(run)
    # the pool's 5 at most, and the liveness lock's own connection, held outside the pool
    assert run.connections is not None and 1 <= run.connections <= 6


async def test_idle_cost_harness_runs_on_mysql(mysql_server_url: str) -> None:
    server = common.ServerInfo(url=mysql_server_url, kind="test server")
    run = await idle_cost.run_idle(server, jobs=5, duration=1.2, settle=0.2, polling_interval=0.3)
    assert not run.errors, run.errors
    assert run.client_counts.get("poll (claim due rows)", 0) >= 1
    assert run.startup["cleanup_deleted"] == idle_cost.UNRESOLVED


def test_classify_statement_kinds() -> None:
    assert idle_cost.classify("WITH dead AS (SELECT 1)") == "dead-execution check"
    assert idle_cost.classify("UPDATE t SET last_heartbeat = now() FROM x") == "heartbeat"
    assert idle_cost.classify("something else") == "other"


def test_run_all_keeps_the_rest_of_the_document(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Throughput (another engineer's)\n\nfigures\n")
    first = run_all.merge_markdown(doc, "## Mine\n\nv1")
    assert "## Throughput (another engineer's)" in first and "v1" in first
    doc.write_text(first + "\n## Added later by someone else\n")
    second = run_all.merge_markdown(doc, "## Mine\n\nv2")
    assert "v1" not in second and "v2" in second
    assert "## Added later by someone else" in second
    assert second.count(run_all.BEGIN) == 1


def test_run_all_renders_a_document_from_partial_results(tmp_path: Path) -> None:
    results: dict[str, Any] = {
        "command": "python bench/run_all.py --quick",
        "environment": common.describe_environment(),
        "server": {"kind": "test", "version": "15"},
        "peers_skipped": "not in tests",
        "db_limit": {"error": "skipped"},
        "ours_throughput": {
            "command": "python bench/throughput.py",
            "summary": [
                {"strategy": "lock-and-fetch", "processes": 2, "median": 1000.0, "low": 900.0,
                 "high": 1100.0, "ok_runs": 1, "runs": 1, "duplicates": 0, "cpu_us": 70.0,
                 "foreign": 0.1},
            ],
        },
        "slot_lag": [],
        "failover": {"error": "skipped"},
        "idle": {"error": "skipped"},
    }  # fmt: skip
    text = run_all.render(results, [], tmp_path)
    assert "| no-op executions/s, 2 processes" in text
    assert "1,000" in text
    assert "not run (not in tests)" in text
