"""Revival at the end of the dead window, not at the next housekeeping round after it."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules

from .helpers import RecordingJob, RegistryFactory, db_now, is_mysql, wait_until


async def test_a_dead_peer_execution_is_revived_when_its_dead_window_ends(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    job = RecordingJob("far", Schedules.cron("0 0 1 1 *"))
    heartbeat = 0.75  # dead window 4 x 0.75 = 3 s; housekeeping rounds 0.75 s apart
    registry = await any_registries.start(
        job,
        heartbeat=heartbeat,
        customize=lambda b: b.missed_heartbeats_limit(4),
    )
    now = "UTC_TIMESTAMP(6)" if is_mysql(any_engine) else "now()"
    picked = "1" if is_mysql(any_engine) else "true"
    async with any_engine.begin() as conn:  # a peer claimed it, heartbeat now, then died
        await conn.execute(
            text(
                f"UPDATE scheduled_tasks SET picked = {picked}, picked_by = 'ghost', "
                f"last_heartbeat = {now}, version = version + 1 WHERE task_name = 'far'"
            )
        )
    # The moment it died is the heartbeat the row holds (a db_now() read after the commit came
    # 0.41 s later once, on a loaded CI machine).
    ghost = await registry.client.get("far", "recurring")
    assert ghost is not None and ghost.last_heartbeat is not None
    died = ghost.last_heartbeat
    dead_after = registry.config.dead_after
    # The next housekeeping round sees the row and plans a check for the moment it dies.
    await wait_until(
        lambda: registry.scheduler.housekeeper.next_death is not None,
        timeout=3,
        what="the death planned",
    )
    planned = registry.scheduler.housekeeper.next_death
    assert planned is not None
    assert abs((planned - (died + dead_after)).total_seconds()) < 0.1

    async def revived() -> bool:
        row = await registry.client.get("far", "recurring")
        return row is not None and not row.picked

    await wait_until(revived, timeout=10, what="the revival")
    late = (await db_now(any_engine) - (died + dead_after)).total_seconds()
    # Without the planned check it would come at the first round after the window: up to
    # 0.75 s late. Allow for the event loop and statements of a loaded 2-core machine.
    assert -0.05 < late < 0.3, f"revived {late:.3f}s after the dead window ended"
    assert job.slots == [], "the slot is far in the future: revived, not run"
