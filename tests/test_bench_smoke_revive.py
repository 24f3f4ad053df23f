"""Keeps bench/revive_names.py working: a tiny run against the suite's PostgreSQL and
MariaDB (no timing is asserted; benchmarks never gate the suite)."""

from __future__ import annotations

import pytest

from bench import revive_names

pytestmark = pytest.mark.bench_smoke


async def test_revive_names_harness_times_the_check(postgres_server_url: str) -> None:
    results = await revive_names.measure(postgres_server_url, 600, (0, 5), repeat=1)
    assert [(r["names"], r["picked"]) for r in results] == [(600, 0), (600, 5)]
    assert all(r["cpu_ms"] >= 0 and r["wall_ms"] > 0 for r in results)
    assert "| 600 | 5 |" in revive_names.table(results)


async def test_revive_names_harness_runs_on_mariadb(mysql_server_url: str) -> None:
    results = await revive_names.measure(mysql_server_url, 600, (0, 5), repeat=1)
    assert [(r["names"], r["picked"]) for r in results] == [(600, 0), (600, 5)]
