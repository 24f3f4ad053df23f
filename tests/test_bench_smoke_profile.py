"""Keeps ``bench/profile_breakdown.py`` working: it groups a real cProfile into parts whose
microseconds add up to the figure it is given (no timing asserted)."""

from __future__ import annotations

import asyncio
import cProfile
from pathlib import Path

import pytest

from bench.profile_breakdown import breakdown, main

pytestmark = pytest.mark.bench_smoke


async def _work() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


def test_breakdown_scales_a_profile_to_the_given_cpu_per_execution(tmp_path: Path) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(_work())
    profiler.disable()
    profile = tmp_path / "worker-0.pstats"
    profiler.dump_stats(profile)

    parts, busy = breakdown([profile], 30.0)

    assert busy > 0
    assert abs(sum(us for _, us in parts) - 30.0) < 1e-6
    assert any(part.startswith("asyncio") for part, _ in parts)
    assert main([str(tmp_path), "--us-per-exec", "30"]) == 0
