"""Keeps ``bench/schedules.py`` from rotting: a quick run (2,000 schedules, 100 due at once on
two processes) completes, every due slot started once. No timing is asserted."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench_smoke

ROOT = Path(__file__).resolve().parent.parent


async def test_schedules_harness_completes_with_each_slot_once(postgres_server_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "bench" / "schedules.py"),
        "--quick",
        "--url",
        postgres_server_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 240)
    text = out.decode()
    assert process.returncode == 0, text[-3000:]
    assert "create_schedules: 2,000" in text
    assert "duplicates 0, skipped 0" in text, text[-1500:]
    assert "(slot as updated: True)" in text
