"""``JobsStore``: the job definitions (``ekbatan_jobs``, migration V0003) and the per-job
counts ``/jobs`` and the CLI show: executions running now, executions timed out."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, exists, func, or_, select, update
from sqlalchemy.sql import Executable

from ..domain.backfill import BACKFILL_PREFIX
from ..domain.rows import JobDefinition, Outcome
from .database import Database, aware, chunks
from .presence import TablesPresence

__all__ = ["JobsStore", "Streak"]

_RECHECK_MISSING = 30.0
_BATCH = 1000
_COLUMNS = (
    "task_name",
    "kind",
    "schedule",
    "fingerprint",
    "app_version",
    "timeout_ms",
    "max_concurrency",
    "keyed",
    "written_by",
    "written_at",
    "catch_up",
)
"""What ``write`` sets: the definition; the slot counters are left as they are."""


Streak = tuple[datetime | None, int, datetime]
"""A streak of missed slots to write for one task instance: (the row's due time it continues
from, None for a new streak; slots missed; the row's due time after them)."""


def _row(d: JobDefinition, now: datetime) -> dict[str, Any]:
    """One definition as the parameters of ``JobsStore.write``'s upsert."""
    return {
        "task_name": d.task_name,
        "kind": d.kind,
        "schedule": d.schedule[:1000] if d.schedule else None,
        "fingerprint": d.fingerprint,
        "app_version": d.app_version[:100] if d.app_version else None,
        "timeout_ms": d.timeout // timedelta(milliseconds=1) if d.timeout is not None else None,
        "max_concurrency": d.max_concurrency,
        "keyed": d.keyed,
        "written_by": d.written_by,
        "written_at": now,
        "catch_up": d.catch_up,
    }


def _definition(r: Any) -> JobDefinition:
    """A row of ``ekbatan_jobs`` as a definition."""
    written_at = aware(r.written_at)
    assert written_at is not None
    return JobDefinition(
        task_name=r.task_name,
        kind=r.kind,
        schedule=r.schedule,
        fingerprint=r.fingerprint,
        app_version=r.app_version,
        timeout=timedelta(milliseconds=r.timeout_ms) if r.timeout_ms is not None else None,
        max_concurrency=r.max_concurrency,
        keyed=bool(r.keyed),
        written_by=r.written_by,
        written_at=written_at,
        catch_up=r.catch_up,
        missed=int(r.missed_slots),
        caught_up=int(r.caught_up_slots),
        skipped=int(r.skipped_slots),
    )


class JobsStore:
    """Reads and writes ``ekbatan_jobs``; counts per job from the other tables."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.tables.jobs
        self.presence = TablesPresence(db, [self.table], _RECHECK_MISSING)
        self.streak_table = db.tables.streaks
        self.streak_presence = TablesPresence(db, [self.streak_table], _RECHECK_MISSING)
        """``ekbatan_missed_streaks`` (migration V0007): without it, no streak is kept."""

    @property
    def present(self) -> bool:
        return self.presence.present

    async def look(self) -> bool:
        """True when the table exists (looked up again at most every 30 s while missing)."""
        return await self.presence.look()

    async def write(self, definitions: Sequence[JobDefinition]) -> dict[str, datetime]:
        """Create or replace these definitions (``written_at`` = the database's now, read before
        each batch): one executemany per ``_BATCH`` rows, so the statement is compiled once and
        the event loop gets its turn between batches. The ``written_at`` of each, by name."""
        written: dict[str, datetime] = {}
        for batch in chunks(definitions, _BATCH):
            now = (await self.db.clock())[0]
            rows = [_row(d, now) for d in batch]
            await self.db.rowcount(self._upsert, rows)
            written.update((d["task_name"], now) for d in rows)
        return written

    @functools.cached_property
    def _upsert(self) -> Executable:
        return self.db.upsert_many(self.table, _COLUMNS)

    async def definitions(
        self,
        names: Sequence[str] | None = None,
        *,
        since: datetime | None = None,
        not_written_by: tuple[str, Collection[datetime]] | None = None,
    ) -> dict[str, JobDefinition]:
        """The stored definitions (of ``names``, or all; written at or after ``since``), by
        task name. Read ``_BATCH`` rows per statement: the event loop gets a turn between.
        ``not_written_by`` = (an instance, the ``written_at`` of its writes): leave out the
        rows it wrote with those stamps (its own definitions, which it knows; one stamp per
        write batch)."""
        j = self.table
        stmt = select(j)
        if since is not None:
            stmt = stmt.where(j.c.written_at >= since)
        if not_written_by is not None and not_written_by[1]:
            writer, stamps = not_written_by
            stmt = stmt.where(or_(j.c.written_by != writer, j.c.written_at.not_in(stamps)))
        result: dict[str, JobDefinition] = {}
        if names is None:
            page = stmt.order_by(j.c.task_name).limit(_BATCH)
            rows = await self.db.rows(page)
            while rows:
                result.update((r.task_name, _definition(r)) for r in rows)
                after = rows[-1].task_name
                rows = (
                    await self.db.rows(page.where(j.c.task_name > after))
                    if len(rows) == _BATCH
                    else []
                )
            return result
        for chunk in chunks(list(names), _BATCH):  # each read gives the event loop a turn
            for r in await self.db.rows(stmt.where(j.c.task_name.in_(chunk))):
                result[r.task_name] = _definition(r)
        return result

    async def add_counts(self, counts: dict[str, tuple[int, int, int]]) -> None:
        """Add (missed, caught up, skipped) slots to each job's counters."""
        j = self.table
        for name, (missed, caught_up, skipped) in counts.items():
            await self.db.rowcount(
                update(j)
                .where(j.c.task_name == name)
                .values(
                    missed_slots=j.c.missed_slots + missed,
                    caught_up_slots=j.c.caught_up_slots + caught_up,
                    skipped_slots=j.c.skipped_slots + skipped,
                )
            )

    async def add_streaks(self, streaks: dict[tuple[str, str], Streak]) -> None:
        """Write the streaks of missed slots: one that continues from the due time its row
        still had (``after``) adds to the stored count, any other replaces it."""
        s = self.streak_table
        for (name, instance), (after, missed, next_time) in streaks.items():
            key = (s.c.task_name == name) & (s.c.task_instance == instance)
            count = missed if after is None else case(
                (s.c.next_time == after, s.c.missed + missed), else_=missed
            )  # fmt: skip
            values = {"missed": count, "next_time": next_time, "updated_at": self.db.now_expr()}
            if await self.db.rowcount(update(s).where(key).values(values)):
                continue
            row = {"task_name": name, "task_instance": instance, "missed": missed}
            now = (await self.db.clock())[0]
            await self.db.rowcount(
                self._streak_upsert, [row | {"next_time": next_time, "updated_at": now}]
            )

    @functools.cached_property
    def _streak_upsert(self) -> Executable:
        return self.db.upsert_many(
            self.streak_table, ("task_name", "task_instance", "missed", "next_time", "updated_at")
        )

    async def prune_streaks(self) -> int:
        """Delete the streaks whose task row is gone (a schedule deleted or ended: one row
        per schedule would otherwise stay for ever); how many (0 without the table). A
        streak of a row that still exists is kept (ended or not: one row per task)."""
        presence = self.streak_presence
        if not presence.present and not await presence.look():
            return 0
        s, t = self.streak_table, self.db.tables.tasks
        orphaned = ~exists().where(
            t.c.task_name == s.c.task_name, t.c.task_instance == s.c.task_instance
        )
        return await self.db.rowcount(delete(s).where(orphaned))

    async def streaks(self, names: Collection[str]) -> dict[tuple[str, str], int]:
        """The streaks of missed slots of ``names`` still going on (the row still due at the
        time the streak was counted up to: no slot ran since), by (task name, instance).
        Empty without the table (migration V0007)."""
        if not names or not (self.streak_presence.present or await self.streak_presence.look()):
            return {}
        s, t = self.streak_table, self.db.tables.tasks
        on = (
            (t.c.task_name == s.c.task_name)
            & (t.c.task_instance == s.c.task_instance)
            & (t.c.execution_time == s.c.next_time)
        )
        found: dict[tuple[str, str], int] = {}
        for chunk in chunks(sorted(names), _BATCH):
            stmt = (
                select(s.c.task_name, s.c.task_instance, s.c.missed)
                .select_from(s.join(t, on))
                .where(s.c.task_name.in_(chunk), s.c.missed > 0)
            )
            for r in await self.db.rows(stmt):
                found[(str(r.task_name), str(r.task_instance))] = int(r.missed)
        return found

    async def backfills(self) -> dict[str, int]:
        """Backfill rows (``backfill:<slot>``), by task name, cluster-wide."""
        t = self.db.tables.tasks
        rows = await self.db.rows(
            select(t.c.task_name, func.count())
            .where(t.c.task_instance.like(BACKFILL_PREFIX + "%"))
            .group_by(t.c.task_name)
        )
        return {str(name): int(count) for name, count in rows}

    async def running(self) -> dict[str, int]:
        """Executions running now (picked rows), by task name, cluster-wide."""
        t = self.db.tables.tasks
        rows = await self.db.rows(
            select(t.c.task_name, func.count()).where(t.c.picked.is_(True)).group_by(t.c.task_name)
        )
        return {str(name): int(count) for name, count in rows}

    async def timed_out_since(self, since: datetime) -> dict[str, int]:
        """Executions that timed out since ``since`` (from the history), by task name."""
        h = self.db.tables.history
        rows = await self.db.rows(
            select(h.c.task_name, func.count())
            .where(h.c.outcome == Outcome.TIMED_OUT.value, h.c.finished_at >= since)
            .group_by(h.c.task_name)
        )
        return {str(name): int(count) for name, count in rows}
