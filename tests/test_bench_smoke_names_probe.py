"""Keeps bench/names_table_probe.py working: a tiny run against the suite's MariaDB (no timing
is asserted; benchmarks never gate the suite)."""

from __future__ import annotations

import pytest

from bench import names_table_probe

pytestmark = pytest.mark.bench_smoke


async def test_names_table_probe_times_both_forms_on_mariadb(mysql_server_url: str) -> None:
    results = await names_table_probe.measure(mysql_server_url, (50, 600), repeat=1)
    assert [r["names"] for r in results] == [50, 600]
    for r in results:
        for key in ("text_poll_ms", "table_poll_ms", "text_dead_ms", "table_dead_ms"):
            assert r[key] > 0, (key, r)
        assert r["first_poll_ms"] > 0
    assert "| 600 |" in names_table_probe.table(results)
