"""Keeps ``bench/schedules.py`` from rotting: a quick run (2,000 schedules, 100 due at once on
two processes) completes, every due slot started once. No timing is asserted."""

from __future__ import annotations

import pytest

from .helpers import run_bench

pytestmark = pytest.mark.bench_smoke


async def test_schedules_harness_completes_with_each_slot_once(postgres_server_url: str) -> None:
    returncode, text = await run_bench("schedules.py", postgres_server_url, 240)
    assert returncode == 0, text[-3000:]
    assert "create_schedules: 2,000" in text
    assert "duplicates 0, skipped 0" in text, text[-1500:]
    assert "(slot as updated: True)" in text
