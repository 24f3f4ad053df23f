"""``ekbatan-jobs``, run as a subprocess (the installed console script) against the test
databases."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.client.views import (
    HistoryPage,
    InstanceView,
    JobView,
    PauseResult,
    RunNowResult,
    TaskPage,
    TaskView,
)
from ekbatan_fastapi.store.migrate import migrate

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, is_mysql, wait_until

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(sys.executable).parent / "ekbatan-jobs"


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


async def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Result:
    assert SCRIPT.exists(), f"{SCRIPT} is missing: pip install -e . creates the console script"
    process = await asyncio.create_subprocess_exec(
        str(SCRIPT),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


def target(database: Database) -> list[str]:
    """``--url`` (and the override a URL cannot say) for a test database."""
    return ["--url", database.url, *(["--dialect", "mysql5"] if database.override else [])]


async def _tables(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            sql = "SHOW TABLES" if is_mysql(engine) else "SELECT tablename FROM pg_tables"
            return {row[0] for row in await conn.execute(text(sql))}
    finally:
        await engine.dispose()


async def test_migrate_applies_once_and_records_what_it_applied(any_database: Database) -> None:
    dry = await cli(*target(any_database), "--json", "migrate", "--dry-run")
    assert dry.code == 0, dry.stderr
    assert [m["status"] for m in dry.json["migrations"]] == ["pending"] * 7
    assert "scheduled_tasks" not in await _tables(any_database.url)

    first = await cli(*target(any_database), "migrate", "--json")
    assert first.code == 0, first.stderr
    assert first.json["folder"] == any_database.migrations
    assert [(m["version"], m["status"]) for m in first.json["migrations"]] == [
        (1, "applied"),
        (2, "applied"),
        (3, "applied"),
        (4, "applied"),
        (5, "applied"),
        (6, "applied"),
        (7, "applied"),
    ]
    again = await cli(*target(any_database), "migrate")
    assert again.code == 0, again.stderr
    assert again.stdout.count("up-to-date") == 7
    assert {
        "scheduled_tasks",
        "ekbatan_execution_history",
        "ekbatan_paused_tasks",
        "ekbatan_scheduler_instances",
        "ekbatan_jobs",
        "ekbatan_trace_context",
        "ekbatan_cancel_requests",
        "ekbatan_missed_streaks",
        "ekbatan_schema_migrations",
    } <= await _tables(any_database.url)


async def test_migrate_adopts_tables_made_otherwise_and_completes_a_partial_schema(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    # any_engine made every table with create_schema; one of them went missing since, and the
    # index of V0004 was never made (a schema from before it)
    drop_index = "DROP INDEX ekbatan_task_name_priority_idx" + (
        " ON scheduled_tasks" if is_mysql(any_engine) else ""
    )
    async with any_engine.begin() as conn:
        await conn.execute(text("DROP TABLE ekbatan_paused_tasks"))
        await conn.execute(text(drop_index))
    result = await cli(*target(any_database), "--json", "migrate")
    assert result.code == 0, result.stderr
    assert [m["status"] for m in result.json["migrations"]] == [
        "baseline",
        "partial",
        "baseline",
        "applied",
        "baseline",
        "baseline",
        "baseline",
    ]
    assert "ekbatan_paused_tasks" in await _tables(any_database.url)
    async with any_engine.connect() as conn:
        recorded = (
            await conn.execute(
                text("SELECT version, kind, checksum FROM ekbatan_schema_migrations ORDER BY 1")
            )
        ).all()
    assert [(v, k) for v, k, _ in recorded] == [
        (1, "baseline"),
        (2, "partial"),
        (3, "baseline"),
        (4, "applied"),
        (5, "baseline"),
        (6, "baseline"),
        (7, "baseline"),
    ]
    assert all(len(checksum) == 64 for _, _, checksum in recorded)


@pytest.mark.parametrize("any_database", ["mysql"], indirect=True)
async def test_migrations_recorded_from_the_former_mariadb_copy_are_up_to_date(
    any_database: Database,
) -> None:
    # MariaDB ran migrations/mariadb/ (a copy of migrations/mysql/ but for its comments) before
    # the two became one folder: what it recorded is not a changed migration; another text is
    engine = create_async_engine(any_database.url)
    try:
        await migrate(engine, any_database.dialect)
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE ekbatan_schema_migrations SET checksum = :old WHERE version = 1"),
                {"old": "5271d815aee3058ac03b2e365f155c1b7e82d701896f16e9bfd1195795481bd5"},
            )
            await conn.execute(
                text("UPDATE ekbatan_schema_migrations SET checksum = :other WHERE version = 2"),
                {"other": "0" * 64},
            )
        again = await migrate(engine, any_database.dialect)
    finally:
        await engine.dispose()
    assert [(r.status, r.checksum_changed) for r in again] == [
        ("up-to-date", False),
        ("up-to-date", True),
        ("up-to-date", False),
        ("up-to-date", False),
        ("up-to-date", False),
        ("up-to-date", False),
        ("up-to-date", False),
    ]


# The same SQL as on the other servers of each family: two runs are enough here.
@pytest.mark.parametrize("any_database", ["postgresql-embedded", "mysql"], indirect=True)
async def test_operating_a_running_cluster(
    any_database: Database, any_registries: RegistryFactory
) -> None:
    ok = RecordingJob("ok", Schedules.fixed_delay(timedelta(hours=1)))
    bad = RecordingJob("bad", Schedules.fixed_delay(timedelta(hours=1)), fail=True)
    registry = await any_registries.start(ok, bad)
    await wait_until(lambda: bool(ok.slots and bad.slots), what="the first runs")
    url = target(any_database)

    async def recorded() -> bool:
        return len(await registry.client.history()) == 2

    await wait_until(recorded, what="two history records")
    listed, history, table, instances = await asyncio.gather(
        cli(*url, "list", "--json"),
        cli(*url, "history", "bad", "--json"),
        cli(*url, "history"),
        cli(*url, "instances", "--json"),
    )
    jobs, first, second, first_text = await asyncio.gather(  # at most four processes at once
        cli(*url, "jobs", "--json"),
        cli(*url, "list", "--limit", "1", "--json"),
        cli(*url, "list", "--limit", "1", "--offset", "1", "--json"),
        cli(*url, "list", "--limit", "1"),
    )
    assert listed.code == 0, listed.stderr
    # the names of /jobs (one read model, ekbatan_fastapi/client/read_model.py)
    assert set(listed.json) == set(TaskPage.model_fields)
    assert all(set(t) == set(TaskView.model_fields) for t in listed.json["tasks"])
    states = {t["name"]: t for t in listed.json["tasks"]}
    assert states["bad"]["state"] == "failing" and states["bad"]["consecutive_failures"] == 1
    assert states["ok"]["state"] == "scheduled" and states["ok"]["last_success"]
    assert states["ok"]["kind"] == "recurring"  # from ekbatan_jobs: the CLI loads no jobs
    assert states["ok"]["schedule"] == "FIXED_DELAY|PT1H"
    assert listed.json["next_offset"] is None
    assert set(history.json) == set(HistoryPage.model_fields)
    assert history.json["name"] == "bad" and history.json["next_before_id"] is None
    assert [(h["outcome"], h["error_class"]) for h in history.json["records"]] == [
        ("failed", "RuntimeError")
    ]
    assert "bad failed on purpose" in table.stdout and "succeeded" in table.stdout
    assert [i["name"] for i in instances.json["instances"]] == [registry.scheduler.name]
    assert set(instances.json["instances"][0]) == set(InstanceView.model_fields)
    assert [j["name"] for j in jobs.json["jobs"]] == ["bad", "ok"]
    assert all(set(j) == set(JobView.model_fields) for j in jobs.json["jobs"])
    # paging as /jobs pages: limit, offset, next_offset
    assert first.json["next_offset"] == 1 and second.json["next_offset"] == 2
    assert "--offset 1 shows the next page" in first_text.stderr
    paged = [t["name"] for t in first.json["tasks"] + second.json["tasks"]]
    assert sorted(paged) == ["bad", "ok"]

    paused = await cli(*url, "pause", "ok", "--reason", "maintenance", "--by", "alice", "--json")
    assert paused.code == 0, paused.stderr
    assert set(paused.json) == set(PauseResult.model_fields)
    assert (paused.json["name"], paused.json["paused_by"]) == ("ok", "alice")
    assert (await registry.client.paused())["ok"].reason == "maintenance"
    refused = await cli(*url, "run-now", "ok")
    assert refused.code == 6 and "ok is paused (by alice" in refused.stderr
    forced = await cli(*url, "run-now", "ok", "--force", "--json")
    assert forced.code == 0, forced.stderr
    assert set(forced.json) == set(RunNowResult.model_fields) and forced.json["forced"]
    assert forced.json["claimed_by"] in (
        registry.scheduler.name,
        "an instance (the run already finished)",
    )
    await wait_until(lambda: len(ok.slots) == 2, what="the forced run")
    pause = (await registry.client.paused())["ok"]
    assert (pause.paused_by, pause.reason) == ("alice", "maintenance")  # put back as it was

    resumed = await cli(*url, "resume", "ok")
    assert resumed.code == 0 and "resumed ok" in resumed.stdout, resumed.stderr
    assert await registry.client.paused() == {}
    due = await cli(*url, "run-now", "bad")
    assert due.code == 0, due.stderr
    await wait_until(lambda: len(bad.slots) == 2, what="the run-now")


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A loopback port that accepts connections and never answers (a hung database)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    for writer in held:
        writer.close()


async def test_errors_exit_non_zero_with_a_clear_message(
    database_url: str, engine: AsyncEngine, silent_server: int, tmp_path: Path
) -> None:
    unknown = await cli("--url", database_url, "pause", "nope", "--reason", "x")
    assert unknown.code == 3 and "unknown task 'nope'" in unknown.stderr
    as_json = await cli("--url", database_url, "--json", "run-now", "nope")
    assert as_json.code == 3 and as_json.json["exit_code"] == 3

    began = time.monotonic()
    hung = f"postgresql+asyncpg://u@127.0.0.1:{silent_server}/db"
    unreachable = await cli("--url", hung, "--connect-timeout", "0.5", "list")
    assert unreachable.code == 4, unreachable.stderr
    assert "cannot reach the database at" in unreachable.stderr and "0.5 s" in unreachable.stderr
    # not a timing test: without its timeout the connect would hang past cli()'s 30 s; the
    # bound leaves room for a process start on a loaded machine
    assert time.monotonic() - began < 25

    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE scheduled_tasks"))
    missing = await cli("--url", database_url, "list")
    assert missing.code == 5 and "ekbatan-jobs migrate" in missing.stderr

    unconfigured = await cli("list")
    assert unconfigured.code == 2 and "no database is configured" in unconfigured.stderr
    usage = await cli("pause", "x")  # --reason is required
    assert usage.code == 2 and "--reason" in usage.stderr


async def test_database_from_environment_and_yaml_settings(
    database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    slot = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL"
    from_env = await cli("list", env={slot: database_url})
    assert from_env.code == 0 and "(none)" in from_env.stdout, from_env.stderr
    from_alias = await cli("list", env={"EKBATAN_DATABASE_URL": database_url})
    assert from_alias.code == 0 and "(none)" in from_alias.stdout, from_alias.stderr
    config = tmp_path / "app.yaml"
    config.write_text(
        "ekbatan:\n  sharding:\n    groups:\n      - members:\n          - configs:\n"
        "              jobs-config:\n                url: ${JOBS_URL}\n"
    )
    from_yaml = await cli(
        "--json", "migrate", env={"EKBATAN_CONFIG_FILE": str(config), "JOBS_URL": database_url}
    )
    assert from_yaml.code == 0, from_yaml.stderr
    assert [m["status"] for m in from_yaml.json["migrations"]] == ["baseline"] * 7
    flag = await cli("list", "--config", str(config), env={"JOBS_URL": database_url})
    assert flag.code == 0, flag.stderr


async def test_resume_skip_missed_needs_the_schedule_when_overdue(
    database_url: str, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "version, consecutive_failures, priority) VALUES "
                "('hourly', 'recurring', now() - interval '90 minutes', false, 1, 0, 0)"
            )
        )
    assert (await cli("--url", database_url, "pause", "hourly", "--reason", "r")).code == 0
    needs = await cli("--url", database_url, "resume", "hourly", "--skip-missed")
    assert needs.code == 2 and "--schedule 'FIXED_RATE|PT1H'" in needs.stderr
    skipped = await cli(
        "--url", database_url, "--json", "resume", "hourly", "--skip-missed",
        "--schedule", "FIXED_RATE|PT1H",
    )  # fmt: skip
    assert skipped.code == 0, skipped.stderr
    assert skipped.json["resumed"] is True and skipped.json["next_execution_time"]
    async with engine.connect() as conn:
        moved = (
            await conn.execute(text("SELECT execution_time > now() FROM scheduled_tasks"))
        ).scalar_one()
    assert moved
