"""Keeps bench/names_table_probe.py working: a tiny run against the suite's MariaDB (no timing
is asserted; benchmarks never gate the suite)."""

from __future__ import annotations

from bench import names_table_probe


async def test_names_table_probe_times_both_forms_on_mariadb(mysql_server_url: str) -> None:
    results = await names_table_probe.measure(mysql_server_url, (50, 120), repeat=1)
    assert [r["names"] for r in results] == [50, 120]
    for r in results:
        assert r["in_text_ms"] > 0 and r["table_lock_ms"] > 0 and r["table_clock_ms"] > 0
        assert r["table_ms"] == r["table_lock_ms"] + r["table_clock_ms"] and r["fill_s"] > 0
    assert "| 120 |" in names_table_probe.table(results)
