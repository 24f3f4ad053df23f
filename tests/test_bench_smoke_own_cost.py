"""Keeps ``bench/own_cost.py`` working: a small run launches, runs and records every execution
through the real executor and completer (no timing is asserted; no database)."""

from __future__ import annotations

import pytest

from bench.own_cost import measure

pytestmark = pytest.mark.bench_smoke


async def test_own_cost_runs_every_execution_through_the_scheduler() -> None:
    runs = await measure(120, 2)

    assert len(runs) == 2
    assert all(r > 0 for r in runs)
