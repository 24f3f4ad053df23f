"""The application of docs/testing.md's example (app/jobs.py there)."""

from __future__ import annotations

from datetime import time
from typing import Annotated

from fastapi import Depends, FastAPI

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules
from ekbatan_fastapi.web import create_ekbatan_lifespan


class Mailer:
    """Sends e-mail through the company's SMTP relay."""

    async def send(self, to: str, subject: str) -> None:
        raise RuntimeError("no SMTP relay here")


def get_mailer() -> Mailer:
    return Mailer()


class DailyReport(DistributedJob):
    def __init__(self, mailer: Annotated[Mailer, Depends(get_mailer)]) -> None:
        self.mailer = mailer

    def name(self) -> str:
        return "daily-report"

    def schedule(self) -> Schedule:
        return Schedules.daily(time(2, 0))

    async def execute(self, ctx: ExecutionContext) -> None:
        day = ctx.execution_time.date().isoformat()
        if ctx.is_shutting_down:
            return  # the next instance to start sends it
        await self.mailer.send("ops@example.com", f"report for {day}")


app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[DailyReport], discover=False))
