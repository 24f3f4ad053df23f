"""The example's jobs; found by ``@distributed_job`` discovery, built with their providers."""

from __future__ import annotations

import logging
from datetime import time
from typing import Annotated

from fastapi import Depends
from pydantic import BaseModel, Field

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    OneTimeJob,
    Schedule,
    Schedules,
    distributed_job,
)

from .config import ExampleSettings, get_example_settings
from .services import (
    CleanupService,
    DemoLedger,
    ReportService,
    get_cleanup_service,
    get_ledger,
    get_report_service,
)

log = logging.getLogger(__name__)


@distributed_job
class DailyReportJob(DistributedJob):
    """Ekbatan's example job: once a day at 02:00 UTC, on one instance of the cluster."""

    def __init__(
        self, report_service: Annotated[ReportService, Depends(get_report_service)]
    ) -> None:
        self.report_service = report_service

    def name(self) -> str:
        return "daily-report"  # cluster-wide unique

    def schedule(self) -> Schedule:
        return Schedules.daily(time(2, 0))

    async def execute(self, ctx: ExecutionContext) -> None:
        await self.report_service.generate_and_send()


@distributed_job
class HourlyCleanupJob(DistributedJob):
    """At the top of every hour."""

    def __init__(
        self, cleanup_service: Annotated[CleanupService, Depends(get_cleanup_service)]
    ) -> None:
        self.cleanup_service = cleanup_service

    def name(self) -> str:
        return "hourly-cleanup"

    def schedule(self) -> Schedule:
        return Schedules.cron("0 * * * *")

    async def execute(self, ctx: ExecutionContext) -> None:
        await self.cleanup_service.cleanup()


@distributed_job
class DemoJob(DistributedJob):
    """Every few seconds (``EXAMPLE_DEMO_INTERVAL``): logs and records who ran the slot."""

    def __init__(
        self,
        ledger: Annotated[DemoLedger, Depends(get_ledger)],
        settings: Annotated[ExampleSettings, Depends(get_example_settings)],
    ) -> None:
        self.ledger = ledger
        self.interval = settings.demo_interval

    def name(self) -> str:
        return "demo"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(self.interval)

    async def execute(self, ctx: ExecutionContext) -> None:
        await self.ledger.record(ctx.task_name, ctx.execution_time, ctx.picked_by)
        log.info(
            "demo: slot %s ran on instance %s",
            ctx.execution_time.isoformat(timespec="milliseconds"),
            ctx.picked_by,
        )


class Note(BaseModel):
    """What ``POST /demo/notes`` takes and the ``demo-note`` job gets (``ctx.data``)."""

    text: str = Field(min_length=1, max_length=500)


@distributed_job
class NoteJob(OneTimeJob[Note]):
    """A one-time job a route schedules (``POST /demo/notes``): runs once, on one instance."""

    def name(self) -> str:
        return "demo-note"

    async def execute(self, ctx: ExecutionContext[Note]) -> None:
        log.info("demo-note %s: %r", ctx.task_instance, ctx.data.text)
