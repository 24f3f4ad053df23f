"""A module named in ``ekbatan.jobs.modules`` by the discovery test; imported only by it."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import Depends

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedule, Schedules, distributed_job
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import get_ekbatan_settings


@distributed_job
class DiscoveredBySettingsJob(DistributedJob):
    """Receives the lifespan's settings through the ``get_ekbatan_settings`` provider."""

    def __init__(self, settings: Annotated[EkbatanSettings, Depends(get_ekbatan_settings)]):
        self.settings = settings
        self.runs = 0

    def name(self) -> str:
        return "discovered-by-settings"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=50))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs += 1
