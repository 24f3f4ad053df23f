"""Jobs for the ``ekbatan-jobs plan`` tests (imported by the CLI with ``--jobs``)."""

from __future__ import annotations

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
