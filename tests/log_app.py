"""Small applications the logging tests run under a real ``uvicorn`` process."""

from __future__ import annotations

from datetime import timedelta

from fastapi import FastAPI

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules
from ekbatan_fastapi.web import create_ekbatan_lifespan


class Greet(DistributedJob):
    """Fails every run, as a job with a bug does."""

    def name(self) -> str:
        return "greet"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=200))

    async def execute(self, ctx: ExecutionContext) -> None:
        raise RuntimeError("greeting failed")


app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[Greet()], discover=False))
"""One failing job."""

empty = FastAPI(lifespan=create_ekbatan_lifespan(discover=False))
"""No job at all: what forgetting EKBATAN_JOBS__MODULES gives."""
