"""Jobs for the ``ekbatan-jobs plan`` tests (imported by the CLI with ``--jobs``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules


class Rolling(DistributedJob):
    def __init__(self, schedule: str, name: str = "rolling") -> None:
        self._schedule = Schedules.parse_schedule(schedule)
        self._name = name

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return self._schedule

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


A = "CRON|0 0 1 1 *"
B = "CRON|0 0 1 7 *"
JOBS_A = [Rolling(A)]
JOBS_B = [Rolling(B), Rolling("CRON|0 0 * * *", name="new-nightly")]


def jobs_b() -> list[DistributedJob]:
    return list(JOBS_B)


async def rolling_row(engine: AsyncEngine) -> tuple[datetime, int]:
    """The ``rolling`` task's row: its execution time and its version."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT execution_time, version FROM scheduled_tasks "
                    "WHERE task_name = 'rolling'"
                )
            )
        ).one()
    return row[0], row[1]
