"""A route calling ``client.schedule`` while the jobs database is down or not migrated
(issue 33 part 3 item 3): with ``install_exception_handlers(app)`` it answers 503 with a JSON
body that says what (not where), instead of a 500 with a traceback; the example app does."""

from __future__ import annotations

import logging
import socket
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI

from ekbatan_fastapi import ExecutionContext, OneTimeJob, SchedulerClient
from ekbatan_fastapi.web import (
    create_ekbatan_lifespan,
    get_scheduler_client,
    install_exception_handlers,
)

from .fastapi_helpers import fast_settings, running


class Note(OneTimeJob):
    def name(self) -> str:
        return "note"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def notes_app(url: str) -> FastAPI:
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(settings=fast_settings(url), jobs=[Note()], discover=False)
    )
    install_exception_handlers(app)

    @app.post("/notes/{note_id}", status_code=202)
    async def add(
        note_id: str, client: Annotated[SchedulerClient, Depends(get_scheduler_client)]
    ) -> dict[str, Any]:
        await client.schedule("note", note_id, data={"id": note_id})
        return {"scheduled": note_id}

    return app


async def test_a_database_that_is_down_answers_503_with_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql+asyncpg://app:pw@127.0.0.1:{closed_port()}/app"
    async with running(notes_app(url)) as http:
        answer = await http.post("/notes/n-1")
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert answer.json() == {
        "detail": "the jobs database is unavailable; try again shortly",
        "error": "database-unavailable",
    }
    assert "127.0.0.1" not in answer.text  # what, not where: the log says where
    logged = [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]
    assert logged and "database unreachable at postgresql://127.0.0.1:" in logged[0]


async def test_missing_tables_answer_503_schema_missing(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(notes_app(database_url)) as http:
        answer = await http.post("/notes/n-1")
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "schema-missing"
    assert "ekbatan-jobs migrate" in answer.json()["detail"]
    assert any("ekbatan-jobs migrate" in r.getMessage() for r in caplog.records)


async def test_the_applications_own_handler_is_kept() -> None:
    from fastapi.responses import PlainTextResponse

    from ekbatan_fastapi import DatabaseUnavailable

    app = notes_app(f"postgresql+asyncpg://app@127.0.0.1:{closed_port()}/app")

    async def mine(request: Any, error: Exception) -> PlainTextResponse:
        return PlainTextResponse("mine", status_code=599)

    app.add_exception_handler(DatabaseUnavailable, mine)
    install_exception_handlers(app)  # a second call changes nothing either
    async with running(app) as http:
        answer = await http.post("/notes/n-1")
    assert (answer.status_code, answer.text) == (599, "mine")


async def test_the_example_app_answers_503_when_its_database_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from example_app.app import create_app

    monkeypatch.setenv(
        "EKBATAN_DATABASE_URL", f"postgresql+asyncpg://app@127.0.0.1:{closed_port()}/app"
    )
    async with running(create_app()) as http:
        answer = await http.post("/demo/notes", json={"text": "hello"})
        invalid = await http.post("/demo/notes", json={"text": ""})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "database-unavailable"
    assert invalid.status_code == 422
