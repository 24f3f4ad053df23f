"""One rule for durations (issue 33 part 3 item 5): whatever Ekbatan shows is ISO-8601, as the
settings are written (the start-up log said ``polling every 0:00:10`` where the settings say
``PT10S``); what a user writes is ISO-8601 too, except that db-scheduler's own schedule
strings also take its ``<N>s`` (``FIXED_DELAY|120s``), which Ekbatan reads and never writes."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta

import pytest

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.domain.schedules import FixedDelay, FixedRate, parse_schedule
from ekbatan_fastapi.settings import EkbatanSettings

from .helpers import RegistryFactory, wait_until

TIMEDELTA_TEXT = re.compile(r"(?<![T\d:])\d+:\d{2}:\d{2}|\bday(s)?, ")
"""``str(timedelta)``: ``0:00:10``, ``1 day, 2:00:00`` (an ISO datetime has a ``T`` first)."""


class Slow(DistributedJob):
    """Runs past its timeout: the timeout's warning and its error name the timeout."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    def name(self) -> str:
        return "slow"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    def timeout(self) -> timedelta:
        return timedelta(milliseconds=50)

    async def execute(self, ctx: ExecutionContext) -> None:
        self.started.set()
        await asyncio.sleep(30)


async def test_the_library_logs_durations_in_iso_8601(
    registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ekbatan_fastapi")
    job = Slow()
    registry = await registries.start(job, poll=0.2, heartbeat=0.1)

    async def timed_out() -> bool:
        return any(r.outcome == "timed_out" for r in await registry.client.history("slow"))

    await wait_until(timed_out, what="the timed-out execution's record")
    (record,) = [r for r in await registry.client.history("slow") if r.outcome == "timed_out"]
    assert record.error_message is not None and "timeout of PT0.05S" in record.error_message
    await registries.close()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("ekbatan_fastapi")]
    starting = next(m for m in messages if " starting: " in m)
    assert "polling every PT0.2S, heartbeat PT0.1S x 10" in starting, starting
    assert any("past its timeout of PT0.05S" in m for m in messages), messages
    shown = [m for m in messages if TIMEDELTA_TEXT.search(m)]
    assert not shown, shown


def test_db_schedulers_seconds_are_read_in_schedule_strings_and_never_written() -> None:
    assert parse_schedule("FIXED_DELAY|120s") == FixedDelay(timedelta(minutes=2))
    assert parse_schedule("FIXED_RATE|10s") == FixedRate(timedelta(seconds=10))
    assert parse_schedule("FIXED_DELAY|120s").describe() == "FIXED_DELAY|PT2M"
    assert parse_schedule("FIXED_RATE|10s").describe() == "FIXED_RATE|PT10S"


def test_settings_take_iso_8601_only() -> None:
    with pytest.raises(ConfigurationError) as raised:
        EkbatanSettings(jobs={"polling-interval": "10s"})
    assert "'10s' is not an ISO-8601 duration; write PT10S" in str(raised.value)
