"""The example of docs/testing.md (tests/test_jobs.py there): a job with a replaced provider."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from ekbatan_fastapi.testing import TimeMachine, build_jobs, run_job

from .docs_example_jobs import Mailer, app, get_mailer

pytest_plugins = ["ekbatan_fastapi.testing.pytest_plugin"]

NIGHT = datetime(2026, 3, 11, 2, 0, tzinfo=UTC)


class FakeMailer(Mailer):
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def send(self, to: str, subject: str) -> None:
        self.sent.append((to, subject))


@pytest.fixture
def mailer() -> Iterator[FakeMailer]:
    fake = FakeMailer()
    app.dependency_overrides[get_mailer] = lambda: fake
    yield fake
    app.dependency_overrides.clear()


async def test_the_report_mails_the_day_of_its_slot(mailer: FakeMailer) -> None:
    async with build_jobs(app) as jobs:
        await run_job(jobs["daily-report"], execution_time=NIGHT)
    assert mailer.sent == [("ops@example.com", "report for 2026-03-11")]


async def test_a_stopping_instance_leaves_the_report(mailer: FakeMailer) -> None:
    async with build_jobs(app) as jobs:
        await run_job(jobs["daily-report"], execution_time=NIGHT, shutting_down=True)
    assert mailer.sent == []


async def test_the_report_runs_once_at_two(mailer: FakeMailer, ekbatan_database_url: str) -> None:
    start = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    async with (
        build_jobs(app) as jobs,
        TimeMachine(jobs.values(), ekbatan_database_url, start=start) as tm,
    ):
        assert await tm.run_due() == []  # nothing is due at noon
        await tm.advance(to=NIGHT)
        ran = await tm.run_due()
        assert [(r.task_name, r.execution_time) for r in ran] == [("daily-report", NIGHT)]
        assert await tm.run_due() == []  # and only once
    assert mailer.sent == [("ops@example.com", "report for 2026-03-11")]
