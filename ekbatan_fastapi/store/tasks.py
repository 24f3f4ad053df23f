"""``TaskStore``: reads and writes ``scheduled_tasks``. The interface and the lease protocol; the
statements every dialect shares are in ``portable.py`` (SQLAlchemy Core), and a dialect's own
module adds the hot path.

The lease protocol, which every dialect implements:

* A row is *owned* by the instance whose claim set ``picked=true`` and bumped ``version``;
  the owner remembers that version (``Owned``).
* Every write by the owner (heartbeat, finish) is guarded by ``version = <ours>``. Zero rows
  updated means the row was revived or changed elsewhere: the owner has lost it and must not
  record anything.
* Every "is it due / is it dead" comparison uses the database clock (``now()`` in SQL).
* Reviving a dead execution bumps ``version`` and keeps ``execution_time`` (the slot keeps
  its identity), so the stale owner's later writes match zero rows.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from ..domain.records import ExecutionRecord
from ..domain.rows import (
    Finish,
    NewTask,
    Owned,
    PollingStrategy,
    PollResult,
    Revival,
    TaskKey,
)
from .external import Caller
from .lease import Lease
from .portable import PortableTasks
from .probe import probes

__all__ = ["HistoryTableMissing", "HistoryUnwritable", "TaskStore"]


class HistoryUnwritable(Exception):
    """``finish`` failed because of the history it was to write with the results (a value or
    a permission the database refused); nothing was written. Send the results without it."""


class HistoryTableMissing(HistoryUnwritable):
    """The history table went away while ``finish`` wrote the history with the results."""


class TaskStore(PortableTasks, abc.ABC):
    """``scheduled_tasks`` for one dialect; ``db`` sends the statements. The statements every
    dialect shares are ``PortableTasks``'s (``portable.py``)."""

    supports_skip_locked: bool = False
    supports_notify: bool = False
    """True where ``listen`` can push "something became due" to every instance."""
    writes_history_with_finish: bool = False
    """True where ``finish`` can insert the execution history in the same statement."""
    supports_claim_ahead: bool = False
    """True where ``poll`` takes ``ahead`` (``claim_ahead``)."""

    @abc.abstractmethod
    async def upsert_on(self, caller: Caller, task: NewTask, *, replace: bool) -> bool:
        """``upsert`` inside the caller's transaction (it commits or rolls back with it)."""

    @abc.abstractmethod
    async def insert_missing_on(self, caller: Caller, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """``insert_missing`` inside the caller's transaction; the keys it inserted."""

    async def notify_on(self, caller: Caller, execution_time: datetime | None) -> None:
        """``notify`` inside the caller's transaction (sent when it commits)."""
        return None

    # -- the hot path: each dialect's own statements ------------------------------------

    @abc.abstractmethod
    async def insert_missing(self, tasks: Sequence[NewTask]) -> list[TaskKey]:
        """Insert rows that do not exist yet, race-safely (version 1, unpicked); the keys
        actually inserted, sorted. A task whose ``execution_time`` is None is due at the database's
        now. Existing rows are not touched."""

    @abc.abstractmethod
    async def upsert(self, task: NewTask, *, replace: bool) -> bool:
        """Insert ``task``; when it exists, replace time/data/priority (``version + 1``) only
        if ``replace`` and the row is not picked. True when something was written."""

    async def poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: PollingStrategy,
        *,
        skip_paused: bool = False,
        lease: Lease | None = None,
        ahead: timedelta = timedelta(0),
    ) -> PollResult:
        """Claim up to ``limit`` due rows (``picked=false AND execution_time <= now()``,
        ``priority DESC, execution_time ASC``) of ``names`` for ``picked_by``; with
        ``skip_paused``, not the task names in the pause table (it must exist).

        A claim sets ``picked=true, picked_by, last_heartbeat=now(), version=version+1`` and is
        exclusive: a row is claimed by at most one caller (fetch: guarded by the version the
        candidate had when read; lock-and-fetch: by the row lock). Also returns the database's
        now and the earliest future ``execution_time`` of an unpicked row of ``names``; a
        dialect may return an earlier one when a due row was left unclaimed (a peer held its
        lock), and the scheduler then polls again soon; or None when the batch came back full
        (``more_due``: the poller polls again at once without reading it).

        ``ahead`` (``claim_ahead``, where ``supports_claim_ahead``): rows due up to that long
        from now count as due, and the next due time is the earliest after that.
        """
        if ahead and not self.supports_claim_ahead:
            raise ValueError(
                f"{self.dialect_name} cannot claim rows ahead of their time (ahead={ahead}); "
                "pass ahead=timedelta(0) (set claim_ahead to 0)"
            )
        poll = self._poll(
            names,
            limit,
            picked_by,
            strategy,
            skip_paused=skip_paused,
            lease=lease,
            ahead_ms=round(ahead.total_seconds() * 1000),
        )
        if not probes.active:
            return await poll
        started, began = time.time(), time.monotonic()
        result = await poll
        probes.polled(result, started, time.monotonic() - began)
        return result

    @abc.abstractmethod
    async def _poll(
        self,
        names: Sequence[str],
        limit: int,
        picked_by: str,
        strategy: PollingStrategy,
        *,
        skip_paused: bool,
        lease: Lease | None,
        ahead_ms: int = 0,
    ) -> PollResult:
        """``poll`` without the probes."""

    async def finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None = None,
        history: Sequence[ExecutionRecord] = (),
        picked_by: str | None = None,
        retry: bool = False,
    ) -> set[TaskKey]:
        """Record results; each write guarded by the owned version (``Finish.owned``). Returns
        the keys recorded; a key missing from the answer matched zero rows: the row was revived
        (or finished) elsewhere and nothing was written for it.

        ``history`` (only where ``writes_history_with_finish``): records inserted into the
        history table by the same statement, ``superseded`` where no write matched. ``retry``:
        an earlier attempt of the same batch failed and may have committed (its answer lost):
        records already in the table are not written again."""
        finishing = self._finish(
            items, lease=lease, history=history, picked_by=picked_by, retry=retry
        )
        if not probes.active:
            return await finishing
        began = time.monotonic()
        try:
            recorded = await finishing
        except BaseException as error:
            probes.finished(items, None, error, time.monotonic() - began)
            raise
        probes.finished(items, recorded, None, time.monotonic() - began)
        return recorded

    @abc.abstractmethod
    async def _finish(
        self,
        items: Sequence[Finish],
        *,
        lease: Lease | None,
        history: Sequence[ExecutionRecord],
        picked_by: str | None,
        retry: bool,
    ) -> set[TaskKey]:
        """``finish`` without the probes."""

    @abc.abstractmethod
    async def heartbeat(self, owned: Sequence[Owned]) -> set[TaskKey]:
        """Set ``last_heartbeat=now()`` on owned rows, each guarded by its version and
        ``picked``; the keys updated (a key missing: the row is no longer ours)."""

    async def revive_dead(self, names: Sequence[str], dead_after: timedelta) -> Revival:
        """Unpick rows of ``names`` whose heartbeat is older than ``dead_after`` (or missing),
        each guarded by the version it was found dead at, bumping ``version`` and keeping
        ``execution_time``; and say when the next picked row would be dead."""
        revival = await self._revive_dead(names, dead_after)
        if probes.active and revival.revived:
            probes.revived(revival.revived)
        return revival

    @abc.abstractmethod
    async def _revive_dead(self, names: Sequence[str], dead_after: timedelta) -> Revival:
        """``revive_dead`` without the probes."""

    # -- optional push notifications ------------------------------------------------------

    async def notify(self, execution_time: datetime | None) -> None:
        """Tell every listening instance that a row is due at ``execution_time`` (None: now);
        a no-op where the dialect has no notifications (instances learn of it when they poll)."""
        return None

    async def listen(self, on_due: Callable[[datetime | None], None]) -> None:
        """Call ``on_due`` for every notification until the connection is lost (then raise);
        only dialects with ``supports_notify`` implement it."""
        raise NotImplementedError(f"{self.dialect_name} has no notifications")

    # -- for benchmarks -------------------------------------------------------------------

    def statements(self) -> dict[str, str]:
        """The hot path's statement texts (``:name`` parameters), by name: what
        ``bench/db_limit.py`` hands to the database's own load client. Empty where the
        dialect builds its statements per call."""
        return {}
