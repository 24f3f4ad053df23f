"""Claiming rows of jobs with a cluster-wide concurrency limit (``max_concurrency()``, per
``concurrency_key()``), counted on the database.

One transaction per poll: take each limited job's cluster lock (so that no two instances
count at once; held until the claim committed), count the job's picked rows per key, lock
due candidates (``SKIP LOCKED`` where the dialect has it), keep those whose key still has
room, and claim them (``picked``, ``version + 1``, guarded by the version seen). Completions
and revivals only ever lower the count, so they need no lock. Portable SQLAlchemy Core; the
locks are the dialect's (``store/locks.py``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..domain.rows import PollResult, TaskRow
from .database import aware
from .locks import release_locks, take_locks
from .tasks import TaskStore

__all__ = ["Limit", "poll_limited"]

_LOCK_WAIT = 10.0
"""Seconds to wait for a limited job's cluster lock (another instance is claiming it)."""
_OVERSCAN = 4
"""Candidates read per free place, so that keys at their limit do not starve the others."""


@dataclass(frozen=True)
class Limit:
    """One limited job: at most ``max_running`` per ``key(task_instance)`` at once."""

    max_running: int
    key: Callable[[str], str | None] | None = None

    def group(self, task_instance: str) -> str | None:
        return self.key(task_instance) if self.key is not None else None


async def poll_limited(
    tasks: TaskStore,
    limits: Mapping[str, Limit],
    limit: int,
    picked_by: str,
    *,
    skip_paused: bool,
    ahead: timedelta = timedelta(0),
) -> PollResult:
    """Claim up to ``limit`` due rows of the limited jobs, none beyond a job's (or a key's)
    limit; also the database's now and the earliest future due time of their rows. ``ahead``:
    as ``TaskStore.poll``'s (``claim_ahead``)."""
    db = tasks.db
    names = sorted(limits)
    async with db.connect(db.tx_engine) as conn:
        held: list[str] = []
        try:
            async with conn.begin():
                held = await take_locks(
                    conn, [f"{db.tables.table_name}:{n}" for n in names], seconds=_LOCK_WAIT
                )
                claimed = await _claim(tasks, conn, limits, limit, picked_by, skip_paused, ahead)
                now, next_due = await _clock(tasks, conn, names, skip_paused, ahead)
        finally:
            # MySQL's GET_LOCK belongs to the session, not the transaction: released only
            # after the claim committed, or the next instance would count the running rows
            # before this claim is visible and take a place twice (PostgreSQL's transaction
            # locks end with the commit; nothing to release).
            await release_locks(conn, held)
    return PollResult(claimed, now, next_due)


async def _claim(
    tasks: TaskStore,
    conn: AsyncConnection,
    limits: Mapping[str, Limit],
    limit: int,
    picked_by: str,
    skip_paused: bool,
    ahead: timedelta,
) -> list[TaskRow]:
    t = tasks.table
    names = list(limits)
    running: collections.Counter[tuple[str, str | None]] = collections.Counter()
    for name, instance in await conn.execute(
        select(t.c.task_name, t.c.task_instance).where(
            t.c.picked.is_(True), t.c.task_name.in_(names)
        )
    ):
        running[name, limits[name].group(instance)] += 1
    due = (
        select(t.c.task_name, t.c.task_instance, t.c.version)
        .where(
            *_wanted(tasks, names, skip_paused), t.c.execution_time <= tasks.db.due_by_expr(ahead)
        )
        .order_by(t.c.priority.desc(), t.c.execution_time.asc())
        .limit(limit * _OVERSCAN)
    )
    if tasks.supports_skip_locked:
        due = due.with_for_update(skip_locked=True)
    chosen: list[tuple[str, str, int]] = []
    for name, instance, version in await conn.execute(due):
        group = (name, limits[name].group(instance))
        if running[group] >= limits[name].max_running:
            continue
        running[group] += 1
        chosen.append((name, instance, int(version)))
        if len(chosen) >= limit:
            break
    if not chosen:
        return []
    now = tasks.db.now_expr()
    # one expanding IN over (name, instance, version): its statement is compiled once
    guard = tuple_(t.c.task_name, t.c.task_instance, t.c.version).in_(chosen)
    await conn.execute(
        update(t)
        .where(guard, t.c.picked.is_(False))
        .values(picked=True, picked_by=picked_by, last_heartbeat=now, version=t.c.version + 1)
    )
    keys = tuple_(t.c.task_name, t.c.task_instance)
    rows = await conn.execute(
        select(t).where(
            keys.in_([(n, i) for n, i, _ in chosen]),
            t.c.picked.is_(True),
            t.c.picked_by == picked_by,
        )
    )
    seen = {(n, i): v for n, i, v in chosen}
    return [
        row for row in (tasks.to_row(r) for r in rows) if row.version == seen.get(row.key, -1) + 1
    ]


def _wanted(tasks: TaskStore, names: Sequence[str], skip_paused: bool) -> list[Any]:
    t = tasks.table
    wanted: list[Any] = [t.c.picked.is_(False), t.c.task_name.in_(list(names))]
    if skip_paused:
        paused = tasks.db.tables.paused
        wanted.append(t.c.task_name.not_in(select(paused.c.task_name)))
    return wanted


async def _clock(
    tasks: TaskStore,
    conn: AsyncConnection,
    names: Sequence[str],
    skip_paused: bool,
    ahead: timedelta,
) -> tuple[datetime, datetime | None]:
    """The database's now and the earliest due time after ``ahead`` of an unpicked limited
    row (due rows left for want of room are not reported: the poller is woken when room
    frees)."""
    t = tasks.table
    now = tasks.db.now_expr()
    earliest = (
        select(func.min(t.c.execution_time))
        .where(
            *_wanted(tasks, names, skip_paused), t.c.execution_time > tasks.db.due_by_expr(ahead)
        )
        .scalar_subquery()
    )
    row = (await conn.execute(select(now, earliest))).one()
    db_now = aware(row[0])
    assert db_now is not None
    return db_now, aware(row[1])
