"""The dialect comes from the URL (no connection, no driver import); MySQL before 8 only
through the ``b.dialect("mysql5")`` override."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from ekbatan_fastapi import ConfigurationError, PollingStrategy, job_registry
from ekbatan_fastapi.store.connection import ConnectionProvider, supported_urls

from .helpers import CountingJob

UNREACHABLE_HOST = "nobody:secret@127.0.0.1:1/nowhere"


def build(url: str, customize: Any = None) -> Any:
    builder = job_registry().connection_provider(url).with_job(CountingJob())
    if customize is not None:
        builder.customize_scheduler(customize)
    return builder.build()


@pytest.mark.parametrize(
    ("scheme", "driver", "dialect"),
    [
        ("mysql", "mysql+asyncmy", "mysql"),
        ("mysql+asyncmy", "mysql+asyncmy", "mysql"),
        ("mariadb", "mariadb+asyncmy", "mariadb"),
        ("mariadb+asyncmy", "mariadb+asyncmy", "mariadb"),
        ("postgresql", "postgresql+asyncpg", "postgresql"),
    ],
)
def test_url_scheme_picks_driver_and_dialect_without_connecting(
    scheme: str, driver: str, dialect: str
) -> None:
    registry = build(f"{scheme}://{UNREACHABLE_HOST}")
    assert registry.engine.url.drivername == driver
    assert registry.store.dialect.name == dialect
    assert registry.scheduler.polling_strategy == PollingStrategy.LOCK_AND_FETCH


def test_mysql5_is_reachable_only_through_the_override() -> None:
    assert not any("mysql5" in url for url in supported_urls())
    registry = build(f"mysql+asyncmy://{UNREACHABLE_HOST}", lambda b: b.dialect("mysql5"))
    assert registry.store.dialect.name == "mysql5"
    assert registry.scheduler.polling_strategy == PollingStrategy.FETCH
    message = str(registry.store.db.missing_table())
    assert "mysql/V0001__create_scheduled_tasks.sql" in message
    assert "ekbatan-jobs migrate" in message
    with pytest.raises(ConfigurationError, match="lacks; use 'fetch'"):
        build(
            f"mysql+asyncmy://{UNREACHABLE_HOST}",
            lambda b: b.dialect("mysql5").polling_strategy("lock-and-fetch"),
        )


def test_unsupported_scheme_lists_every_supported_url() -> None:
    with pytest.raises(ConfigurationError) as info:
        build(f"mysql+pymysql://{UNREACHABLE_HOST}")
    message = str(info.value)
    assert "unsupported database URL scheme 'mysql+pymysql'" in message
    for url in ("postgresql+asyncpg://", "mysql+asyncmy://", "mariadb+asyncmy://"):
        assert url in message
    assert "secret" not in message


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncmy", None)  # an import of it now fails
    with pytest.raises(ConfigurationError, match=re.escape('pip install "ekbatan-fastapi[mysql]"')):
        ConnectionProvider.from_url(f"mariadb://{UNREACHABLE_HOST}")


def test_resolving_a_mysql_url_imports_no_driver() -> None:
    code = (
        "import sys\n"
        "import ekbatan_fastapi\n"
        "from ekbatan_fastapi.store.dialects import dialect\n"
        "mysql = dialect('mysql')\n"
        "assert mysql.schemes['mysql'] == 'mysql+asyncmy', mysql.schemes\n"
        "assert mysql.tasks.__name__ == 'MySQLTaskStore', mysql.tasks\n"
        "assert 'asyncmy' not in sys.modules, 'asyncmy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_a_mariadb_url_runs_jobs_on_a_mariadb_server(mysql_server_url: str) -> None:
    from datetime import timedelta

    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from ekbatan_fastapi import Schedules, create_schema

    from .conftest import fresh_mysql_database
    from .helpers import RecordingJob, wait_until

    async with fresh_mysql_database(mysql_server_url) as url:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                version = (await conn.execute(text("SELECT VERSION()"))).scalar_one()
            if "mariadb" not in str(version).lower():
                pytest.skip(f"the server is not MariaDB ({version})")
            await create_schema(engine)
        finally:
            await engine.dispose()
        mariadb_url = make_url(url).set(drivername="mariadb+asyncmy")
        job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
        registry = (
            job_registry()
            .connection_provider(mariadb_url)
            .with_job(job)
            .poll_interval(timedelta(seconds=0.2))
            .heartbeat_interval(timedelta(seconds=0.1))
            .build()
        )
        assert registry.store.dialect.name == "mariadb"
        async with registry:
            await wait_until(lambda: len(job.slots) >= 3, what="three runs")
        assert registry.status().last_error is None
