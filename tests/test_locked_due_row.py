"""A due row that a poll finds locked by someone else is looked at again soon, not a polling
interval later.

On MySQL/MariaDB a ``FOR UPDATE SKIP LOCKED`` poll skips a row that any other transaction
holds locked, and InnoDB locks every row a locking scan merely checks: a peer's poll a moment
before the slot, finding the row not yet due, is enough to hide it from the poll at the slot.
Three processes on a 200 ms fixed-rate job missed one slot in five that way before the poller
learned to look again (``tests/test_processes.py``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules

from .helpers import RecordingJob, RegistryFactory, db_now


async def test_a_due_row_held_locked_at_its_slot_runs_soon_after_the_lock_goes(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = RecordingJob("held", Schedules.cron("0 0 1 1 *"))
    poll = 30.0  # far longer than the test: a slot left to the next poll would time it out
    registry = await any_registries.start(job, poll=poll)
    slot = await db_now(any_engine) + timedelta(seconds=0.5)
    await registry.client.reschedule("held", "recurring", slot)  # the scheduler plans the slot
    async with any_engine.connect() as holder:
        async with holder.begin():  # a peer's transaction holds the row across the slot
            await holder.execute(
                text("SELECT version FROM scheduled_tasks WHERE task_name = 'held' FOR UPDATE")
            )
            held = slot + timedelta(seconds=0.3) - await db_now(any_engine)
            await asyncio.sleep(held.total_seconds())
            assert job.slots == [], "ran while another transaction held the row"
        released = await db_now(any_engine)
    await asyncio.wait_for(job.started.wait(), timeout=5)
    assert job.slots == [slot]
    late = (await db_now(any_engine) - released).total_seconds()
    # The retries back off from 5 ms; the next poll would have come 30 s later.
    assert late < 2, f"ran {late:.2f}s after the lock went"
