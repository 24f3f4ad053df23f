"""Six-field cron expressions (issue 33 part 3 item 4): ``Schedules.cron("0 2 * * * *")`` (a
stray sixth field) silently meant "hourly at :02:00"; now six fields need ``seconds=True`` and
the error shows how they read and the five-field form. The string form (``CRON|...``,
db-scheduler's) keeps its rule: six fields are seconds first. An invalid cron in a job class
names the job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    Schedule,
    ScheduleError,
    Schedules,
    job_registry,
)
from ekbatan_fastapi.domain.schedules import parse_schedule
from ekbatan_fastapi.web import create_ekbatan_lifespan

from .fastapi_helpers import fast_settings, running

NOW = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)


def test_six_fields_without_seconds_true_are_refused_showing_how_they_read() -> None:
    with pytest.raises(ScheduleError) as raised:
        Schedules.cron("0 2 * * * *")
    assert str(raised.value) == (
        "cron expression '0 2 * * * *' has six fields, which read second 0, minute 2, hour *, "
        "day-of-month *, month *, weekday * (seconds first, as in db-scheduler): if that is "
        "meant, say so with seconds=True (Schedules.cron('0 2 * * * *', seconds=True)); a "
        "five-field cron is minute hour day-of-month month weekday, e.g. '0 2 * * *'"
    )


def test_seconds_true_needs_six_fields() -> None:
    for expression in ("0 2 * * *", "@daily"):
        with pytest.raises(ScheduleError, match="has no seconds field, but seconds=True"):
            Schedules.cron(expression, seconds=True)


def test_six_fields_with_seconds_true_and_the_string_form_read_seconds_first() -> None:
    explicit = Schedules.cron("30 0 2 * * *", seconds=True)
    parsed = parse_schedule("CRON|30 0 2 * * *")
    assert explicit == parsed
    assert explicit.initial_execution_time(NOW) == datetime(2026, 1, 1, 2, 0, 30, tzinfo=UTC)
    assert parsed.describe() == "CRON|30 0 2 * * *"
    assert parse_schedule(parsed.describe()) == parsed
    five = Schedules.cron("0 2 * * *")
    assert five.initial_execution_time(NOW) == datetime(2026, 1, 1, 2, 0, tzinfo=UTC)


class Nightly(DistributedJob):
    def __init__(self, expression: str) -> None:
        self.expression = expression

    def name(self) -> str:
        return "nightly-export"

    def schedule(self) -> Schedule:
        return Schedules.cron(self.expression)

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 2 * * * *", "has six fields, which read second 0, minute 2"),
        ("0 25 * * *", "25 in the hour field '25' is out of range"),
    ],
)
def test_an_invalid_cron_in_a_job_class_names_the_job(expression: str, message: str) -> None:
    builder = job_registry().connection_provider("postgresql+asyncpg://u@h/db")
    with pytest.raises(ScheduleError) as raised:
        builder.with_job(Nightly(expression)).build()
    assert str(raised.value).startswith("job 'nightly-export' (Nightly.schedule()): ")
    assert message in str(raised.value)


async def test_the_lifespan_refuses_it_naming_the_job(database_url: str) -> None:
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(
            settings=fast_settings(database_url), jobs=[Nightly("0 2 * * * *")], discover=False
        )
    )
    with pytest.raises(ScheduleError, match=r"^job 'nightly-export' \(Nightly.schedule\(\)\)"):
        async with running(app):
            pass  # pragma: no cover - the startup fails


def test_jitter_and_zones_keep_working_with_seconds() -> None:
    schedule = Schedules.cron("0 */5 * * * *", "Europe/Berlin", seconds=True)
    assert schedule.with_jitter(timedelta(seconds=30)).describe() == (
        "CRON|0 */5 * * * *|Europe/Berlin|JITTER=PT30S"
    )
