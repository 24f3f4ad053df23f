"""Keeps bench/history_growth.py working: a tiny run (no timing is asserted; benchmarks never
gate the suite), on the suite's PostgreSQL and, when one is named, on MySQL/MariaDB."""

from __future__ import annotations

from typing import Any

import pytest

from bench import history_growth

pytestmark = pytest.mark.bench_smoke


async def _tiny(server_url: str) -> dict[str, Any]:
    return await history_growth.measure(
        server_url, rows=3000, expired=0.2, pages=3, drain=150, rounds=1, batch_size=100
    )


def _check(result: dict[str, Any]) -> None:
    retention = result["retention"]
    assert abs(retention["pruned"] - 600) <= 2, retention
    assert retention["batches"] >= 6 and retention["batch_rows_max"] <= 101, retention
    assert retention["range delete"]["n"] == retention["batches"]
    assert result["rounds"][0]["phase"] == "alone"
    assert set(result["lock_waits"]) <= {"alone", "during retention", "after"}
    assert result["rounds"][-1]["phase"] == "after"
    assert all(r["rate"] > 0 for r in result["rounds"])
    cases = {(r["case"], r["statement"]): r["records"] for r in result["pages"]}
    assert cases[("busy name, first page", "now")] == 50
    assert cases[("busy name, first page", "before")] == 50
    assert cases[("every name, first page", "now")] == 50
    text = history_growth.table(result)
    assert "| range delete |" in text and "| alone |" in text


async def test_history_growth_harness_on_postgresql(postgres_server_url: str) -> None:
    _check(await _tiny(postgres_server_url))


async def test_history_growth_harness_on_mysql(request: pytest.FixtureRequest) -> None:
    _check(await _tiny(request.getfixturevalue("mysql_server_url")))
