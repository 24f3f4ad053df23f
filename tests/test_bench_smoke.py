"""Keeps ``bench/throughput.py`` from rotting: a tiny run must complete with matching counts.

No timing is asserted; the benchmark's figures are not part of the suite's pass/fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian: valgrind)")
async def test_throughput_harness_counts_instructions_under_callgrind(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """``--callgrind-dir``: the worker runs under valgrind, instrumented from "go" to "stop"
    only (its start-up, some 10^8 instructions, is left out of the count per execution)."""
    options = BenchOptions(
        n=100,
        processes=(1,),
        strategies=("lock-and-fetch",),
        repeat=1,
        timeout=120.0,
        verbose=False,
        warm=True,
        callgrind_dir=tmp_path,
    )
    results, _ = await run_benchmark(options, postgres_server_url)

    (result,) = results
    assert result.ok, result.as_dict()
    assert result.instructions_per_execution is not None
    assert 10_000 < result.instructions_per_execution < 5_000_000
