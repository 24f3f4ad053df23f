"""``ekbatan-jobs schedules list|create|update|delete|pause|resume`` against a real database."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from .conftest import Database
from .test_cli import cli, target

pytestmark = pytest.mark.multiprocess


async def test_schedule_verbs(any_database: Database, any_engine: AsyncEngine) -> None:
    url = target(any_database)
    made = await cli(
        *url, "--json", "schedules", "create", "digest", "user-42",
        "--schedule", "DAILY|07:30|Europe/Berlin", "--data", '{"user_id": 42}', "--max-runs", "9",
    )  # fmt: skip
    assert made.code == 0, made.stderr
    assert made.json["schedule"] == "DAILY|07:30|Europe/Berlin"
    assert made.json["data"] == {"user_id": 42} and made.json["max_runs"] == 9
    again = await cli(*url, "schedules", "create", "digest", "user-42", "--schedule", "DAILY|08:00")
    assert again.code == 6 and "--replace" in again.stderr
    bad = await cli(*url, "schedules", "create", "digest", "x", "--schedule", "WEEKLY|mon")
    assert bad.code == 2 and "WEEKLY" in bad.stderr

    updated = await cli(
        *url, "--json", "schedules", "update", "digest", "user-42",
        "--schedule", "CRON|0 8 * * 1-5|Europe/Berlin",
    )  # fmt: skip
    assert updated.code == 0, updated.stderr
    assert updated.json["schedule"] == "CRON|0 8 * * 1-5|Europe/Berlin"
    assert updated.json["data"] == {"user_id": 42}

    paused = await cli(*url, "schedules", "pause", "digest", "user-42", "--reason", "holiday")
    assert paused.code == 0, paused.stderr
    listed = await cli(*url, "--json", "schedules", "list", "digest", "--state", "paused")
    assert [s["instance_id"] for s in listed.json["schedules"]] == ["user-42"]
    assert listed.json["schedules"][0]["paused"]["reason"] == "holiday"
    resumed = await cli(*url, "--json", "schedules", "resume", "digest", "user-42")
    assert resumed.code == 0 and resumed.json["resumed"] is True
    text = await cli(*url, "schedules", "list", "digest")
    assert "user-42" in text.stdout and "scheduled" in text.stdout
    found = await cli(*url, "--json", "schedules", "list", "digest", "--search", "USER-4")
    assert [s["instance_id"] for s in found.json["schedules"]] == ["user-42"]
    none = await cli(*url, "--json", "schedules", "list", "digest", "--search", "user_4")
    assert none.json["schedules"] == []  # "_" is itself, not any character
    long = await cli(*url, "schedules", "list", "digest", "--search", "x" * 101)
    assert long.code == 2 and "at most 100 characters" in long.stderr

    deleted = await cli(*url, "schedules", "delete", "digest", "user-42")
    assert deleted.code == 0, deleted.stderr
    gone = await cli(*url, "schedules", "delete", "digest", "user-42")
    assert gone.code == 3
    missing = await cli(*url, "schedules", "update", "digest", "nobody", "--data", "{}")
    assert missing.code == 3 and "create_schedule" in missing.stderr
