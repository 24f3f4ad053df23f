"""``bench/throughput.py --no-history``: the history on/off comparison measures what it says."""

from __future__ import annotations

import pytest

from bench.throughput import BenchOptions, run_benchmark

pytestmark = pytest.mark.bench_smoke


async def test_history_rows_follow_the_history_switch(postgres_server_url: str) -> None:
    for history, expected in ((True, 100), (False, 0)):
        options = BenchOptions(
            n=100,
            processes=(2,),
            strategies=("lock-and-fetch",),
            repeat=1,
            timeout=60.0,
            verbose=False,
            history=history,
        )
        (result,), info = await run_benchmark(options, postgres_server_url)
        assert result.ok, result.as_dict()
        assert result.history_rows == expected
        assert info["history"] == ("on" if history else "off")
