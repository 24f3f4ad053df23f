"""``Housekeeper``: a round per heartbeat interval: heartbeat every running execution, revive
dead executions (also in between, at the moment the next picked row would be dead) and report
this instance. The cluster's cleanups are ``Maintenance``'s, on one instance at a time.

Around outages (docs/RELIABILITY.md, "Outages"): an instance never revives a row it picked or
runs itself; a round whose heartbeat failed revives nothing, and the heartbeat is retried with
backoff until it gets through; and after an outage (or a statement that hung) no row is judged
dead until the database has worked for a dead window, so that every owner cut off by
the same outage has heartbeated what it runs first.

Stalls (issue 31): a statement that blocks instead of failing (a Galera cluster holds every
commit while it evicts a dead node; a lock held on the tables) is committed only when the
stall ends, with the time it began as the heartbeat it stores (a heartbeat's, a claim's): the
rows of every owner read as old as the stall. Every statement of the housekeeper and the
poller's claims are timed; one that took longer than the stall threshold (a heartbeat interval,
at least half the dead window) counts as a stall, after which no row is judged dead for that
threshold, and the owner of what hung heartbeats it again at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from ..domain.logs import library_logger
from ..domain.rows import Own
from ..store.cancels import CancelRequest, CancelStore
from ..store.tasks import TaskStore
from .config import SchedulerConfig
from .execution import Execution
from .history import HistoryRecorder
from .logs import log_extra
from .observer import ObserverDispatch
from .poller import Alarm, Backoff, DatabaseLink
from .running import Capacity, RunState

__all__ = ["Housekeeper"]

log = library_logger(__name__)

T = TypeVar("T")

_DEATH_MARGIN = 0.005
"""Seconds after the next death to look (the comparison in SQL is strict)."""
_MIN_EARLY_CHECK = 0.02
"""Early dead-execution checks come at least this far apart (against clock skew)."""
_TIMER_SLACK = 0.001
"""The event loop may wake a timer this early (its clock resolution): still the round."""


class Housekeeper:
    """Heartbeats, dead executions, this instance's row."""

    def __init__(
        self,
        *,
        name: str,
        names: Sequence[str],
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        running: Capacity,
        history: HistoryRecorder,
        observer: ObserverDispatch,
        refresh_definitions: Callable[[], Awaitable[None]] | None = None,
        cancels: CancelStore | None = None,
    ) -> None:
        self.name = name
        self.names = list(names)
        """The task names whose dead executions this instance revives (it can run them)."""
        self.tasks = tasks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.running = running
        self.history = history
        self.observer = observer
        self.refresh_definitions = refresh_definitions
        """Re-reads the stored job definitions (a newer version's schedules)."""
        self.cancels = cancels
        """Where requests to stop a running execution are read (None: never)."""
        self.next_death: datetime | None = None
        """When the next picked row would be dead (database time): check for it then."""
        self._beaten = False
        """The last heartbeat round got through (or had nothing to send)."""
        self._stall = max(
            config.heartbeat_interval.total_seconds(), config.dead_after.total_seconds() / 2
        )
        """Seconds a statement may take before it counts as a stall of the database; after
        one, the time no row is judged dead (``may_judge``)."""
        link.stall_after = self._stall
        self._grace = config.dead_after.total_seconds()
        """Seconds the database must have worked after an outage before a row is judged dead."""

    async def run(self) -> None:
        """A round per heartbeat interval; in between, a dead-execution check at the moment
        the next picked row would become dead (so a crashed peer's executions are revived
        within milliseconds of the dead window, not up to one interval later). A round whose
        heartbeat failed revives nothing, and the heartbeat is retried with backoff (50 ms up
        to the polling interval, at most half a heartbeat interval) until it gets through:
        after an outage this instance speaks up for what it runs before any peer may judge
        it dead (``may_judge``)."""
        interval = self.config.heartbeat_interval.total_seconds()
        retry = Backoff(min(self.config.polling_interval.total_seconds(), interval / 2))
        loop = asyncio.get_running_loop()
        next_round = loop.time() + interval
        beat_again: float | None = None
        """Loop time of the next heartbeat retry after a failed one."""
        while True:
            await asyncio.sleep(max(0.0, self._wake(loop, next_round, beat_again) - loop.time()))
            if loop.time() < next_round - _TIMER_SLACK:
                beat_again = await self._between_rounds(loop, beat_again, retry)
                continue
            next_round = loop.time() + interval
            beat_again = await self._round(loop, retry)

    def _wake(
        self, loop: asyncio.AbstractEventLoop, next_round: float, beat_again: float | None
    ) -> float:
        """Loop time to wake at: the next round, a heartbeat retry, or the moment the next
        picked row would become dead, whichever comes first."""
        wake = next_round if beat_again is None else min(next_round, beat_again)
        if self.next_death is not None and self.may_judge():
            until = (self.next_death - self.link.now()).total_seconds() + _DEATH_MARGIN
            wake = min(wake, loop.time() + max(until, _MIN_EARLY_CHECK))
        return wake

    async def _between_rounds(
        self, loop: asyncio.AbstractEventLoop, beat_again: float | None, retry: Backoff
    ) -> float | None:
        """Woken before the round: the heartbeat's retry when it is due, else an early
        dead-execution check only. The retry's loop time after it (None: no retry)."""
        if beat_again is not None and loop.time() >= beat_again - _TIMER_SLACK:
            return await self._beat(loop, retry)
        self.next_death = None
        if self._may_revive() and self.may_judge():
            await self._timed(self.revive_dead(), "a dead-execution check")
        return beat_again

    async def _timed(self, call: Awaitable[T], where: str) -> T:
        """Await ``call`` (a statement of ``where``); one that took longer than the stall
        threshold counts as a stall of the database (``DatabaseLink.stall``)."""
        began = self.link.clock.monotonic()
        result = await call
        self.link.stall(began, where)
        return result

    async def _beat(self, loop: asyncio.AbstractEventLoop, retry: Backoff) -> float | None:
        """Heartbeat; the loop time of its retry when it failed (None: it got through)."""
        if await self.heartbeat():
            retry.reset()
            return None
        return loop.time() + retry.next()

    async def _round(self, loop: asyncio.AbstractEventLoop, retry: Backoff) -> float | None:
        """A round: heartbeat, then (if it got through) revive the dead, release orphaned
        claims, report this instance and re-read the definitions. The heartbeat's retry as
        ``_beat`` says (a failed heartbeat judges nobody this round)."""
        beat_again = await self._beat(loop, retry)
        if beat_again is None and len(self.running):
            await self._timed(self.stop_requested(), "reading the requests to stop")
        if beat_again is not None or not self._may_revive():
            return beat_again
        # first: failover time does not wait for the others; a database that does not
        # answer it is not asked the rest of the round
        if self.may_judge() and not await self._timed(self.revive_dead(), "a dead-execution check"):
            return None
        await self._timed(self.release_orphans(), "releasing orphaned claims")
        await self._timed(
            self.history.report_instance(self.state.started_at or self.link.now()),
            "reporting this instance",
        )
        if self.refresh_definitions is not None:
            await self._timed(self.refresh_definitions(), "reading the job definitions")
        return None

    async def stop_requested(self) -> None:
        """Cancel the executions someone asked to stop (``client.cancel_running``): one read
        of the requests for the task names this instance runs, made only in a round that
        runs something. An ``async def`` execution's task is cancelled; a plain ``def`` one
        cannot be interrupted (``ctx.cancel_requested`` turns true). The requests acted on,
        and those for older claims of what this instance runs, are deleted."""
        cancels = self.cancels
        if cancels is None:
            return
        held = self.running.by_key
        try:
            if not await cancels.look():
                return
            requests = await cancels.pending({key[0] for key in held})
            done = []
            for request in requests:
                execution = held.get(request.key)
                if execution is None:
                    continue  # another instance's (or an ended claim's)
                if request.version != execution.row.version:
                    if request.version < execution.row.version:
                        done.append(request.key)  # an older claim's
                    continue
                done.append(request.key)
                if not execution.stale_overlap(request):
                    self._stop(execution, request)
            await cancels.remove(done)
        except Exception as error:
            cancels.presence.forget()
            log.warning("could not read the requests to stop running executions: %s", error)

    def _stop(self, execution: Execution, request: CancelRequest) -> None:
        if not execution.request_stop(request):
            return
        if not execution.job.is_async:
            log.warning(
                "%s: asked to stop (%s), but a plain def job cannot be interrupted; "
                "ctx.cancel_requested is now true, and it is recorded as cancelled when it "
                "returns",
                execution.label,
                request.describe(),
                extra=log_extra(execution.row, self.name),
            )

    def _may_revive(self) -> bool:
        return not self.state.stopping and self.state.ready.is_set()

    def may_judge(self) -> bool:
        """Whether this instance may judge other instances' executions dead now: its own last
        heartbeat got through (at start: after its first round), and, after an outage it saw
        (or a stall), the database has worked for a dead window since, so that every owner
        cut off with it has had the time to heartbeat what it runs (a heartbeat interval was
        too short: owners see the database back at different moments, each after its own
        reconnect and backoff, and a planned Patroni switchover through HAProxy revived live
        owners 0.4 s after the cluster was writable again); after a stall (a
        statement that took longer than the stall threshold), for that threshold: the writes
        that hung were committed with the time they began, so the rows of owners that spoke up
        during the stall read as old as it until they heartbeat again."""
        return (
            self._beaten
            and self.link.working_for() >= self._grace
            and self.link.since_stall() >= self._stall
        )

    async def heartbeat(self) -> bool:
        """Heartbeat every execution this instance holds; False if the statement failed. One
        that took longer than the stall threshold counts as a stall (peers may have been held
        up as long: ``DatabaseLink.stall``), and is sent again at once: what it stored is the
        time it began, as old as the stall."""
        executions = list(self.running)
        if not executions:
            self._beaten = True
            return True
        clock = self.link.clock
        sent = clock.monotonic()  # when the database stores the heartbeats
        owned = [e.owned for e in executions]
        try:
            alive = await self.tasks.heartbeat(owned)
        except Exception as error:
            self._beaten = False
            self.link.failed(error, "heartbeat")
            for execution in executions:
                self._heartbeat_failed(execution)
            return False
        self.link.answered()
        if self.link.stall(sent, "a heartbeat"):
            again = clock.monotonic()
            try:
                alive = await self.tasks.heartbeat(owned)
                sent = again
            except Exception as error:
                self.link.failed(error, "heartbeat")  # the stalled one got through
        self._beaten = True
        for execution in executions:
            if execution.row.key in alive:
                execution.heartbeat.record_success(sent)
            elif execution.row.key in self.running.by_key and not execution.recording:
                self._heartbeat_failed(execution)
                if execution.heartbeat.failed_heartbeats > 1:
                    continue
                log.warning(
                    "heartbeat of %s found the row revived elsewhere (%d failed heartbeats); "
                    "this execution can no longer record its result",
                    execution.label,
                    execution.heartbeat.failed_heartbeats,
                    extra=log_extra(execution.row, self.name),
                )
        return True

    def _heartbeat_failed(self, execution: Execution) -> None:
        execution.heartbeat.record_failure()
        if self.observer.active:
            self.observer.heartbeat_failed(execution.row.task_name, execution.row.task_instance)

    async def revive_dead(self, *, raising: bool = False) -> bool:
        """Check for dead executions and revive them; False if the database failed (its error
        raised instead with ``raising``: a manual driver's step, ``revive_step``)."""
        try:
            ready_at = self.state.ready_at
            revival = await self.tasks.revive_dead(
                self.names,
                self.config.dead_after,
                # never what this incarnation claimed or runs: it knows they are alive
                own=Own(self.name, ready_at) if ready_at is not None else None,
                held=self.running.by_key.keys(),
            )
        except Exception as error:
            self.link.failed(error, "dead-execution check")
            if raising:
                raise
            return False
        self.link.answered()
        self.next_death = revival.next_death
        if revival.revived and "rows_revived" in self.observer.wants:
            self.observer.rows_revived(revival.revived)
        for row in revival.revived:
            if self.observer.active:
                self.observer.dead_execution_revived(
                    row.task_name, row.task_instance, row.picked_by
                )
            log.warning(
                "revived dead execution %s/%s (slot %s, picked by %s, last heartbeat %s)",
                row.task_name,
                row.task_instance,
                row.execution_time.isoformat(),
                row.picked_by,
                row.last_heartbeat.isoformat() if row.last_heartbeat else "never",
                extra=log_extra(row, self.name),
            )
        if revival.revived:
            self.alarm.request_poll()
        return True

    async def revive_step(self) -> bool:
        """A manual driver's round (``Manual.STEP``): ``revive_dead``, its database error
        propagating."""
        return await self.revive_dead(raising=True)

    def _orphans_possible(self) -> bool:
        """A claim of ours failed lately: it may have executed on the server anyway. After a
        dead window its rows are dead executions, revived like any other."""
        failed = self.state.claim_failed_at
        if failed is None:
            return False
        window = (self.config.dead_after + 2 * self.config.heartbeat_interval).total_seconds()
        if self.config.clock.monotonic() - failed > window:
            self.state.claim_failed_at = None
            return False
        return True

    def _abandoned_lately(self) -> bool:
        """An execution of ours was abandoned: its row stays picked by this instance, which
        never revives its own rows; it is released once its heartbeat is a dead window old,
        looked for until a heartbeat interval past that."""
        abandoned = self.state.abandoned_at
        if abandoned is None:
            return False
        window = (self.config.dead_after + 2 * self.config.heartbeat_interval).total_seconds()
        if self.config.clock.monotonic() - abandoned > window:
            self.state.abandoned_at = None
        return True

    async def release_orphans(self) -> None:
        """Release rows picked by this instance that it does not run (see
        ``TaskStore.release_orphans``); only while a failed claim may have left some (their
        claim's heartbeat two intervals old), or an abandoned execution did (its last heartbeat
        a dead window old, as a peer would have revived it)."""
        if self.running.claiming:
            return
        if self._orphans_possible():
            older_than = 2 * self.config.heartbeat_interval
        elif self._abandoned_lately():
            older_than = self.config.dead_after
        else:
            return
        try:
            released = await self.tasks.release_orphans(
                self.name,
                self.running.by_key,  # live: an execution launched meanwhile counts
                older_than,
                still_safe=lambda: not self.running.claiming and not self.state.stopping,
            )
        except Exception as error:
            self.link.failed(error, "releasing orphaned claims")
            return
        self.link.answered()
        for row in released:
            log.warning(
                "released %s/%s (slot %s): picked by this instance, which does not run it (a "
                "claim whose answer was lost, or an execution abandoned a dead window ago); it "
                "runs again at its slot",
                row.task_name,
                row.task_instance,
                row.execution_time.isoformat(),
                extra=log_extra(row, self.name),
            )
        if released:
            self.alarm.request_poll()
