"""A forced run of a paused task from outside the application (``ekbatan-jobs run-now
--force``, or a client without a local scheduler that has the job): lift the pause until some
instance claims the row, then put it back exactly as it was."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..domain.errors import RunNotClaimedError
from ..domain.rows import PauseInfo

if TYPE_CHECKING:
    from .client import SchedulerClient

__all__ = ["forced_elsewhere"]

_CLAIM_POLL = 0.05
"""Seconds between looks for a claim."""


async def forced_elsewhere(
    client: SchedulerClient, job_name: str, instance_id: str, pause: PauseInfo, wait: float
) -> str:
    """Lift the pause, make the row due now (a notification wakes PostgreSQL instances at
    once), and put the pause back, with its original who / when / why, as soon as the row's
    version shows a claim, or after ``wait`` seconds. The pause is put back whatever happens,
    including cancellation. Returns who claimed the run."""
    store = client.store
    where = f"{job_name}/{instance_id}"
    # Read while the pause still holds every claim off: the reschedule bumps this version by
    # one, and any claim after it bumps it again. (Read after the reschedule, the row could
    # already show a claim and its completion, and no later change would come to wait for.)
    before = await store.tasks.get(job_name, instance_id)
    await store.operations.resume(job_name)
    try:
        await client.reschedule(job_name, instance_id, None)
        rescheduled = None if before is None else before.version + 1
        claimed_by = await _claimed(client, job_name, instance_id, rescheduled, wait)
    finally:
        await asyncio.shield(store.operations.restore_pause(pause))
    if claimed_by is None:
        raise RunNotClaimedError(
            f"no instance claimed {where} within {wait:g} s (is an application with this "
            "job running?); it stays paused, and due now: it runs when resumed"
        )
    return claimed_by


async def _claimed(
    client: SchedulerClient,
    job_name: str,
    instance_id: str,
    rescheduled: int | None,
    wait: float,
) -> str | None:
    """Who claimed the row after the reschedule left it at version ``rescheduled``."""
    finished = "an instance (the run already finished)"
    if rescheduled is None:
        return finished  # a one-time instance is deleted
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while loop.time() < deadline:
        now = await client.store.tasks.get(job_name, instance_id)
        if now is None:
            return finished
        if now.version > rescheduled or now.picked:
            return now.picked_by or finished
        await asyncio.sleep(_CLAIM_POLL)
    return None
