"""``LivenessWatch``: failover at the speed of the crash.

This instance holds a session-level lock named after itself on a connection of its own
(``store/liveness.py``) and declares it in its instance row. A process that dies drops its
sessions at once, and the database releases its locks at that instant; a peer that finds rows
of its jobs picked by an instance whose lock is free revives them without waiting for the dead
window (heartbeat interval x missed heartbeats, 60 s by default).

The rules that keep this from reviving a live owner's rows:

* Never this instance's own rows (the look leaves them out).
* Only owners that declare a liveness lock (their instance row): db-scheduler on the JVM, an
  older Ekbatan or an instance with ``liveness_lock: off`` keep the dead window.
* Two looks: a row is revived when its owner's lock was free at two looks at least
  ``LOOK_EVERY`` apart and the row did not change between them (same version, same heartbeat):
  an owner whose lock's connection alone was cut takes its lock again within that time.
* After this instance's own lock was lost (its session dropped: a database restart or
  failover drops every session together), it judges nobody for one heartbeat interval of a
  working database: the owners take their locks again and heartbeat first.
* Only while this instance holds its own lock (it sees the database its peers see).

It looks while the poller has seen rows of its jobs picked by other instances, twice a
second, and stops as soon as none are. Where polls are woken by the database's notifications
(PostgreSQL's LISTEN), every claim race is seen by the polls and an idle scheduler sends
nothing more; elsewhere (MySQL/MariaDB, or LISTEN off) a poll may not come for a polling
interval, so it also looks once a second (``IDLE_LOOK``: one read of the heartbeat index,
which holds only picked rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..domain.logs import library_logger
from ..domain.rows import TaskKey
from ..domain.version import VERSION
from ..store.liveness import LIVENESS_MARK, Held, LivenessLocks, liveness_locks
from .config import SchedulerConfig
from .history import HistoryRecorder
from .observer import ObserverDispatch
from .poller import Alarm, Backoff, DatabaseLink
from .running import Capacity, RunState

if TYPE_CHECKING:
    from .execution import Execution
    from .scheduler import Scheduler

__all__ = ["IDLE_LOOK", "LOOK_EVERY", "LivenessWatch", "look_pause", "watch_for"]

log = library_logger(__name__)

LOOK_EVERY = 0.5
"""Seconds between two looks at the owners of rows other instances hold (and the least time
a lock must stay free before its owner's rows are revived)."""
IDLE_LOOK = 1.0
"""Seconds between looks when nothing is known to be held, where no notification wakes the
polls (``idle_looks``)."""
_RETAKE_SHARE = 0.25
"""The longest wait between two attempts to take this instance's lock again, as a share of the
heartbeat interval (and never above the polling interval, as every loop's backoff): peers that
lost their own lock with it judge nobody for a heartbeat interval, and one that did not finds
the lock taken again at once (the first attempts come 50 ms, 100 ms, ... after the loss)."""
_FIRST_CLAIM_WAIT = 5.0
"""Seconds the poller waits for the lock to be taken and declared before its first claim (a
database that does not answer is the poller's to report)."""
_WAIT_CHUNK = 10.0
"""Seconds one wait for this instance's lock held by another session lasts (then again)."""
_SETTLE = 5.0
"""Seconds after this instance took its own lock again (it had lost it) before it judges any
owner by its lock (at least a heartbeat interval): every session may have dropped together (a
restart, a failover), and an owner on a loaded machine may take a few seconds to reconnect and
take its lock again. A crash right after such a drop is revived that much later."""
_DECLARED_FOR = 10.0
"""Seconds an owner's declaration (its instance row) is taken as read."""


def look_pause(began: float, now: float) -> float:
    """Seconds to sleep after a look that began at ``began`` (monotonic) and ended at
    ``now``: until ``LOOK_EVERY`` after its start, and at least a tenth of it (a look slower
    than ``LOOK_EVERY`` is followed by the next one at once, but never without a pause). A
    row is judged dead only when ``LOOK_EVERY * 0.9`` passed between the looks that found
    its owner's lock free (``_judge``), whatever the pause."""
    return max(LOOK_EVERY * 0.1, LOOK_EVERY - (now - began))


class LivenessWatch:
    """This instance's liveness lock, and the look at the other instances' locks."""

    def __init__(
        self,
        *,
        name: str,
        names: Sequence[str],
        locks: LivenessLocks,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        history: HistoryRecorder,
        observer: ObserverDispatch,
        idle_looks: bool = False,
        running: Capacity | None = None,
    ) -> None:
        self.name = name
        self.idle_looks = idle_looks
        """Look once every ``IDLE_LOOK`` seconds even when no poll saw rows held by others
        (no notification wakes the polls at a peer's claim)."""
        self.names = frozenset(names)
        """The task names whose rows this instance revives (it can run them)."""
        self.locks = locks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.history = history
        self.observer = observer
        self.running = running
        """This instance's executions: told when the lock is lost (peers may revive their rows
        two looks later, ``ctx.heartbeat_state.fraction_dead`` says so) and taken again."""
        self.ready = asyncio.Event()
        """The first attempt to take the lock is over (held and declared, or given up): the
        poller waits for it before its first claim (rows claimed before the declaration are
        judged by the dead window, as an undeclared owner's are)."""
        self.judge_after = 0.0
        """Monotonic time before which no owner is judged (after this instance's lock was
        lost and taken again: the owners get a heartbeat interval to do the same)."""
        self.revived = 0
        """Rows revived by their owners' free locks (for status and tests)."""
        self._had_lock = False
        self._wake = asyncio.Event()
        self._suspects: dict[TaskKey, tuple[Held, float]] = {}
        """Rows whose owner's lock was free at the last look, and since when."""
        self._declared: dict[str, tuple[bool, float]] = {}
        self._disabled: str | None = None

    # -- what the poller calls -------------------------------------------------------------

    async def before_first_claim(self) -> None:
        """Peers judge a row by its owner's lock only once the owner declared it: a row
        claimed before that would wait for the dead window if this instance died."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), _FIRST_CLAIM_WAIT)

    def others_hold(self) -> None:
        """A poll found rows of ours picked by other instances: look at their owners."""
        self._wake.set()

    @property
    def holding(self) -> bool:
        return self.locks.holding

    # -- the loops ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Hold this instance's lock and watch the others' (both until cancelled), once
        startup has reached the database. Its database errors are not the scheduler's
        condition (the other loops report an outage): they are logged at DEBUG and retried."""
        try:
            await self.state.ready.wait()
            reason = await self._unsupported()
            if reason is not None:
                self._disabled = reason
                log.log(
                    logging.ERROR if self.config.liveness_lock == "on" else logging.INFO,
                    "scheduler %s: no liveness lock (%s); dead executions are revived after "
                    "the dead window (%s)",
                    self.name,
                    reason,
                    self.config.dead_after,
                    extra={"scheduler": self.name},
                )
                self.ready.set()
                return
            await asyncio.gather(self._hold(), self._watch())
        finally:
            self.ready.set()
            await self.locks.close()

    async def _unsupported(self) -> str | None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while True:
            try:
                return await self.locks.unsupported()
            except Exception as error:
                self._failed(error, "looking at the server")
                await asyncio.sleep(backoff.next())

    async def _hold(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        cap = config.heartbeat_interval.total_seconds() * _RETAKE_SHARE
        backoff = Backoff(min(cap, config.polling_interval.total_seconds()))
        warned = False
        while True:
            try:
                taken = await self.locks.take(self.name)
            except Exception as error:
                self._failed(error, "taking the lock")
                self.ready.set()
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            if not taken:
                if not warned:
                    warned = True
                    log.warning(
                        "scheduler %s: another session holds this instance's liveness lock "
                        "(two schedulers named %r on this table, or a session of this one that "
                        "the server has not seen end yet); waiting for it",
                        self.name,
                        self.name,
                        extra={"scheduler": self.name},
                    )
                self.ready.set()
                try:
                    while not await self.locks.wait(_WAIT_CHUNK):
                        pass
                except Exception as error:
                    self._failed(error, "waiting for the lock")
                    await asyncio.sleep(backoff.next())
                    continue
            warned = False
            if self._had_lock:
                # every session may have dropped together (a restart, a failover): the owners
                # get one heartbeat interval of a working database to take theirs again
                self.judge_after = loop.time() + self._settle()
            self._had_lock = True
            self._suspects.clear()
            for execution in self._executions():
                execution.heartbeat.lock_taken()
            if not self.history.library_version.endswith(LIVENESS_MARK):
                self.history.library_version = VERSION + LIVENESS_MARK
                await self.history.report_instance(self.state.started_at or self.link.now())
            self.ready.set()
            await self.locks.wait_lost()
            lost = self.config.clock.monotonic()
            for execution in self._executions():
                execution.heartbeat.lock_lost(lost, LOOK_EVERY)
            log.warning(
                "scheduler %s: the liveness lock's connection was lost; taking the lock again",
                self.name,
                extra={"scheduler": self.name},
            )
            self._suspects.clear()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.idle_looks:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), IDLE_LOOK)
            else:
                await self._wake.wait()
            self._wake.clear()
            while True:
                began = loop.time()
                if self._may_judge() and began >= self.judge_after:
                    try:
                        if not await self.look():
                            break
                    except Exception as error:
                        self._failed(error, "looking at the other instances")
                        self._suspects.clear()
                elif self.state.stopping:
                    break
                # every LOOK_EVERY from the start of the last look, not after it: on a loaded
                # server a look's statements take a while, and a dead owner's rows wait for two
                await asyncio.sleep(look_pause(began, loop.time()))

    def _failed(self, error: BaseException, where: str) -> None:
        log.debug(
            "scheduler %s: liveness lock, %s: %s",
            self.name,
            where,
            self.link.diagnose(error).message,
            extra={"scheduler": self.name},
        )

    def _executions(self) -> list[Execution]:
        return list(self.running) if self.running is not None else []

    def _settle(self) -> float:
        return max(_SETTLE, self.config.heartbeat_interval.total_seconds())

    def _may_judge(self) -> bool:
        return (
            self.locks.holding
            and self.state.ready.is_set()
            and not self.state.stopping
            and self.history.available
        )

    # -- one look ----------------------------------------------------------------------------

    async def look(self) -> bool:
        """Look at the rows other instances hold; revive those whose owner's lock stayed free
        since the last look. True while rows of declared owners are held (look again)."""
        rows = [r for r in await self.locks.look(self.name) if r.task_name in self.names]
        if not rows:
            self._suspects.clear()
            return False
        declared = await self._declared_owners({r.picked_by for r in rows})
        rows = [r for r in rows if r.picked_by in declared]
        if not rows:
            self._suspects.clear()
            return False
        free = await self.locks.free(sorted({r.picked_by for r in rows}))
        dead = self._judge(rows, free)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "scheduler %s: liveness look: %d rows held by declared owners, free locks %s, "
                "suspects %d, dead %d",
                self.name,
                len(rows),
                sorted(free),
                len(self._suspects),
                len(dead),
            )
        if dead and self._may_judge():
            await self._revive(dead)
        return True

    def _judge(self, rows: list[Held], free: set[str]) -> list[Held]:
        """The rows whose owner's lock was free at this look and at the last one, on the
        same row (the same claim): dead. A row seen free for the first time is a suspect
        (kept in ``_suspects`` for the next look); a row whose owner holds its lock is not."""
        now = asyncio.get_running_loop().time()
        suspects: dict[TaskKey, tuple[Held, float]] = {}
        dead: list[Held] = []
        for row in rows:
            if row.picked_by not in free:
                continue
            key = (row.task_name, row.task_instance)
            seen = self._suspects.get(key)
            if seen is None or seen[0] != row:
                suspects[key] = (row, now)
            elif now - seen[1] >= LOOK_EVERY * 0.9:
                dead.append(row)
            else:
                suspects[key] = seen
        self._suspects = suspects
        return dead

    async def _declared_owners(self, owners: set[str]) -> set[str]:
        now = asyncio.get_running_loop().time()
        unknown = [o for o in owners if o not in self._declared or self._declared[o][1] < now]
        if unknown:
            found = await self.locks.declared(unknown)
            for owner in unknown:  # an owner not declared yet may be about to
                known = owner in found
                self._declared[owner] = (known, now + (_DECLARED_FOR if known else LOOK_EVERY))
        return {o for o in owners if self._declared[o][0]}

    async def _revive(self, rows: list[Held]) -> None:
        revived = await self.locks.revive(rows)
        if revived and "rows_revived" in self.observer.wants:
            self.observer.rows_revived(revived)
        for row in revived:
            self._suspects.pop((row.task_name, row.task_instance), None)
            self.revived += 1
            if self.observer.active:
                self.observer.dead_execution_revived(
                    row.task_name, row.task_instance, row.picked_by
                )
            log.warning(
                "revived %s/%s (slot %s) at once: its owner %s is gone (its liveness lock is "
                "free and it did not heartbeat since)",
                row.task_name,
                row.task_instance,
                row.execution_time.isoformat() if row.execution_time else "?",
                row.picked_by,
                extra={
                    "scheduler": self.name,
                    "task_name": row.task_name,
                    "task_instance": row.task_instance,
                },
            )
        if revived:
            self.alarm.request_poll()


def watch_for(scheduler: Scheduler, names: Sequence[str]) -> LivenessWatch | None:
    """The scheduler's liveness watch (None: ``liveness_lock`` off, or a dialect without
    session locks), judging the rows of ``names``."""
    config, store = scheduler.config, scheduler.store
    locks = liveness_locks(store.db) if config.liveness_lock != "off" else None
    if locks is None:
        return None
    return LivenessWatch(
        name=scheduler.name,
        names=names,
        locks=locks,
        config=config,
        link=scheduler.link,
        alarm=scheduler.alarm,
        state=scheduler.state,
        history=scheduler.recorder,
        observer=scheduler.observer,
        idle_looks=not (config.listen and store.tasks.supports_notify),
        running=scheduler.executions,
    )
