"""The cluster's cleanups run on one instance at a time (issue 28, item 6): the longest-running
live instance leads; the others decline; when the leader stops, the next one leads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ekbatan_fastapi import DistributedJob, ExecutionContext, Schedules, distributed_job
from ekbatan_fastapi.domain.rows import InstanceInfo
from ekbatan_fastapi.engine.maintenance import leader_of

from .conftest import Database
from .helpers import RegistryFactory, wait_until


@distributed_job
class Tick(DistributedJob):
    def name(self) -> str:
        return "maintenance-tick"

    def schedule(self) -> Schedules:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        return None


def _instance(name: str, started: int, alive: bool = True) -> InstanceInfo:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=started)
    return InstanceInfo(name, "h", 1, at, at, "0", alive)


def test_the_longest_running_live_instance_leads() -> None:
    assert leader_of([]) is None
    assert leader_of([_instance("b", 2), _instance("a", 3), _instance("c", 1, alive=False)]) == "b"
    assert leader_of([_instance("b", 2), _instance("a", 2)]) == "a"  # ties by name
    assert leader_of([_instance("x", 1, alive=False)]) is None


async def test_one_instance_maintains_and_the_next_takes_over_when_it_stops(
    any_database: Database, any_registries: RegistryFactory
) -> None:
    first = await any_registries.start(Tick(), customize=lambda b: b.scheduler_name("m-first"))
    one = first.scheduler.maintenance
    await wait_until(lambda: one.rounds == 1, what="the first instance's maintenance round")
    assert one.leading is True

    second = await any_registries.start(Tick(), customize=lambda b: b.scheduler_name("m-second"))
    two = second.scheduler.maintenance
    await wait_until(lambda: two.leading is not None, what="the second instance's decision")
    assert two.leading is False and two.rounds == 0  # the first leads: nothing done twice

    await first.stop()  # a graceful stop removes its instance row: the second leads now
    assert await two.step()
    assert two.leading is True and two.rounds == 1
