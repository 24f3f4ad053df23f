"""Keeps ``bench/throughput.py`` working on MySQL/MariaDB (EKBATAN_TEST_MYSQL_URL)."""

from __future__ import annotations

import pytest

from bench.throughput import BenchOptions, run_benchmark

pytestmark = pytest.mark.bench_smoke


async def test_throughput_harness_runs_on_mysql(mysql_server_url: str) -> None:
    options = BenchOptions(n=200, processes=(2,), repeat=1, timeout=60.0, verbose=False)
    results, info = await run_benchmark(options, mysql_server_url)
    assert [(r.strategy, r.processes) for r in results] == [("fetch", 2), ("lock-and-fetch", 2)]
    for result in results:
        assert result.ok, result.as_dict()
        assert result.executed == result.distinct == result.recorded == 200
    assert info["server_version"] and "innodb_flush_log_at_trx_commit" in info
