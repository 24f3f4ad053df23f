"""Keeps ``bench/driver_floor.py`` working: a small run drains every row it loaded (no timing
is asserted)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bench.driver_floor import format_table, instructions_per_row, measure

from .conftest import _fresh_postgres_database

pytestmark = pytest.mark.bench_smoke


async def test_driver_floor_drains_every_row_with_the_stores_statements(
    postgres_server_url: str,
) -> None:
    async with _fresh_postgres_database(postgres_server_url) as url:
        run = await measure(url, 230)

    assert run.rows == 230
    assert run.cpu_us_per_row > 0
    assert "| 230 | 50 | 1 |" in format_table([run], 230)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian: valgrind)")
async def test_driver_floor_counts_instructions_under_callgrind(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """``--callgrind``: one run under valgrind, instrumented in its loop only; the count per
    row is the loop's (the interpreter's start-up, some 10^8 instructions, is left out)."""
    async with _fresh_postgres_database(postgres_server_url) as url:
        per_row = await asyncio.to_thread(instructions_per_row, url, 100, tmp_path)

    assert 10_000 < per_row < 1_000_000
