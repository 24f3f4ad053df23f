"""Keeps ``bench/missed_cost.py`` from rotting: a quick run completes every variant (with and
without missed-slot recording, with the check-in observer against its local stub) and prints
the table; the stub answered the check-ins. No timing is asserted."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench_smoke

ROOT = Path(__file__).resolve().parent.parent


async def test_missed_cost_harness_runs_every_variant(postgres_server_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "bench" / "missed_cost.py"),
        "--quick",
        "--url",
        postgres_server_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 480)
    text = out.decode()
    assert process.returncode == 0, text[-3000:]
    for variant in ("default", "no-missed", "checkins"):
        assert f"| {variant} |" in text, text[-2000:]
    pings = re.search(r"repeat 1 checkins: .* pings answered (\d+)", text)
    assert pings is not None and int(pings.group(1)) > 0, text[-2000:]
