"""Keeps the outage harness (``bench/outage.py``) working: one short outage of each kind on
the suite's PostgreSQL. No figure is asserted but the bookkeeping (benchmarks are never part
of the suite's pass/fail; ``tests/test_outages.py`` holds the bound on connection attempts)."""

from __future__ import annotations

import pytest

from bench import outage

pytestmark = pytest.mark.bench_smoke


@pytest.mark.parametrize("kind", outage.KINDS)
async def test_one_short_outage_is_measured(postgres_server_url: str, kind: str) -> None:
    result = await outage.measure(postgres_server_url, kind, 1.0)
    assert result["kind"] == kind
    assert result["seconds"] >= 1.0
    assert result["connects"] >= 0 and result["runs_again_after_s"] >= 0
