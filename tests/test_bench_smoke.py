"""Keeps ``bench/throughput.py`` from rotting: a tiny run must complete with matching counts.

No timing is asserted; the benchmark's figures are not part of the suite's pass/fail.
"""

from __future__ import annotations

import pytest

from bench.throughput import BenchOptions, run_benchmark, summarize

pytestmark = pytest.mark.bench_smoke


async def test_throughput_harness_completes_with_matching_counts(
    postgres_server_url: str,
) -> None:
    options = BenchOptions(n=200, processes=(1, 2), repeat=1, timeout=60.0, verbose=False)
    results, info = await run_benchmark(options, postgres_server_url)

    assert [(r.strategy, r.processes) for r in results] == [
        ("fetch", 1),
        ("fetch", 2),
        ("lock-and-fetch", 1),
        ("lock-and-fetch", 2),
    ]
    for result in results:
        assert result.ok, result.as_dict()
        assert result.executed == result.distinct == result.recorded == 200
        assert sum(result.per_worker) == 200
        assert len(result.per_worker) == result.processes
        assert result.rate is not None
    assert all(s.ok_runs == 1 and s.median is not None for s in summarize(results))
    assert info["server_version"]


async def test_throughput_harness_warm_mode_gives_started_workers_the_rows(
    postgres_server_url: str,
) -> None:
    """``--warm``: the schedulers start first, the rows are inserted after (a running fleet);
    with ``--unknown-rows`` beside them, which no worker claims or counts."""
    options = BenchOptions(
        n=200,
        processes=(2,),
        strategies=("lock-and-fetch",),
        repeat=1,
        timeout=60.0,
        verbose=False,
        warm=True,
        unknown_rows=500,
    )
    results, _ = await run_benchmark(options, postgres_server_url)

    (result,) = results
    assert result.ok, result.as_dict()
    assert result.executed == result.distinct == result.recorded == 200
    assert len(result.per_worker) == 2
