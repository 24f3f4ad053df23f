"""Failover at the speed of the crash (issue #31) and fast takeover of recurring jobs (issue
#32), across OS processes on every available database: a SIGKILLed owner's execution is revived
through its free liveness lock long before the dead window, a survivor takes over a dead
peer's 1-second slots long before its polling interval, and a database-wide session drop
revives nothing. The bounds are event waits far below the windows the old behaviour needed
(dead window 40 s, polling interval 30 s), not performance figures: those are in
bench/failover.py and bench/owner_death_peers.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import scheduled_tasks
from ekbatan_fastapi.domain.rows import NewTask
from ekbatan_fastapi.engine.liveness import LOOK_EVERY, look_pause
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.liveness import LIVENESS_MARK, liveness_locks

from .conftest import Database
from .helpers import Worker, db_now, wait_until
from .proc_worker import LEDGERS, ledger, starts

pytestmark = pytest.mark.slow

HEARTBEAT = "10"
"""Seconds: with 4 missed heartbeats the dead window is 40 s."""


def _args(database: Database, *more: str) -> list[str]:
    override = ["--dialect", database.override] if database.override else []
    return ["--heartbeat", HEARTBEAT, *override, *more]


async def _starts(engine: AsyncEngine) -> list[tuple[object, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(starts.c.slot, starts.c.pid).order_by(starts.c.started))
        return [(r[0], r[1]) for r in rows]


async def _declared(engine: AsyncEngine, pids: int) -> bool:
    """``pids`` instances declare their liveness lock in their instance rows."""
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT library_version FROM ekbatan_scheduler_instances"))
        return sum(1 for r in rows if str(r[0]).endswith(LIVENESS_MARK)) >= pids


async def test_a_killed_owners_execution_is_revived_through_its_free_lock(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[starts])
    first = await Worker.start("long", any_database.url, *_args(any_database))
    second: Worker | None = None
    try:
        await wait_until(lambda: _count(_starts(any_engine), 1), timeout=15, what="first run")
        second = await Worker.start("long", any_database.url, *_args(any_database))
        await wait_until(lambda: _declared(any_engine, 2), timeout=15, what="both declared")
        killed = time.monotonic()
        await first.kill()
        await wait_until(
            lambda: _count(_starts(any_engine), 2),
            timeout=20,
            what="revival (dead: 40 s)",
        )
        print(f"revived {time.monotonic() - killed:.2f} s after the kill")
        runs = await _starts(any_engine)
    finally:
        await first.kill()
        if second is not None:
            await second.stop()
    assert [pid for _, pid in runs] == [first.pid, second.pid]
    assert runs[0][0] == runs[1][0], "the revived run keeps its slot"


async def test_an_owner_without_a_lock_waits_for_the_dead_window(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """``liveness_lock: off`` (or db-scheduler, an older Ekbatan): no declaration, so its
    free lock means nothing and its executions are not revived before the dead window."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[starts])
    first = await Worker.start(
        "long", any_database.url, *_args(any_database, "--liveness-lock", "off")
    )
    second: Worker | None = None
    try:
        await wait_until(lambda: _count(_starts(any_engine), 1), timeout=15, what="first run")
        second = await Worker.start("long", any_database.url, *_args(any_database))
        await wait_until(lambda: _declared(any_engine, 1), timeout=15, what="declared")
        await first.kill()
        with pytest.raises(AssertionError, match="timed out"):
            await wait_until(lambda: _count(_starts(any_engine), 2), timeout=4, what="revival")
    finally:
        await first.kill()
        if second is not None:
            await second.stop()


async def test_a_session_drop_revives_nothing_and_liveness_resumes(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Every session of the database dropped at once (a restart, a failover): the owners take
    their locks again, nobody is revived; a later death is still found by its free lock."""
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[starts])
    first = await Worker.start("long", any_database.url, *_args(any_database))
    second: Worker | None = None
    try:
        await wait_until(lambda: _count(_starts(any_engine), 1), timeout=15, what="first run")
        second = await Worker.start("long", any_database.url, *_args(any_database))
        await wait_until(lambda: _declared(any_engine, 2), timeout=15, what="both declared")
        for _ in range(2):  # twice, half a second apart: the peers' two looks
            await _drop_sessions(any_engine, any_database)
            await asyncio.sleep(0.5)
        with pytest.raises(AssertionError, match="timed out"):
            await wait_until(lambda: _count(_starts(any_engine), 2), timeout=4, what="revival")
        await first.kill()
        await wait_until(
            lambda: _count(_starts(any_engine), 2), timeout=30, what="the revival after the drop"
        )
        runs = await _starts(any_engine)
    finally:
        await first.kill()
        if second is not None:
            await second.stop()
    assert [pid for _, pid in runs] == [first.pid, second.pid]


async def test_a_survivor_takes_over_a_dead_peers_recurring_slots(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """Two processes share a 1-second job; the one that ran the latest slot is SIGKILLed. The
    survivor, which lost the claim races, knows the held row's next slot and runs it: long
    before its polling interval (30 s here), and every slot at most once (``slot`` is the
    ledger's primary key: a second run of a slot fails its execution)."""
    if any_database.dialect == "mysql5":
        pytest.skip(
            "MySQL 5.7's fetch strategy reports no held rows (docs/robustness.md): a survivor "
            "there takes over at its next poll"
        )
    async with any_engine.begin() as conn:
        await conn.run_sync(LEDGERS.create_all, tables=[ledger])
    args = _args(any_database, "--period", "1.0", "--poll", "30")
    workers = [await Worker.start("slots", any_database.url, *args) for _ in range(2)]
    try:
        await wait_until(lambda: _slots_after(any_engine, 0.0, None, 3), timeout=20, what="slots")
        latest = (await _ledger(any_engine))[-1]
        victim = next(w for w in workers if w.pid == latest[1])
        survivor = next(w for w in workers if w is not victim)
        await victim.kill()
        killed = time.time()
        await wait_until(
            lambda: _slots_after(any_engine, killed, survivor.pid, 2),
            timeout=10,
            what="the survivor's slots (polling interval 30 s)",
        )
    finally:
        codes = [await w.stop() for w in workers if w.process.returncode is None]
    assert codes == [0]
    async with any_engine.connect() as conn:
        failures = (await conn.execute(select(scheduled_tasks.c.last_failure))).scalar_one()
    assert failures is None, "a slot ran twice"


async def test_a_revival_unpicks_the_rows_still_as_looked_in_one_transaction(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """The look's rows of a dead owner are revived together (one commit), each guarded by
    what the look saw: a row that changed since (its owner completed it, a peer revived it)
    is left as it is, and the version of each revived row goes up."""
    store = open_store(any_engine, any_database.dialect)
    locks = liveness_locks(store.db)
    assert locks is not None
    now = await db_now(any_engine)
    await store.tasks.insert_missing([NewTask(n, "i", now) for n in ("c", "a", "b", "mine")])
    T = scheduled_tasks
    async with any_engine.begin() as conn:
        await conn.execute(
            update(T).values(picked=True, picked_by="dead", last_heartbeat=now, version=2)
        )
        await conn.execute(update(T).where(T.c.task_name == "mine").values(picked_by="me"))
    held = await locks.look("me")
    assert sorted(r.task_name for r in held) == ["a", "b", "c"]
    async with any_engine.begin() as conn:  # "b" completed by its owner after the look
        await conn.execute(update(T).where(T.c.task_name == "b").values(version=3))
    revived = await locks.revive(held)
    assert sorted(r.task_name for r in revived) == ["a", "c"]
    async with any_engine.connect() as conn:
        rows = await conn.execute(select(T.c.task_name, T.c.picked, T.c.version))
        state = {r[0]: (bool(r[1]), int(r[2])) for r in rows}
    assert state == {"a": (False, 3), "b": (True, 3), "c": (False, 3), "mine": (True, 2)}
    assert await locks.revive(held) == [], "a second revival of the same look changes nothing"


def test_looks_keep_their_pace_whatever_a_look_costs() -> None:
    """The next look starts ``LOOK_EVERY`` after the start of the last one (a slow look is
    not followed by a whole ``LOOK_EVERY`` more), never without a short pause."""
    assert look_pause(10.0, 10.1) == pytest.approx(LOOK_EVERY - 0.1)
    assert look_pause(10.0, 10.0 + LOOK_EVERY) == pytest.approx(LOOK_EVERY * 0.1)
    assert look_pause(10.0, 13.0) == pytest.approx(LOOK_EVERY * 0.1)


# -- helpers ----------------------------------------------------------------------------------


async def _ledger(engine: AsyncEngine) -> list[tuple[float, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(ledger.c.started, ledger.c.pid).order_by(ledger.c.slot))
        return [(r[0].timestamp(), r[1]) for r in rows]


async def _slots_after(engine: AsyncEngine, after: float, pid: int | None, n: int) -> bool:
    rows = await _ledger(engine)
    return sum(1 for started, p in rows if started > after and pid in (None, p)) >= n


async def _count(rows: object, n: int) -> bool:
    return len(await rows) >= n  # type: ignore[misc]


async def _drop_sessions(engine: AsyncEngine, database: Database) -> None:
    """End every session on the test database but this one (as a restart does)."""
    async with engine.connect() as conn:
        if database.is_mysql:
            ids = await conn.execute(
                text(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                )
            )
            for (session,) in ids.all():
                try:
                    await conn.execute(text(f"KILL {int(session)}"))
                except OperationalError as error:  # it ended since the list was read
                    if "1094" not in str(error):  # Unknown thread id
                        raise
        else:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
    await engine.dispose()  # its other pooled connections were ended too
