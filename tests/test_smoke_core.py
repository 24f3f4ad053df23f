from __future__ import annotations

from datetime import timedelta

from ekbatan_fastapi import Schedules

from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until


async def test_recurring_job_runs_repeatedly(registries: RegistryFactory) -> None:
    job = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    await registries.start(job)
    await wait_until(lambda: len(job.slots) >= 3, what="three runs")


async def test_one_time_instances_run_once(registries: RegistryFactory) -> None:
    job = CountingJob()
    registry = await registries.start(job)
    for i in range(20):
        await registry.client.schedule("count", f"i{i}", data={"n": i})
    await wait_until(lambda: len(job.runs) == 20, what="20 instances")
    assert set(job.runs.values()) == {1}
    assert job.data["i7"] == {"n": 7}
    await wait_until(lambda: registry.scheduler.running == {}, what="all recorded")
    assert await registry.client.list() == []
