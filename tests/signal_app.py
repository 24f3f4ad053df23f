"""An application the gunicorn signal test serves: one job every 200 ms that logs each run,
so a scheduler still running after a signal shows in the log."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from fastapi import FastAPI

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules
from ekbatan_fastapi.web import create_ekbatan_lifespan

log = logging.getLogger("ekbatan_fastapi.tests.signal_app")  # shown by the library's handler


class Tick(DistributedJob):
    def name(self) -> str:
        return "tick"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(milliseconds=200))

    async def execute(self, ctx: ExecutionContext) -> None:
        log.warning("tick ran in pid %s", os.getpid())


app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[Tick()], discover=False))
