"""The services the example's jobs need, and the providers that build them.

The providers are ordinary FastAPI dependencies: the lifespan resolves them once per
application when it builds the jobs, and a test can replace any of them with
``app.dependency_overrides``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    MetaData,
    String,
    Table,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ConnectionProvider
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import get_ekbatan_settings

log = logging.getLogger(__name__)

demo_metadata = MetaData()
demo_runs = Table(
    "demo_runs",
    demo_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("task_name", String(100), nullable=False),
    Column("slot", DateTime(timezone=True), nullable=False, index=True),
    Column("instance", String(100), nullable=False),
    Column("ran_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""Every execution of the demo job: a ledger that shows one run per slot."""


def app_database_url(settings: EkbatanSettings) -> URL:
    """The application's database: the ``primary-config`` slot, else the jobs database."""
    members = settings.sharding.groups[0].members if settings.sharding.groups else []
    primary = members[0].config_for("primary_config") if members else None
    return (primary or settings.jobs_datasource()).sqlalchemy_url()


class DemoLedger:
    """Reads and writes ``demo_runs``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def record(self, task_name: str, slot: datetime, instance: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(demo_runs).values(task_name=task_name, slot=slot, instance=instance)
            )

    async def summary(self, limit: int = 20) -> dict[str, Any]:
        """Runs per instance, slots run more than once (should be 0), the latest runs."""
        async with self.engine.connect() as conn:
            per_instance = await conn.execute(
                select(demo_runs.c.instance, func.count()).group_by(demo_runs.c.instance)
            )
            repeated = (
                select(demo_runs.c.slot)
                .group_by(demo_runs.c.slot)
                .having(func.count() > 1)
                .subquery()
            )
            duplicates = (
                await conn.execute(select(func.count()).select_from(repeated))
            ).scalar_one()
            recent = await conn.execute(
                select(demo_runs.c.slot, demo_runs.c.instance, demo_runs.c.ran_at)
                .order_by(demo_runs.c.slot.desc())
                .limit(limit)
            )
            by_instance = {str(name): int(count) for name, count in per_instance}
            return {
                "total": sum(by_instance.values()),
                "by_instance": by_instance,
                "slots_run_more_than_once": int(duplicates or 0),
                "recent": [dict(row._mapping) for row in recent],
            }

    async def count_since(self, since: timedelta) -> dict[str, int]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(demo_runs.c.instance, func.count())
                .where(demo_runs.c.ran_at > func.now() - since)
                .group_by(demo_runs.c.instance)
            )
            return {str(name): int(count) for name, count in rows}

    async def delete_older_than(self, age: timedelta) -> int:
        async with self.engine.begin() as conn:
            result = await conn.execute(
                delete(demo_runs).where(demo_runs.c.ran_at < func.now() - age)
            )
            return int(result.rowcount)


class ReportService:
    """The example's ReportService: here it summarizes the last day of demo runs."""

    def __init__(self, ledger: DemoLedger) -> None:
        self.ledger = ledger

    async def generate_and_send(self) -> None:
        counts = await self.ledger.count_since(timedelta(days=1))
        log.info("daily report: demo runs in the last 24 h per instance: %s", counts or "none")


class CleanupService:
    """Deletes demo runs older than a day."""

    def __init__(self, ledger: DemoLedger, keep: timedelta = timedelta(days=1)) -> None:
        self.ledger = ledger
        self.keep = keep

    async def cleanup(self) -> int:
        deleted = await self.ledger.delete_older_than(self.keep)
        log.info("hourly cleanup: deleted %d demo runs older than %s", deleted, self.keep)
        return deleted


async def get_ledger(
    settings: Annotated[EkbatanSettings, Depends(get_ekbatan_settings)],
) -> AsyncIterator[DemoLedger]:
    """A generator provider: its engine is disposed at shutdown, after the jobs stopped."""
    # Built as the library's own pool (PgBouncer's transaction pooling, a connect timeout per
    # host, a bounded close), from the same settings.
    pool = ConnectionProvider.from_url(
        app_database_url(settings), pool_size=2, pooler=settings.jobs.pooler
    )
    try:
        yield DemoLedger(pool.engine)
    finally:
        await pool.dispose()


def get_report_service(ledger: Annotated[DemoLedger, Depends(get_ledger)]) -> ReportService:
    return ReportService(ledger)


def get_cleanup_service(ledger: Annotated[DemoLedger, Depends(get_ledger)]) -> CleanupService:
    return CleanupService(ledger)
