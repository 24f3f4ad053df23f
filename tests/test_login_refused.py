"""A wrong password, an unknown user or a missing database (issue 33 part 3 item 2) is a
refused login, not "the database refused a statement": the application's log and status,
``/jobs``, a route and ``ekbatan-jobs`` say so, name the host and database and the fix, and
never the user's name (an unauthenticated ``/jobs`` shows it; issue 27 item 12). Checked on a
private PostgreSQL 15 with SCRAM passwords (28P01), the suite's server (28000, 3D000),
PgBouncer (its 08P01) and MySQL/MariaDB (1045, 1049)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI
from sqlalchemy.engine import make_url

from bench.servers import PG15_BIN, have_pg15, have_pgbouncer, pgbouncer
from ekbatan_fastapi import DatabaseLoginRefused, ExecutionContext, OneTimeJob, SchedulerClient
from ekbatan_fastapi.cli import EXIT, parser, run
from ekbatan_fastapi.cli.output import Output
from ekbatan_fastapi.web import (
    create_ekbatan_lifespan,
    create_jobs_router,
    get_scheduler_client,
    install_exception_handlers,
)

from .fastapi_helpers import fast_settings, running
from .helpers import wait_until

USER = "ledger_writer_7q"
"""The configured user: no output may name it."""
LOGIN = "refused the login of the configured user"


class Note(OneTimeJob):
    def name(self) -> str:
        return "note"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def password_server() -> Iterator[int]:
    """A private PostgreSQL 15 that checks passwords (SCRAM), with the role ``USER``; its
    port. About 1.5 s to make."""
    if not have_pg15() or shutil.which("runuser") is None:
        pytest.skip("needs PostgreSQL 15 in /usr/lib/postgresql/15/bin and runuser")
    base = Path(tempfile.mkdtemp(prefix="ekbatan-scram-"))
    shutil.chown(base, "postgres")
    (base / "pw").write_text("right\n")
    shutil.chown(base / "pw", "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = base / "data"
    initdb = [str(PG15_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-N"]
    subprocess.run(
        [*as_postgres, *initdb, "--auth=scram-sha-256", f"--pwfile={base / 'pw'}"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {base} -F -c listen_addresses=127.0.0.1"
    pg_ctl = [*as_postgres, str(PG15_BIN / "pg_ctl"), "-D", str(data)]
    subprocess.run(
        [*pg_ctl, "-o", options, "-l", str(base / "log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        psql = [str(PG15_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
        subprocess.run(
            [*psql, "-d", "postgres", "-c", f"CREATE ROLE {USER} LOGIN PASSWORD 'right'"],
            check=True,
            capture_output=True,
            env={"PGPASSWORD": "right"},
        )
        yield port
    finally:
        subprocess.run(
            [*pg_ctl, "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


async def _cli(url: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    args = parser().parse_args(["--url", url, "--connect-timeout", "5", "list"])
    code = await run(args, Output(json_mode=False, stdout=out, stderr=err))
    return code, out.getvalue() + err.getvalue()


def _app(url: str) -> FastAPI:
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(settings=fast_settings(url), jobs=[Note()], discover=False)
    )
    app.include_router(create_jobs_router())
    install_exception_handlers(app)

    @app.post("/notes")
    async def add(client: Annotated[SchedulerClient, Depends(get_scheduler_client)]) -> None:
        await client.schedule("note", "n-1")

    return app


async def shown_everywhere(url: str, expected: str, hidden: str = USER) -> dict[str, str]:
    """The scheduler's status and log, ``/jobs``, a route, a client call and the CLI, for a
    database that refuses the login: each says ``expected`` and never ``hidden``."""
    texts: dict[str, str] = {}
    app = _app(url)
    async with running(app) as http:
        registry = app.state.ekbatan.registry
        await wait_until(lambda: registry.status().last_error is not None, what="an error")
        status = registry.status()
        assert status.condition == "login-refused", status
        texts["status"] = status.last_error or ""
        report = await http.get("/jobs")
        assert report.status_code == 503, report.text
        texts["/jobs"] = report.text
        route = await http.post("/notes")
        assert route.status_code == 503 and route.json()["error"] == "database-unavailable"
        with pytest.raises(DatabaseLoginRefused) as raised:
            await registry.client.schedule("note", "n-2")
        texts["client.schedule"] = str(raised.value)
    code, texts["cli"] = await _cli(url)
    assert code == EXIT.USAGE, texts["cli"]
    for where, text in texts.items():
        if where != "/jobs":  # /jobs lists it among its problems
            assert expected in text, f"{where}: {text}"
        assert hidden not in text, f"{where} names the user: {text}"
        assert "refused a statement" not in text, f"{where}: {text}"
    assert expected in texts["/jobs"], texts["/jobs"]
    return texts


async def test_a_wrong_password_is_a_refused_login_naming_where_and_the_fix(
    password_server: int,
) -> None:
    url = f"postgresql+asyncpg://{USER}:wrong@127.0.0.1:{password_server}/postgres"
    texts = await shown_everywhere(url, LOGIN)
    assert f"postgresql://127.0.0.1:{password_server}/postgres" in texts["cli"]
    assert "SQLSTATE 28P01" in texts["cli"] and "pg_hba.conf" in texts["cli"]
    assert "EKBATAN_DATABASE_URL" in texts["status"]


async def test_an_unknown_user_is_a_refused_login(postgres_server_url: str) -> None:
    url = make_url(postgres_server_url).set(username=USER, password=None)
    await shown_everywhere(url.render_as_string(hide_password=False), LOGIN)


async def test_a_missing_database_names_it_and_the_fix(postgres_server_url: str) -> None:
    url = make_url(postgres_server_url).set(database="no_such_db_8k")
    texts = await shown_everywhere(
        url.render_as_string(hide_password=False), "there is no database 'no_such_db_8k'"
    )
    assert "create it (CREATE DATABASE)" in texts["cli"]


@pytest.fixture
def bouncer_with_password(postgres_server_url: str) -> Iterator[int]:
    if not have_pgbouncer():
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    with pgbouncer(postgres_server_url, mode="session", client_password="right") as bouncer:
        yield bouncer.port


async def test_pgbouncers_wrong_password_answer_is_a_refused_login(
    bouncer_with_password: int, postgres_server_url: str
) -> None:
    user = make_url(postgres_server_url).username or "postgres"
    url = f"postgresql+asyncpg://{user}:wrong@127.0.0.1:{bouncer_with_password}/postgres"
    code, text = await _cli(url)
    assert code == EXIT.USAGE and LOGIN in text and "SQLSTATE 08P01" in text, text


async def test_mysql_wrong_password_and_missing_database(mysql_server_url: str) -> None:
    server = make_url(mysql_server_url)
    wrong = server.set(password="wrong").render_as_string(hide_password=False)
    texts = await shown_everywhere(wrong, LOGIN, hidden=f"'{server.username}'@")
    assert "error 1045" in texts["cli"] and "user@host accounts" in texts["cli"]
    missing = server.set(database="no_such_db_8k").render_as_string(hide_password=False)
    code, text = await _cli(missing)
    assert code == EXIT.USAGE and "there is no database 'no_such_db_8k'" in text, text
    assert "error 1049" in text
