"""db-scheduler's ClusterTest: two schedulers, 10,000 one-time instances, each runs once."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import PollingStrategy

from .helpers import CountingJob, RegistryFactory, wait_until

N = 10_000


async def _insert_due(engine: AsyncEngine, task: str, n: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "version, priority) SELECT :task, 'i' || g, now(), false, 1, 0 "
                "FROM generate_series(1, :n) AS g"
            ),
            {"task": task, "n": n},
        )


async def _remaining(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM scheduled_tasks"))).scalar_one())


@pytest.mark.parametrize("strategy", PollingStrategy.ALL)
async def test_two_schedulers_execute_10000_instances_exactly_once(
    registries: RegistryFactory, engine: AsyncEngine, strategy: str
) -> None:
    await _insert_due(engine, "count", N)
    first, second = CountingJob(), CountingJob()
    for job in (first, second):
        await registries.start(job, customize=lambda b: b.polling_strategy(strategy))

    async def drained() -> bool:
        return await _remaining(engine) == 0

    await wait_until(drained, timeout=120, what="all instances executed")
    runs = first.runs + second.runs
    assert len(runs) == N
    duplicates = {k: v for k, v in runs.items() if v != 1}
    assert duplicates == {}
    assert first.runs and second.runs, "both schedulers took part"
    for registry in registries.made:
        assert registry.scheduler.running == {}
        assert registry.status().loop_restarts == 0
