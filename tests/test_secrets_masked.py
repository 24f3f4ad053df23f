"""No output path shows a database password (issue 27 items 4 and 8): the URL carries a known
secret in its user info AND in ``?password=`` (a form libpq and SQLAlchemy accept), and every
place that shows it is searched for either: the startup log and the error logs while the
database is unreachable, the errors raised to the user, ``/jobs``, the dashboard and the
metrics, ``ekbatan-jobs`` text and ``--json`` output and its errors, the settings' ``repr`` and
``str`` and their validation errors (environment and YAML)."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from ekbatan_fastapi import ConnectionProvider, ExecutionContext, OneTimeJob, Schedules
from ekbatan_fastapi.cli import main as cli_main
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.domain.text import is_secret_name, mask_url, redact
from ekbatan_fastapi.settings import DataSourceConfig, EkbatanSettings
from ekbatan_fastapi.store.connection import dialect_of
from ekbatan_fastapi.web import (
    create_ekbatan_lifespan,
    create_jobs_router,
    metrics_router,
)

from .fastapi_helpers import FAST_JOBS, SLOT_ENV, running
from .helpers import RecordingJob, wait_until

USERINFO_SECRET = "Userinfo-S3cret-7f1c"
QUERY_SECRET = "Query-S3cret-9a2b"
SECRETS = (USERINFO_SECRET, QUERY_SECRET)


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["one host", "several hosts"])
def secret_url(request: pytest.FixtureRequest) -> str:
    port = closed_port()
    if request.param == "one host":
        return f"postgresql+asyncpg://app:{USERINFO_SECRET}@127.0.0.1:{port}/appdb?password={QUERY_SECRET}"
    return (
        f"postgresql+asyncpg://app:{USERINFO_SECRET}@/appdb?host=127.0.0.1:{port}"
        f"&host=127.0.0.1:{closed_port()}&password={QUERY_SECRET}"
    )


def assert_masked(texts: dict[str, str]) -> None:
    """No text shows a secret; and the texts are not empty (each path was really run)."""
    for where, text in texts.items():
        assert text, f"{where}: nothing was produced (the path was not exercised)"
        for secret in SECRETS:
            assert secret not in text, f"{where} shows the password {secret!r}:\n{text}"


@pytest.fixture
def every_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would format it, with its traceback."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


class Note(OneTimeJob):
    def name(self) -> str:
        return "note"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


# -- the masking function itself ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "postgresql+asyncpg://u:SECRET@h/db",
        "postgresql+asyncpg://u:SECRET@h/db?password=SECRET&sslpassword=SECRET",
        "postgresql://h/db?sslpassword=SECRET&application_name=x",
        "cannot read url 'mysql+asyncmy://h/db?password=SECRET'; expected",
        "mysql://u:SECRET@h1,u:SECRET@h2/db",
        "postgresql://u:SEC@RET@h/db",
        "postgresql://u:SEC/RET?x@h/db",
        "postgresql://h/db?pass%77ord=SECRET",
        "postgresql://h/db?PASSWORD=SECRET",
        "host=h password=SECRET dbname=x",
        "host=h password = 'SEC RET' dbname=x",
        '{"password": "SECRET", "user": "u"}',
        "jdbc:postgresql://h:5432/app?user=u&password=SECRET",
        "x\npostgresql://u:SECRET@h/db\n[SQL: SELECT 1]",
        "api_key=SECRET&client_secret=SECRET&admin-token=SECRET",
    ],
)
def test_mask_url_hides_every_form_of_password(text: str) -> None:
    for shown in (mask_url(text), redact(text)):
        assert "SEC" not in shown, shown
        assert "***" in shown


def test_mask_url_keeps_what_is_not_secret() -> None:
    url = "postgresql+asyncpg://app:pw@db.internal:5432/app?application_name=x&passfile=/p"
    assert mask_url(url) == (
        "postgresql+asyncpg://app:***@db.internal:5432/app?application_name=x&passfile=/p"
    )
    assert mask_url(f"in {url!r}, then") == f"in {mask_url(url)!r}, then"
    assert mask_url(make_url(url + "&password=pw2")).endswith("passfile=%2Fp&password=***")
    assert [is_secret_name(n) for n in ("password", "sslpassword", "passfile", "sslkey")] == [
        True,
        True,
        False,
        False,
    ]


_PASSWORD_CHARS = st.characters(
    codec="utf-8", exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), exclude_characters="\x85"
)


@settings(max_examples=300, deadline=None)
@given(
    tail=st.text(_PASSWORD_CHARS, max_size=30),
    key=st.sampled_from(["password", "sslpassword", "PASSWORD", "pass%77ord", "client_secret"]),
    encoded=st.booleans(),
)
def test_no_password_survives_masking(tail: str, key: str, encoded: bool) -> None:
    """Any password (any printable characters, percent-encoded as a URL wants it or raw in
    the user info), in the user info and in a secret-named query parameter, of a URL as text
    or as a SQLAlchemy URL: the marker it starts with never survives."""
    secret = "S3CR3T" + tail
    userinfo = quote(secret, safe="") if encoded else secret
    text = f"postgresql+asyncpg://app:{userinfo}@db:5432/app?{key}={quote(secret, safe='')}&x=1"
    assert "S3CR3T" not in mask_url(text), mask_url(text)
    assert "S3CR3T" not in redact(f"cannot use {text!r}: refused"), text
    if encoded:
        assert "S3CR3T" not in mask_url(make_url(text))


# -- the application: logs, /jobs, the dashboard, metrics, errors raised -------------------


async def test_the_application_never_shows_the_password(
    secret_url: str, every_log: pytest.LogCaptureFixture
) -> None:
    settings = EkbatanSettings(
        jobs={**FAST_JOBS, "metrics": True},
        sharding={"groups": [{"members": [{"configs": {"jobs-config": {"url": secret_url}}}]}]},
    )
    tick = RecordingJob("tick", Schedules.fixed_delay(timedelta(seconds=1)))
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(settings=settings, jobs=[tick, Note()], discover=False)
    )
    app.include_router(create_jobs_router())
    app.include_router(metrics_router)
    texts: dict[str, str] = {}

    async with running(app) as http:
        registry = app.state.ekbatan.registry
        await wait_until(
            lambda: registry.status().last_error is not None, what="the first database error"
        )
        texts["repr of the pool"] = repr(registry.connection)
        texts["status()"] = repr(registry.status())
        for path in ("/jobs", "/jobs?include_task_data=true", "/jobs/tick", "/jobs/-/ui"):
            answer = await http.get(path)
            texts[f"GET {path} ({answer.status_code})"] = answer.text
        texts["GET /metrics"] = (await http.get("/metrics")).text
        try:
            await registry.client.schedule("note", "n-1")
        except Exception as error:
            texts["client.schedule's error"] = f"{type(error).__name__}: {error!s} {error!r}"
    texts["logs"] = _logged(every_log)
    assert "starting 2 jobs" in texts["logs"]
    assert_masked(texts)


def test_errors_about_the_url_never_show_the_password(secret_url: str) -> None:
    texts: dict[str, str] = {}
    for name, bad in {
        "unknown scheme": secret_url.replace("postgresql+asyncpg", "postgresqlx", 1),
        "unparseable": secret_url.replace("://", ":/", 1),
        "no colon after the scheme": secret_url.replace("://", "//", 1),
        "bad port": secret_url.replace("127.0.0.1:", "127.0.0.1:x", 1),
    }.items():
        for attempt in (
            ConnectionProvider.from_url,
            lambda url: DataSourceConfig(url=url).connection_provider(),
        ):
            with pytest.raises(ConfigurationError) as raised:
                attempt(bad)
            texts[f"{name}: {raised.value}"] = str(raised.value)
        if name != "bad port":  # a port is not the dialect's business
            with pytest.raises(ConfigurationError) as raised:
                dialect_of(bad)
            texts[f"{name}: dialect_of: {raised.value}"] = str(raised.value)
    jdbc = f"jdbc:postgresql://h1,h2/db?user=u&password={QUERY_SECRET}"
    with pytest.raises(ConfigurationError) as raised:
        DataSourceConfig(jdbc_url=jdbc).sqlalchemy_url()
    texts["jdbc-url with several hosts"] = str(raised.value)
    assert_masked(texts)


# -- the settings ------------------------------------------------------------------------


def test_settings_repr_str_and_errors_never_show_the_password(
    secret_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    texts: dict[str, str] = {}
    slot = {"url": secret_url, "password": USERINFO_SECRET}
    settings = EkbatanSettings(sharding={"groups": [{"members": [{"configs": {"jobs": slot}}]}]})
    texts["repr(settings)"] = repr(settings)
    texts["str(settings)"] = str(settings)
    config = DataSourceConfig(jdbc_url=f"jdbc:postgresql://h/db?password={QUERY_SECRET}")
    texts["repr(jdbc config)"] = repr(config)

    def refused(**values: Any) -> str:
        with pytest.raises(ConfigurationError) as raised:
            EkbatanSettings(**values)
        return str(raised.value)

    texts["a URL in a duration"] = refused(jobs={"polling-interval": secret_url})
    texts["a URL in a list"] = refused(jobs={"modules": f"[{secret_url}"})
    monkeypatch.setenv("EKBATAN_SHARDING", secret_url)
    texts["a URL where a section goes"] = refused()
    monkeypatch.delenv("EKBATAN_SHARDING")
    monkeypatch.setenv("EKBATAN_JOBS__OVERRIDES", f"password={QUERY_SECRET}")
    texts["a secret where a section goes"] = refused()
    monkeypatch.delenv("EKBATAN_JOBS__OVERRIDES")

    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "ekbatan:\n  sharding:\n    groups:\n      - members:\n          - configs:\n"
        f"              jobs-config:\n                password: {USERINFO_SECRET}: x\n"
    )
    texts["YAML syntax error"] = refused(_config_file=broken)
    assert "line 7" in texts["YAML syntax error"]
    unclosed = tmp_path / "unclosed.yaml"
    unclosed.write_text(f'ekbatan:\n  x:\n    password: "abc\n{QUERY_SECRET}\n')
    texts["YAML unclosed quote"] = refused(_config_file=unclosed)
    assert_masked(texts)
    assert "***" in texts["repr(settings)"] and "**********" in texts["repr(settings)"]


# -- the command line ----------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli_main(list(argv))
    except SystemExit as exit_:  # argparse's errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_never_shows_the_password(
    secret_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    texts: dict[str, str] = {}
    for mode in ([], ["--json"]):
        for argv in (
            ["--url", secret_url, "--connect-timeout", "1", "list"],
            ["--url", secret_url.replace("postgresql+asyncpg", "nosuchdb", 1), "list"],
            ["--url", secret_url.replace("://", ":/", 1), "list"],
            ["--url", secret_url, "list", "--limit", "x"],
        ):
            code, out, err = _cli(capsys, *mode, *argv)
            assert code != 0
            if mode and code != 2:
                assert json.loads(out)["exit_code"] == code
            texts[" ".join([*mode, *argv[2:]])] = out + err
        monkeypatch.setenv(f"{SLOT_ENV}__URL", secret_url)
        code, out, err = _cli(capsys, *mode, "--connect-timeout", "1", "history")
        assert code == 4, err
        texts[f"{mode} the URL from the settings"] = out + err
        monkeypatch.delenv(f"{SLOT_ENV}__URL")
    assert_masked(texts)
