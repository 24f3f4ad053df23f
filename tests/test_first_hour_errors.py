"""The mistakes of a user's first hour, and the errors they get (docs/robustness.md): a
missing table logged once, not every retry; a wrong host, a refused port and a database that
never answers, each named and raised as ``DatabaseUnavailable``; the admin routes' hints in
their HTTP form; cron expressions checked field by field, in the user's own order."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DatabaseTimeout,
    DatabaseUnavailable,
    ExecutionContext,
    OneTimeJob,
    ScheduleError,
    Schedules,
    SchemaMissingError,
    create_schema,
)
from ekbatan_fastapi.web import create_jobs_router

from .conftest import Database
from .fastapi_helpers import running
from .helpers import RecordingJob, RegistryFactory, wait_until
from .test_jobs_routes import make_app, require_token, serving

ADMIN = {"x-admin-token": "let-me-in"}


class Greet(OneTimeJob):
    def name(self) -> str:
        return "greet"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


# -- the missing table -------------------------------------------------------------------


async def test_a_missing_table_is_logged_once_and_names_the_migrate_command(
    any_registries: RegistryFactory, any_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = any_registries.build(
        job, poll=0.02, customize=lambda b: b.table_name("not_migrated_tasks")
    )
    seen: set[object] = set()

    def retried() -> bool:
        seen.add(registry.status().last_error_at)
        return len(seen - {None}) >= 6

    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        await wait_until(retried, what="six startup attempts")
    errors = [r for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "'not_migrated_tasks' does not exist in the jobs database at " in message
    assert "run `ekbatan-jobs migrate` once against it" in message
    assert f"ekbatan_fastapi/migrations/{any_database.migrations}/V0001__" in message
    with pytest.raises(SchemaMissingError, match="ekbatan-jobs migrate"):
        await registry.client.list()
    await create_schema(registry.engine, "not_migrated_tasks")
    await wait_until(lambda: len(job.slots) >= 1, timeout=15, what="runs once created")


# -- the database cannot be reached ----------------------------------------------------------


def _url(database: Database, host: str, port: int) -> str:
    """The test database's URL pointed at ``host:port``, with a password that must never
    show."""
    url = make_url(database.url)
    return url.set(host=host, port=port, password="s3cret-pw", query={}).render_as_string(
        hide_password=False
    )


async def _schedule_fails(factory: RegistryFactory, url: str, **options: object) -> BaseException:
    registry = factory.build(Greet(), url=url, **options)  # type: ignore[arg-type]
    with pytest.raises(DatabaseUnavailable) as raised:
        await registry.client.schedule("greet", "first-hour")
    return raised.value


async def test_a_wrong_host_is_named_by_the_client_and_the_scheduler(
    any_registries: RegistryFactory, any_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(any_database, "nohost.invalid", 5432)
    error = await _schedule_fails(any_registries, url)
    assert "nohost.invalid:5432" in str(error), error
    assert "s3cret-pw" not in str(error)
    assert error.__cause__ is not None  # the driver's own error, chained
    assert not isinstance(error, DatabaseTimeout)

    registry = any_registries.build(Greet(), url=url)
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await registry.start()
        await wait_until(lambda: registry.status().last_error is not None, what="an error")
    status = registry.status()
    assert "nohost.invalid:5432" in (status.last_error or ""), status.last_error
    logged = [r.getMessage() for r in caplog.records if "nohost.invalid" in r.getMessage()]
    assert logged and not any("s3cret-pw" in m for m in logged)


async def test_a_refused_connection_raises_database_unavailable_naming_the_port(
    any_registries: RegistryFactory, any_database: Database
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = await _schedule_fails(any_registries, _url(any_database, "127.0.0.1", port))
    assert f"127.0.0.1:{port}" in str(error), error
    assert "s3cret-pw" not in str(error)
    assert error.__cause__ is not None


@asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never answers: a frozen database."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_database_that_never_answers_raises_database_unavailable_in_time(
    any_registries: RegistryFactory, any_database: Database
) -> None:
    async with silent_server() as port:
        url = _url(any_database, "127.0.0.1", port)
        loop = asyncio.get_running_loop()
        began = loop.time()
        error = await _schedule_fails(
            any_registries,
            url,
            customize=lambda b: b.statement_timeout(timedelta(seconds=0.5)),
        )
        assert loop.time() - began < 10
    assert isinstance(error, DatabaseTimeout)  # a DatabaseUnavailable
    assert f"127.0.0.1:{port}" in str(error), error


async def test_routes_name_the_host_they_cannot_reach(database_url: str) -> None:
    router = create_jobs_router(admin_dependency=require_token)
    bad = "postgresql+asyncpg://app:s3cret-pw@nohost.invalid:5432/app"
    async with running(make_app(database_url, Greet(), router=router, url=bad)) as client:
        listing = await client.get("/jobs")
        run = await client.post("/jobs/greet/run?instance=a", headers=ADMIN)
    assert listing.status_code == 503 and run.status_code == 503
    assert "database unreachable at postgresql://nohost.invalid:5432/app" in run.json()["detail"]
    assert any("nohost.invalid:5432" in p for p in listing.json()["problems"])
    assert "s3cret-pw" not in listing.text + run.text


# -- the admin routes' hints -------------------------------------------------------------


async def test_http_hints_are_in_the_http_form(database_url: str, engine: AsyncEngine) -> None:
    paused = RecordingJob("nightly", Schedules.fixed_delay(timedelta(hours=1)))
    router = create_jobs_router(admin_dependency=require_token)
    async with serving(database_url, paused, Greet(), router=router) as (client, state):
        await state.client.pause("nightly", "maintenance")
        refused = await client.post("/jobs/nightly/run", headers=ADMIN)
        assert refused.status_code == 409
        detail = refused.json()["detail"]
        assert "pass ?force=true to run it once anyway" in detail
        assert "force=True" not in detail

        await state.client.schedule("greet", "welcome-42", datetime.now(UTC) + timedelta(days=1))
        missing = await client.post("/jobs/greet/run", headers=ADMIN)
        assert missing.status_code == 404
        detail = missing.json()["detail"]
        assert "greet is a one-time job" in detail
        assert "?instance=<id>" in detail and "'welcome-42'" in detail
        found = await client.post("/jobs/greet/run?instance=welcome-42", headers=ADMIN)
        assert found.status_code == 202, found.text


# -- cron expressions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "*/61 * * * * *",
            "the step /61 in the second field '*/61' is out of range; second steps go from 1 to 59",
        ),
        ("0 */25 * * *", "the step /25 in the hour field '*/25' is out of range"),
        ("0 0 */0 * *", "the step /0 in the day-of-month field '*/0' is out of range"),
        ("0 61 * * * *", "61 in the minute field '61' is out of range; minute values go from 0"),
        ("0 0 * 13 *", "13 in the month field '13' is out of range"),
        ("0 0 * FOO *", "the month field 'FOO' is not valid"),
        ("0 0 * * 5L", "the weekday field '5L' is not valid"),
        (
            "* * * * * */2",
            "its last field '*/2' looks like seconds, but six fields read second minute hour "
            "day-of-month month weekday",
        ),
        ("* * * * * 30", "write '30 * * * * *'"),
    ],
)
def test_cron_errors_name_the_field_as_the_user_wrote_it(expression: str, message: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        Schedules.cron(expression)
    text = str(raised.value)
    assert text.startswith(f"invalid cron expression {expression!r}: "), text
    assert message in text, text


@pytest.mark.parametrize(
    "expression",
    [
        "*/59 * * * * *",
        "0 0 12 * * */2",  # every other weekday at noon: a weekday step is fine after 0 seconds
        "0 0 * * 7",
        "0 0 * * MON-FRI",
        "0 0 * JAN-MAR *",
        "0 0 1W * *",
        "0 0 L * *",
        "0 0 * * 5#3",
        "0 0 ? * 1",
        "0 9-17/2 * * *",
    ],
)
def test_valid_cron_expressions_stay_valid(expression: str) -> None:
    Schedules.cron(expression, seconds=len(expression.split()) == 6)


async def test_jobs_report_warns_when_no_job_is_registered(
    database_url: str, engine: AsyncEngine
) -> None:
    async with serving(database_url) as (client, _):
        body = (await client.get("/jobs")).json()
    assert body["healthy"] is True  # nothing is broken, but nothing runs either
    assert any("no job is registered on this instance" in w for w in body["warnings"])
