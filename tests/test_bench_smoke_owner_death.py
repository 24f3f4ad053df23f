"""Keeps the owner-death and per-minute harness (``bench/owner_death_peers.py``) working.

Our own adapter runs one short owner death against the suite's PostgreSQL in every run of the
suite; the peers' adapters run only where their environment (``bench/.venv-peers``) exists.
No timing is asserted (benchmarks are never part of the suite's pass/fail): only that the
harness completes and that its bookkeeping (next slot, lateness, lost slots, duplicates) adds
up, on records made up here and on the real ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import common, owner_death_peers, peers_run, run_all

pytestmark = [pytest.mark.bench_smoke, pytest.mark.slow]

peers_missing = peers_run.available()


@pytest.fixture
def server(postgres_server_url: str) -> common.ServerInfo:
    return common.ServerInfo(url=postgres_server_url, kind="test server", stat_statements=False)


def _row(key: str, slot: float | None, start: float, pid: int, **extra: Any) -> dict[str, Any]:
    return {"key": key, "slot": slot, "start": start, "pid": pid, "enqueued": None} | extra


def test_a_trial_counts_the_next_slot_lateness_lost_slots_and_duplicates() -> None:
    ours = owner_death_peers.Ours()
    # one job, 1-second slots at whole seconds; pid 1 dies at 104.5 (next slot 105)
    rows = [_row("lag0", float(s), s + 0.01, 1) for s in range(100, 105)]
    rows += [_row("lag0", 104.0, 104.6, 2)]  # the victim's last slot again: a duplicate
    rows += [_row("lag0", float(s), s + 0.02, 2) for s in (108, 109, 110)]  # 105-107 lost
    trial = owner_death_peers.analyze_trial(
        ours, rows, ["lag0"], index=0, victim=1, kill_at=104.5, window_end=110.0, survivors={2}
    )
    assert trial.next_ran == 0 and trial.by == ["none"]
    assert trial.lost == 3
    assert trial.duplicates == 1
    assert trial.late_s == pytest.approx(3.02)  # its first slot >= 105 started at 108.02

    rows = [_row("lag0", float(s), s + 0.01, 1) for s in range(100, 105)]
    rows += [_row("lag0", float(s), s + 0.3, 2) for s in range(105, 111)]
    trial = owner_death_peers.analyze_trial(
        ours, rows, ["lag0"], index=0, victim=1, kill_at=104.5, window_end=110.0, survivors={2}
    )
    assert (trial.next_ran, trial.by, trial.lost, trial.duplicates) == (1, ["survivor"], 0, 0)
    assert trial.late_s == pytest.approx(0.3)


def test_chancy_slots_follow_its_cron_plugin() -> None:
    """A push serves the first whole second after the previous push; after a gap of more
    than 1.5 periods, the second at or before the push."""
    pushes = [10.2, 11.25, 12.31, 15.6]
    records = [{"key": "a", "enqueued": t, "start": t + 0.01, "slot": None} for t in pushes]
    slots = [r["slot"] for r in peers_run.chancy_slots(records, 1.0)]
    assert slots == [None, 11.0, 12.0, 15.0]


async def test_our_adapter_survives_an_owner_death(server: common.ServerInfo) -> None:
    run = await owner_death_peers.run_death(
        server, owner_death_peers.Ours(), trials=1, observe=3.0, pause=(0.1, 0.2), verbose=False
    )
    assert not run.errors, run.errors
    (trial,) = run.trials
    assert trial.error is None, trial
    assert trial.victim_pid is not None and trial.kill_at is not None
    assert trial.jobs == owner_death_peers.DEATH_JOBS
    # who ran each next slot is named (a kill delayed past the slot on a loaded machine may
    # leave it to the victim: no timing is asserted here)
    assert len(trial.by) == trial.jobs
    assert set(trial.by) <= {"survivor", "victim", "none"}
    table = owner_death_peers.format_death([run])
    assert "ekbatan-fastapi" in table and "1 s" in table
    assert "| 1 |" in owner_death_peers.format_death_trials(run)


async def test_our_adapter_survives_an_owner_death_on_mysql(mysql_server_url: str) -> None:
    """The ledger row commits with the slot's completion (``ctx.transaction()``) on
    MySQL/MariaDB too, and the victim's unfinished rows at the kill are counted."""
    server = common.ServerInfo(url=mysql_server_url, kind="test server")
    run = await owner_death_peers.run_death(
        server, owner_death_peers.Ours(), trials=1, observe=3.0, pause=(0.1, 0.2), verbose=False
    )
    assert not run.errors, run.errors
    (trial,) = run.trials
    assert trial.error is None, trial
    assert trial.victim_held is not None and trial.victim_held >= 0
    assert set(trial.by) <= {"survivor", "victim", "none"}


def test_a_victim_that_held_rows_is_named_in_the_trial_table() -> None:
    trial = owner_death_peers.DeathTrial(0, 11, 100.0, next_ran=2, jobs=3, late_s=2.1, lost=2)
    trial.by = ["survivor", "survivor", "none"]
    trial.victim_held = 1
    run = owner_death_peers.DeathRun(owner_death_peers.OURS, 1.0, [trial])
    assert "| 1 | 11 (held 1 unfinished at the kill) | 2/3 |" in (
        owner_death_peers.format_death_trials(run)
    )
    assert "victim held 1 row(s) at the kill" in owner_death_peers._trial_line(trial)


def test_our_worker_command_carries_the_execution_length() -> None:
    server = common.ServerInfo(url="postgresql+asyncpg://x@127.0.0.1/db", kind="test")
    args = {"index": 0, "jobs": 3, "schedule": "second", "deadline": 1.0, "work": Path("/tmp")}
    plain = owner_death_peers.Ours().command(server, server.url, "db", **args)  # type: ignore[arg-type]
    held = owner_death_peers.Ours(hold=0.7).command(server, server.url, "db", **args)  # type: ignore[arg-type]
    assert "--hold" not in plain
    assert held[held.index("--hold") + 1] == "0.7"


async def test_our_adapter_runs_the_per_minute_table(server: common.ServerInfo) -> None:
    """Zero whole minutes measured: only the wiring (two processes on '* * * * *', rows read
    back, the table) is exercised, in seconds."""
    (run,) = await owner_death_peers.run_minute(
        server, [owner_death_peers.Ours()], jobs=2, minutes=0, tail=0.0
    )
    assert not run.errors, run.errors
    assert run.result is not None and run.result.duplicates == 0
    assert "ekbatan-fastapi" in owner_death_peers.format_minute([run])


def test_run_all_renders_the_new_sections_and_the_summary() -> None:
    trial = owner_death_peers.DeathTrial(0, 11, 100.0, next_ran=3, jobs=3, late_s=0.4, lost=0)
    trial.by = ["survivor"] * 3
    death = owner_death_peers.DeathRun("dbos", 1.0, [trial], "settings").as_dict()
    results: dict[str, Any] = {
        "owner_death": [death],
        "minute_lag": [
            {"system": "oban", "jobs": 10, "minutes": 4, "errors": ["boom"], "result": None}
        ],
    }
    text = "\n".join(run_all.render_newer(results))
    assert "Owner death" in text and "| dbos | 1 s | 1/1 |" in text
    assert "n/a (boom)" in text
    summary = run_all.summary_table(results)
    assert "| dbos |" in summary and "1/1 (1 s), late 0.40-0.40 s" in summary


def test_run_all_renders_ours_on_mariadb_beside_postgresql() -> None:
    """``--mysql-url``: ours is measured there too, in the owner-death section and its own
    row of the summary."""
    trial = owner_death_peers.DeathTrial(0, 11, 100.0, next_ran=3, jobs=3, late_s=0.1, lost=0)
    trial.by = ["survivor"] * 3
    pg = owner_death_peers.DeathRun(run_all.OURS, 1.0, [trial]).as_dict()
    maria = owner_death_peers.DeathRun(run_all.MARIADB_ROW, 1.0, [trial]).as_dict()
    results: dict[str, Any] = {"owner_death": [pg], "owner_death_mysql": [maria]}
    text = "\n".join(run_all.render_newer(results))
    assert f"| {run_all.MARIADB_ROW} | 1 s | 1/1 |" in text and f"| {run_all.OURS} | 1 s |" in text
    summary = run_all.summary_table(results).splitlines()
    assert summary[2].startswith(f"| {run_all.OURS} |")
    assert summary[3].startswith(f"| {run_all.MARIADB_ROW} | n/a | n/a |")


@pytest.mark.skipif(peers_missing is not None, reason=f"peers' environment: {peers_missing}")
@pytest.mark.parametrize("system", peers_run.NEWER)
async def test_newer_peer_drains_a_small_queue(server: common.ServerInfo, system: str) -> None:
    run = await peers_run.peer_throughput(server, system, n=200, processes=2, timeout=120)
    assert run.ok, run.as_dict()


@pytest.mark.skipif(peers_missing is not None, reason=f"peers' environment: {peers_missing}")
@pytest.mark.parametrize("system", ["dbos", "chancy"])
async def test_peer_adapter_survives_an_owner_death(server: common.ServerInfo, system: str) -> None:
    peer = owner_death_peers.systems()[system]
    run = await owner_death_peers.run_death(
        server, peer, trials=1, observe=3.0, pause=(0.1, 0.2), verbose=False
    )
    assert not run.errors, run.errors
    assert run.trials and run.trials[0].error is None, run.trials


def test_run_all_short_keeps_the_issue_tables_workloads() -> None:
    """``--short``: one repeat of our throughput at 1 and 2 processes; the peers' 20,000 jobs,
    the lags, the per-minute minutes and the owner-death trials as in the full run."""
    full, short = run_all.sizes(False), run_all.sizes(False, short=True)
    assert short["processes"] == [1, 2] and short["repeat"] == 1
    keep = ("peer_n", "lag_jobs", "lag_duration", "minute_jobs", "minutes", "death_trials")
    assert all(short[k] == full[k] for k in keep)
    assert run_all.sizes(True, short=True) == run_all.sizes(True)
    assert set(run_all.SHORT_SECTIONS) <= set(run_all.SECTIONS)
    assert set(run_all.SHORT_SYSTEMS) <= set(run_all.ALL_SYSTEMS)
