"""Keeps ``bench/missed_cost.py`` from rotting: a quick run completes every variant (with and
without missed-slot recording, with the check-in observer against its local stub) and prints
the table; the stub answered the check-ins. No timing is asserted."""

from __future__ import annotations

import re

import pytest

from .helpers import run_bench

pytestmark = pytest.mark.bench_smoke


async def test_missed_cost_harness_runs_every_variant(postgres_server_url: str) -> None:
    returncode, text = await run_bench("missed_cost.py", postgres_server_url, 480)
    assert returncode == 0, text[-3000:]
    for variant in ("default", "no-missed", "checkins"):
        assert f"| {variant} |" in text, text[-2000:]
    pings = re.search(r"repeat 1 checkins: .* pings answered (\d+)", text)
    assert pings is not None and int(pings.group(1)) > 0, text[-2000:]
