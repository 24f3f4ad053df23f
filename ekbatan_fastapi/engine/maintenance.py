"""``Maintenance``: the cluster's cleanups, run by one instance at a time.

Deleting unresolved rows, pruning the history, long-gone instances and trace contexts, and
warning about rows of unknown tasks are range statements over the whole table: after a rolling
deploy, N instances running them hourly did the same work N times. So one instance leads: the
**longest-running live instance** (the oldest ``started_at`` among the instances seen within the
dead window, ties by name) in the instances table every instance already reports itself to.
No connection is held for it and nothing new is stored; when the leader stops or dies, the next
oldest leads from its next round (at most a maintenance period later). Each round also takes
the cluster lock ``ekbatan-maintenance`` (``try_cluster_lock``), so two instances that both
believe they lead (a stale instances row) never run it at once. Without the operations tables
there is no way to tell who leads: every instance maintains, still one at a time by the lock.
On a MariaDB Galera cluster the lock holds per node (``try_lock_per_node``): the leader is
still one, and the cleanups are idempotent deletes, safe if two nodes' instances ran them.

The housekeeper keeps only what each instance must do for itself: heartbeats, revivals and its
own instance row.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from ..domain.logs import library_logger
from ..domain.rows import InstanceInfo
from ..store.jobs import JobsStore
from ..store.locks import try_lock_per_node
from ..store.tasks import TaskStore
from ..store.traces import TraceStore
from .config import SchedulerConfig
from .history import HistoryRecorder
from .poller import DatabaseLink
from .running import RunState

__all__ = ["MAINTENANCE_PERIOD", "Maintenance", "leader_of"]

log = library_logger(__name__)

MAINTENANCE_PERIOD = 3600.0
"""Seconds between two maintenance rounds of the cluster (at most)."""
_LOCK = "ekbatan-maintenance"


_UNGUARDED = contextlib.nullcontext(True)


def _room_for_lock(engine: Any) -> bool:
    """The pool can hold the lock's connection while the cleanups take others: a pool of one
    or two connections (``pool_size=1`` for a small instance) would wait for itself until its
    timeout, so there the leadership rule alone guards the cleanups (range deletes that a second
    run in a leadership change repeats harmlessly)."""
    pool = engine.sync_engine.pool
    size, overflow = getattr(pool, "size", None), getattr(pool, "_max_overflow", 0)
    if not callable(size):
        return True
    return int(size()) + max(int(overflow), 0) >= 3


def leader_of(instances: Sequence[InstanceInfo]) -> str | None:
    """The name of the instance that maintains: the live one running longest (ties: by name);
    None when no instance is live."""
    live = [i for i in instances if i.alive]
    if not live:
        return None
    return min(live, key=lambda i: (i.started_at, i.name)).name


class Maintenance:
    """A round per maintenance period, on the leading instance only (see the module)."""

    def __init__(
        self,
        *,
        name: str,
        known: Sequence[str],
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        state: RunState,
        history: HistoryRecorder,
        traces: TraceStore | None = None,
        jobs: JobsStore | None = None,
    ) -> None:
        self.name = name
        self.known = list(known)
        """Every registered job name (rows of other names are unresolved)."""
        self.tasks = tasks
        self.config = config
        self.link = link
        self.state = state
        self.history = history
        self.traces = traces
        """Trace contexts of one-time tasks (OpenTelemetry): pruned where the task is gone."""
        self.jobs = jobs
        """Its streaks of missed slots (``ekbatan_missed_streaks``): pruned where the task is
        gone."""
        self.rounds = 0
        """Maintenance rounds this instance ran (it led them)."""
        self.leading: bool | None = None
        """What the last decision found: this instance leads, or not (None: none yet)."""
        self._warned_unknown: set[str] = set()

    @property
    def period(self) -> float:
        return min(MAINTENANCE_PERIOD, self.config.delete_unresolved_after.total_seconds())

    async def run(self) -> None:
        """Once ready: look every heartbeat interval whether a round is due; a round is due a
        period after the last one this instance led or declined (at once at the start)."""
        await self.state.ready.wait()
        interval = self.config.heartbeat_interval.total_seconds()
        clock = self.config.clock
        last = -1e18
        while True:
            if clock.monotonic() - last >= self.period and await self.step():
                last = clock.monotonic()
            await asyncio.sleep(interval)

    async def step(self) -> bool:
        """One decision: lead a round or not. False when it could not be decided yet (the
        database did not answer, or this instance's own row is not reported yet): the loop
        asks again at its next look, not a period later."""
        if self.state.stopping:
            return False
        leads = await self.leads()
        if leads is None:
            return False
        self.leading = leads
        if leads:
            await self.maintain()
        return True

    async def leads(self) -> bool | None:
        """Whether this instance leads the maintenance (None: not known yet)."""
        if not await self.history.check():
            return True  # no instances table: everyone maintains, one at a time by the lock
        try:
            instances = await self.history.ops.instances(self.config.dead_after)
        except Exception as error:
            self.link.failed(error, "maintenance (who leads)")
            return None
        if not any(i.name == self.name and i.alive for i in instances):
            return None
        return leader_of(instances) == self.name

    async def maintain(self) -> None:
        """Delete unresolved rows, prune long-gone instances, wake the history retention,
        prune trace contexts and warn about rows of unknown tasks; under the cluster lock."""
        try:
            engine = self.tasks.db.engine
            guard = try_lock_per_node(engine, _LOCK) if _room_for_lock(engine) else _UNGUARDED
            async with guard as held:
                if not held:
                    return
                self.rounds += 1
                deleted = await self.tasks.delete_unresolved(
                    self.known, self.config.delete_unresolved_after
                )
                await self.history.maintain()
                if self.traces is not None:
                    await self.traces.prune()
                if self.jobs is not None:
                    await self.jobs.prune_streaks()
        except Exception as error:
            self.link.failed(error, "maintenance (unresolved rows, history pruning)")
            return
        if deleted:
            log.warning(
                "deleted %d unresolved rows (task names no registered job knows) older than %s",
                deleted,
                self.config.delete_unresolved_after,
                extra={"scheduler": self.name},
            )
        await self.warn_unknown()

    async def warn_unknown(self) -> None:
        """Warn once per task name about rows no live instance runs: unpicked, overdue by more
        than the dead window, of a name this instance does not know (a live instance that
        knew it would have claimed them)."""
        try:
            found = await self.history.ops.overdue_unknown(self.known, self.config.dead_after)
            paused = set(await self.history.ops.paused()) if self.history.available else set()
        except Exception as error:
            self.link.failed(error, "maintenance (rows of unknown tasks)")
            return
        for name, count, oldest in found:
            if name in paused or name in self._warned_unknown:
                continue
            self._warned_unknown.add(name)
            log.warning(
                "%d rows of task %r have been due since %s and no live instance runs them: "
                "no job of that name is registered here, and no other instance claimed them "
                "within %s. Register the job (its module in ekbatan.jobs.modules, "
                "EKBATAN_JOBS__MODULES) or delete the rows (`ekbatan-jobs list %s` shows them); "
                "rows of unknown tasks are deleted after %s (delete_unresolved_after)",
                count,
                name,
                oldest.isoformat(),
                self.config.dead_after,
                name,
                self.config.delete_unresolved_after,
                extra={"task_name": name, "scheduler": self.name},
            )
