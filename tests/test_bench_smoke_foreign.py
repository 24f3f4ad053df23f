"""Keeps bench/foreign_rows.py working: a tiny run against the suite's PostgreSQL (no timing is
asserted; benchmarks never gate the suite)."""

from __future__ import annotations

import pytest

from bench import foreign_rows

pytestmark = pytest.mark.bench_smoke


async def test_foreign_rows_harness_measures_every_statement(postgres_server_url: str) -> None:
    results = await foreign_rows.measure(postgres_server_url, (0, 100), repeat=1)
    assert [(r["foreign"], r["statement"], r["plan"]) for r in results][:4] == [
        (0, "now", "custom"),
        (0, "now", "generic"),
        (0, "before", "custom"),
        (0, "before", "generic"),
    ]
    assert len(results) == 8
    assert all(r[k] > 0 for r in results for k in ("claim", "fetch", "idle"))
    assert "| 100 | now | custom |" in foreign_rows.table(results)


async def test_foreign_rows_harness_runs_on_mysql(mysql_server_url: str) -> None:
    results = await foreign_rows.measure_mysql(mysql_server_url, (0, 100), repeat=1)
    assert [(r["foreign"], r["statement"]) for r in results] == [
        (0, "now"),
        (0, "before"),
        (100, "now"),
        (100, "before"),
    ]
    assert all(r[k] > 0 and r[f"{k}_rows"] > 0 for r in results for k in ("claim", "fetch", "idle"))
    assert "| 100 | now |" in foreign_rows.table(results)
