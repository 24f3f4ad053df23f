"""ekbatan_fastapi.testing.pytest_plugin, enabled as a user enables it, in a pytest run of its
own: each test gets a fresh database with the jobs tables, dropped afterwards."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

pytest_plugins = ["pytester"]

INNER = """
import asyncio, pathlib
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import create_async_engine

pytest_plugins = ["ekbatan_fastapi.testing.pytest_plugin"]


async def tables(url):
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda c: sorted(inspect(c).get_table_names()))
    finally:
        await engine.dispose()


def test_one(ekbatan_database_url, ekbatan_postgres_server_url):
    names = asyncio.run(tables(ekbatan_database_url))
    assert "scheduled_tasks" in names and "ekbatan_execution_history" in names
    pathlib.Path("urls.txt").write_text(ekbatan_database_url + "\\n" + ekbatan_postgres_server_url)


def test_two(ekbatan_database_url):
    first = pathlib.Path("urls.txt").read_text().splitlines()[0]
    assert ekbatan_database_url != first
"""


async def _database_exists(server_url: str, name: str) -> bool:
    engine = create_async_engine(server_url)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            )
            return found.first() is not None
    finally:
        await engine.dispose()


@pytest.mark.multiprocess
async def test_the_plugin_gives_each_test_a_fresh_database_with_tables(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, postgres_server_url: str
) -> None:
    # This session's server (embedded or not): the plugin's own embedded server starts in
    # test_docs_testing_example.py, and a second initdb here would only cost time.
    monkeypatch.setenv("EKBATAN_TEST_POSTGRES_URL", postgres_server_url)
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    database_url, server_url = (pytester.path / "urls.txt").read_text().splitlines()
    name = make_url(database_url).database
    assert name is not None and name.startswith("ekbatan_test_")
    assert make_url(server_url) == make_url(postgres_server_url)
    assert not await _database_exists(server_url, name)  # dropped after its test
