"""``backfill``: run each slot of a recurring job's schedule in a window once more, as one-time
rows of the job (``task_instance = backfill:<slot>``, see ``domain.backfill``), on whichever
instance claims them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ..domain.backfill import backfill_instance, backfill_slots
from ..domain.errors import TaskPausedError, UnknownJobError
from ..domain.job import DistributedJob, schedule_of
from ..domain.rows import NewTask
from ..domain.schedules import Schedule, parse_schedule
from ..domain.tasks import paused_message
from ..domain.text import validate_name

if TYPE_CHECKING:
    from .client import SchedulerClient

__all__ = ["BackfillResult", "backfill"]


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What a backfill asked for."""

    job_name: str
    slots: list[datetime]
    """Every slot of the window, oldest first."""
    inserted: int
    """Rows inserted now; the others were already waiting (asked for before)."""


async def backfill(
    client: SchedulerClient,
    job_name: str,
    start: datetime,
    end: datetime,
    *,
    force: bool = False,
    force_hint: str = "force=True",
) -> BackfillResult:
    """Insert one row per slot of ``job_name``'s schedule in ``[start, end)``; each runs once,
    with ``ctx.execution_time`` = its slot. A paused job raises TaskPausedError unless
    ``force`` (the rows then wait until it is resumed)."""
    validate_name(job_name, "job name")
    schedule = await _schedule(client, job_name)
    slots = backfill_slots(schedule, start, end)
    if not force:
        pause = (await client.paused()).get(job_name)
        if pause is not None:
            raise TaskPausedError(paused_message(job_name, pause, force_hint))
    tasks = client.store.tasks
    inserted = 0
    for first in range(0, len(slots), 1000):
        rows = [
            NewTask(job_name, backfill_instance(slot), None) for slot in slots[first : first + 1000]
        ]
        inserted += len(await tasks.insert_missing(rows))
    if inserted:
        await client.wake_cluster()
    return BackfillResult(job_name, slots, inserted)


async def _schedule(client: SchedulerClient, job_name: str) -> Schedule:
    """The job's schedule: as registered here, else as the cluster stored it."""
    job = client.jobs.get(job_name)
    if isinstance(job, DistributedJob):
        return schedule_of(job)
    if job is not None:
        raise UnknownJobError(
            f"{job_name!r} is a one-time job: backfill runs the slots of a recurring job's "
            "schedule; schedule its instances with schedule()"
        )
    stored = (await client.job_definitions()).get(job_name)
    if stored is None or stored.schedule is None:
        raise UnknownJobError(
            f"no recurring job named {job_name!r} is registered here or stored in the job "
            "definitions (ekbatan_jobs); backfill needs its schedule"
        )
    return parse_schedule(stored.schedule).bind(job_name)
