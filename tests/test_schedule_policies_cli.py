"""``ekbatan-jobs plan`` and ``ekbatan-jobs backfill`` against the test databases."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .conftest import Database
from .helpers import RegistryFactory, db_now, wait_until
from .plan_jobs import A, B, Rolling, rolling_row
from .test_cli import cli, target

pytestmark = pytest.mark.multiprocess

ROOT = str(Path(__file__).resolve().parent.parent)
ENV = {"PYTHONPATH": ROOT}


async def test_plan_shows_what_startup_would_change_and_changes_nothing(
    any_database: Database, any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    registry = await any_registries.start(Rolling(A), customize=lambda b: b.app_version("1"))
    await registry.stop()
    before = await rolling_row(any_engine)

    newer = await cli(
        *target(any_database),
        "--json",
        "plan",
        "--jobs",
        "tests.plan_jobs:jobs_b",
        "--app-version",
        "2",
        env=ENV,
    )
    assert newer.code == 0, newer.stderr
    changes = {c["job"]: c for c in newer.json["changes"]}
    assert changes["rolling"]["action"] == "reschedule"
    assert (changes["rolling"]["old_schedule"], changes["rolling"]["new_schedule"]) == (A, B)
    assert changes["rolling"]["next_before"] != changes["rolling"]["next_after"]
    assert "-07-01T00:00:00" in changes["rolling"]["next_after"]
    assert changes["new-nightly"]["action"] == "insert"
    assert await rolling_row(any_engine) == before, "plan changes nothing"

    older = await cli(
        *target(any_database),
        "--json",
        "plan",
        "--jobs",
        "tests.plan_jobs:JOBS_B",
        "--app-version",
        "0.9",
        env=ENV,
    )
    assert older.code == 0, older.stderr
    rolling = {c["job"]: c for c in older.json["changes"]}["rolling"]
    assert rolling["action"] == "adopt" and rolling["new_schedule"] == A
    assert "older version" in rolling["reason"]

    table = await cli(*target(any_database), "plan", "--jobs", "tests.plan_jobs:JOBS_A", env=ENV)
    assert table.code == 0 and "rolling" in table.stdout and "none" in table.stdout


async def test_plan_names_a_bad_jobs_spec(any_database: Database, any_engine: AsyncEngine) -> None:
    missing = await cli(*target(any_database), "plan", "--jobs", "tests.plan_jobs:NOPE", env=ENV)
    assert missing.code == 2 and "NOPE" in missing.stderr
    shape = await cli(*target(any_database), "plan", "--jobs", "tests.plan_jobs", env=ENV)
    assert shape.code == 2 and "MODULE:ATTRIBUTE" in shape.stderr
    wrong = await cli(*target(any_database), "plan", "--jobs", "tests.plan_jobs:A", env=ENV)
    assert wrong.code == 2 and "not jobs" in wrong.stderr


async def test_backfill_from_the_command_line_uses_the_stored_schedule(
    any_database: Database, any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    registry = await any_registries.start(Rolling("CRON|0 * * * *"))
    now = await db_now(any_engine)
    start = (now - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=2)
    result = await cli(
        *target(any_database),
        "--json",
        "backfill",
        "rolling",
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
    )
    assert result.code == 0, result.stderr
    assert result.json["inserted"] == 2 and len(result.json["slots"]) == 2

    async def ran() -> bool:
        return not await registry.client.backfill_counts()

    await wait_until(ran, what="the backfilled slots run by the application")
    naive = await cli(
        *target(any_database),
        "backfill",
        "rolling",
        "--start",
        "2026-11-30T00:00",
        "--end",
        end.isoformat(),
    )
    assert naive.code == 2 and "needs a zone" in naive.stderr
    unknown = await cli(
        *target(any_database),
        "backfill",
        "nope",
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
    )
    assert unknown.code == 3 and "no recurring job named 'nope'" in unknown.stderr


async def test_resume_skip_missed_finds_the_stored_schedule(
    any_database: Database, any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    registry = await any_registries.start(Rolling("FIXED_RATE|PT1H"))
    await registry.stop()
    async with any_engine.begin() as conn:
        await conn.execute(
            text("UPDATE scheduled_tasks SET execution_time = :t WHERE task_name = 'rolling'"),
            {"t": (await db_now(any_engine) - timedelta(minutes=90)).replace(tzinfo=None)},
        )
    assert (await cli(*target(any_database), "pause", "rolling", "--reason", "r")).code == 0
    resumed = await cli(*target(any_database), "--json", "resume", "rolling", "--skip-missed")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json["resumed"] is True and resumed.json["next_execution_time"]
