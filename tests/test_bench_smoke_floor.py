"""Keeps ``bench/driver_floor.py`` working: a small run drains every row it loaded (no timing
is asserted)."""

from __future__ import annotations

import pytest

from bench.driver_floor import format_table, measure

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
