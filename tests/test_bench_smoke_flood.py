"""Keeps ``bench/flood.py`` from rotting: a tiny flood must run end to end and report the
1-second job's slots, the probe's answers and the flood's.

No figure is asserted beyond what the harness must always see (the job ran, the probe was
answered, a page over the maximum is refused); the benchmark's figures are not pass/fail.
"""

from __future__ import annotations

import pytest

from bench.flood import Options, report, run

pytestmark = pytest.mark.bench_smoke


async def test_flood_harness_reports_slots_probe_and_answers(postgres_server_url: str) -> None:
    options = Options(
        url=postgres_server_url, clients=4, seconds=2.0, rows=200, limit=10_000, settle=1.0
    )
    result = await run(options)
    assert result.slots and result.on_time >= 1, result
    assert sum(result.probe.values()) >= 1 and "503 unreachable" not in result.probe, result
    assert result.flood["requests"] > 0
    assert set(result.flood["statuses"]) == {"422"}, result.flood  # over the page's maximum
    text = report(result)
    assert "runs per slot:" in text and "probe GET /jobs?limit=1" in text
