"""The claim loop and what every loop of an instance shares with it.

``Poller``: claims due rows in batches and hands them to the executor; sleeps until the
earliest known due time or the polling interval, whichever is sooner. ``Alarm``: when it
wakes. ``Backoff`` and ``paced``: how the loops pace themselves. ``DatabaseLink``: what the
instance knows of its database (its clock, which every poll reads, and its condition).

``DatabaseLink``: the database's clock, estimated between statements from the local clock and
the last observed offset; the current condition (``ok``, or what the last error means:
unreachable, read-only, a pooler mismatch, ...) and since when; the last error with its time,
which stays after recovery; the rule for logging errors (the first one at once, then at most
one a minute while the outage lasts); and the signal that the loops reached the database again
after a failover-like error (``moved``), on which the listener reconnects; and how long the
database has worked since the last outage (``working_for``): the housekeeper judges no peer's
execution dead before every owner has had a dead window of a working database to
speak up.

``Alarm``: it sleeps until the polling interval ends, an earlier known due time (database
clock) comes, or somebody asks for a poll (new work due now, capacity freed, a revival,
shutdown); after a failed statement it backs off, and only shutdown cuts that wait short.

``paced``: a long loop of the start (100,000 jobs) gives the event loop a turn every ``PACE``
items, so an application's other tasks (its routes, the heartbeats) are not held up for the
whole loop; ``Backoff``: the growing delays between a loop's retries after an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from ..domain.clock import Clock
from ..domain.logs import library_logger
from ..domain.rows import Owned, PollingStrategy, PollResult, TaskRow
from ..domain.schedule import Schedule
from ..store.database import Diagnosis
from ..store.limited import Limit, poll_limited
from ..store.tasks import TaskStore

if TYPE_CHECKING:  # they import this module (its link, alarm and backoff)
    from .config import SchedulerConfig
    from .executor import Executor
    from .history import HistoryRecorder
    from .observer import ObserverDispatch
    from .running import Capacity, RunState

__all__ = [
    "CLAIM_CHUNK",
    "FAILOVER_CONDITIONS",
    "OUTAGE_CONDITIONS",
    "PACE",
    "Alarm",
    "Backoff",
    "DatabaseLink",
    "Poller",
    "paced",
]

log = library_logger(__name__)

T = TypeVar("T")

CLAIM_CHUNK = 100
"""Rows one poll statement claims at most; with more room the poller polls again at once. When
many rows come due together (1,000 recurring jobs in the same second), every instance polling
then gets a share instead of the first poll taking them all, and the first executions start
after a 100-row claim, not after one of thousands. The batch size (how many run at once)
is unchanged."""

_CONTENDED_FLOOR = 0.005
"""Seconds before looking again at a due row a peer's lock hid (doubling up to the interval)."""
_OVERDUE_FLOOR = 0.5
"""Seconds before looking again at a recurring row a peer holds past its next slot (its
execution runs long, or its owner died): doubling up to the interval."""


class Poller:
    """The claim loop."""

    def __init__(
        self,
        *,
        name: str,
        names: Sequence[str],
        limits: Mapping[str, Limit],
        strategy: PollingStrategy,
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
        running: Capacity,
        executor: Executor,
        history: HistoryRecorder,
        observer: ObserverDispatch,
        schedule_for: Callable[[str], Schedule | None] | None = None,
        on_held: Callable[[], None] | None = None,
        cancel_other: Collection[str] = (),
        stop_overlapped: Callable[[str, datetime, datetime], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.schedule_for = schedule_for
        """A recurring job's current schedule: a row a peer holds comes due again at its next
        slot (``Definitions.schedule``)."""
        self.on_held = on_held
        """Told when a poll found rows of ours picked by other instances (the liveness watch)."""
        self.limits = dict(limits)
        """The jobs with a cluster-wide concurrency limit: claimed by ``poll_limited``."""
        self.names = [n for n in names if n not in self.limits]
        """The other task names this instance claims (its jobs, less the disabled ones)."""
        self.strategy = strategy
        self.tasks = tasks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state
        self.running = running
        self.executor = executor
        self.history = history
        self.observer = observer
        self.lease = tasks.db.lease()
        self.cancel_other = frozenset(cancel_other) if stop_overlapped is not None else frozenset()
        """The recurring jobs with ``Overlap.cancel_other``: a peer's execution of one still
        running once its next slot is due is asked to stop (``stop_overlapped``)."""
        self.stop_overlapped = stop_overlapped
        self._overlapped: list[tuple[str, datetime, datetime]] = []
        """Held rows of those jobs past their next slot, as the last poll saw them."""
        self._asked: set[tuple[str, datetime, datetime]] = set()
        """Held rows (name, due time, slot named) asked to stop already."""

    async def _poll(self, limit: int) -> PollResult:
        """Claim up to ``limit`` due rows: the unlimited jobs' in one statement, then the
        limited jobs' in a transaction that counts their running executions."""
        skip_paused = self.history.ops.presence.present
        if not self.names:
            result = PollResult([], self.link.now(), None)
        else:
            result = await self.tasks.poll(
                self.names,
                limit,
                self.name,
                self.strategy,
                skip_paused=skip_paused,
                lease=self.lease,
                ahead=self.config.claim_ahead,
            )
        room = limit - len(result.claimed)
        if not self.limits or room <= 0:
            return result
        limited = await poll_limited(
            self.tasks,
            self.limits,
            room,
            self.name,
            skip_paused=skip_paused,
            ahead=self.config.claim_ahead,
        )
        due = [d for d in (result.next_due, limited.next_due) if d is not None]
        return PollResult(
            [*result.claimed, *limited.claimed],
            limited.db_now if not self.names else result.db_now,
            min(due) if due else None,
            more_due=result.more_due or len(limited.claimed) >= room,
            held=result.held,
        )

    def _held_due(self, result: PollResult) -> tuple[datetime | None, bool]:
        """When a recurring row a peer holds comes due again (its next slot after the one it
        runs: the earliest over the rows, if in the future), and whether one is past it.
        Without it, an instance that lost the claim races would sleep a whole polling interval
        and a peer's death would leave the slots to that interval (issue #32)."""
        soonest: datetime | None = None
        overdue = False
        self._overlapped = []
        for task_name, execution_time in result.held:
            schedule = self.schedule_for(task_name) if self.schedule_for is not None else None
            if schedule is None:
                continue
            try:
                slot = schedule.next_execution_time(execution_time, execution_time)
            except Exception:  # a schedule that cannot say (beyond the calendar): no estimate
                continue
            if slot <= result.db_now:
                overdue = True
                if task_name in self.cancel_other:  # the newest slot due names the request
                    latest = schedule.latest_at_or_before(schedule.slot_of(slot), result.db_now)
                    self._overlapped.append((task_name, execution_time, latest))
            elif soonest is None or slot < soonest:
                soonest = slot
        return soonest, overdue

    async def poll_once(self, limit: int) -> PollResult:
        """One claim as ``run`` makes it, without its sleeps and retries (an error propagates):
        claim up to ``limit`` due rows, learn the database clock, launch what was claimed.
        ``step`` (the ``TimeMachine``'s round) makes it."""
        sent = self.config.clock.now()
        with self.running.claim():
            result = await self._poll(limit)
            self.link.observed(result.db_now, sent)
            self.state.last_poll = result.db_now
            for row in result.claimed:
                self.executor.launch(row)
        return result

    async def step(self) -> PollResult:
        """One round of ``run`` for a manual driver (``Manual.STEP``): claim what is due, as
        much as there is room for (up to ``CLAIM_CHUNK``), launch it, and let go of the
        connection as the idle poller does; errors propagate (a launch that failed: once
        the rest of the batch was launched, its row given back)."""
        failed: list[Exception] = []
        self.executor.launch_errors = failed
        try:
            result = await self.poll_once(min(self.running.claim_limit(), CLAIM_CHUNK))
        finally:
            self.executor.launch_errors = None
            await self.lease.release()
        if failed:
            raise failed[0]
        return result

    async def run(self) -> None:
        try:
            interval = self.config.polling_interval.total_seconds()
            backoff = Backoff(interval)
            contended = Backoff(interval, floor=_CONTENDED_FLOOR)
            overdue_backoff = Backoff(interval, floor=_OVERDUE_FLOOR)
            failing = "ok"
            """The condition of the last failed poll (``ok``: the last poll got its answer)."""
            while not self.state.stopping:
                limit = min(self.running.claim_limit(), CLAIM_CHUNK)
                if limit <= 0:
                    # Nothing can be claimed until executions finish (they wake us then), so a
                    # known due time is moot; one in the past would make sleep return at once
                    # without yielding, and this loop would spin and starve the event loop.
                    self.alarm.planned_due = None
                    self.lease.idle()
                    await self.alarm.sleep(interval)
                    continue
                result = await self._attempt(limit)
                if result is None:
                    if self.link.condition != failing:
                        # Another kind of error: the outage changed (a read-only primary was
                        # restarted, a stale pooled connection broke): start the backoff over.
                        failing = self.link.condition
                        backoff.reset()
                    # Backing off is not claiming: the housekeeper may release what the failed
                    # claim left picked meanwhile, and /jobs may judge this instance's rows.
                    await self.alarm.backoff(backoff.next())
                    continue
                if failing != "ok":  # the first answer after failures
                    failing = "ok"
                    backoff.reset()
                for row in result.claimed:
                    self.executor.launch(row)
                # More may be due: a full batch claimed, or (fetch) a full batch seen of which
                # peers won some; sleeping now would leave a full table to the winners for a
                # whole interval.
                if len(result.claimed) >= limit or result.more_due:
                    continue
                if result.held and self.on_held is not None:
                    self.on_held()
                self.alarm.planned_due = self._next_wake(result, contended, overdue_backoff)
                if self.cancel_other and (self._overlapped or self._asked):
                    await self._stop_overlapped(result)
                # nothing more due now: an idle poller holds no connection
                await self.lease.release()
                await self.alarm.sleep(interval)
        finally:
            await self.lease.release()

    async def _stop_overlapped(self, result: PollResult) -> None:
        """Ask the owners of the held rows past their next slot whose job has
        ``Overlap.cancel_other`` to stop them, naming the newest slot due (once per row and
        slot; only when a poll saw one: no statement otherwise). Their owner's own timer
        usually stopped them already; an owner that started the run after that slot was due
        (a late claim) ignores the request, and is asked again at the next slot."""
        held = set(result.held)
        # only the rows this poll still saw held: a row the last look judged (a poll that
        # saw no held row, or a contended one, does not judge again) is not asked again
        self._overlapped = [a for a in self._overlapped if (a[0], a[1]) in held]
        self._asked = {a for a in self._asked if (a[0], a[1]) in held}
        assert self.stop_overlapped is not None
        for asked in self._overlapped:
            if asked in self._asked:
                continue
            self._asked.add(asked)
            task_name, execution_time, slot = asked
            try:
                await self.stop_overlapped(task_name, execution_time, slot)
            except Exception as error:
                log.debug("could not ask %s to stop for its next slot: %s", task_name, error)

    async def _attempt(self, limit: int) -> PollResult | None:
        """One poll claiming up to ``limit`` rows, inside the claim's accounting; None when it
        failed (the link says why)."""
        clock = self.config.clock
        began = clock.monotonic()
        sent = clock.now()
        wants = self.observer.wants
        running = self.running
        running.claims += 1  # the claim in flight (``Capacity.claim``, inline: once a poll)
        try:
            if "statement_scope" in wants:
                with self.observer.statement_scope("poll", limit):
                    result = await self._poll(limit)
                    self._polled(result, began)
            elif self.names and not self.limits:
                # The common case (no job with a cluster-wide limit): the store's own poll,
                # one statement, without ``_poll`` in between.
                result = await self.tasks.poll(
                    self.names,
                    limit,
                    self.name,
                    self.strategy,
                    skip_paused=self.history.ops.presence.present,
                    lease=self.lease,
                    ahead=self.config.claim_ahead,
                )
                if "polled" in wants or "poll_answered" in wants:
                    self._polled(result, began)
            else:
                result = await self._poll(limit)
                if "polled" in wants or "poll_answered" in wants:
                    self._polled(result, began)
        except Exception as error:
            self.state.claim_failed_at = clock.monotonic()
            self.link.failed(error, "poll")
            return None
        finally:
            running.claims -= 1
        link = self.link
        quiet = not link._maybe_moved and (link._working_since is not None or not link.outages)
        if link.condition == "ok" and quiet:
            # ``observed`` written out for the usual answer (no outage ends, no move to signal)
            link.offset = result.db_now - sent
            link.answered_at = clock.monotonic()
        else:
            link.observed(result.db_now, sent)
        self.state.last_poll = result.db_now
        took = clock.monotonic() - began  # ``DatabaseLink.stall`` written out (every poll)
        if took > link.stall_after:
            link.stalled(took, "a claim")
            if result.claimed:
                await self._beat_claimed(result.claimed)
        return result

    async def _beat_claimed(self, rows: Sequence[TaskRow]) -> None:
        """A claim that stalled (a Galera node's eviction holds every commit of the cluster)
        was committed only now, with the time its statement began as the rows' heartbeat: as
        old as the stall, dead to a peer that judges at once. Heartbeat them now, before they
        are launched (their executions' own heartbeats start with the next round). The
        poller's connection goes back to the pool first: with ``pool_size=1`` it is the only
        one, and the heartbeat would wait for it forever."""
        try:
            await self.lease.release()
            await self.tasks.heartbeat(
                [Owned(r.task_name, r.task_instance, r.version) for r in rows]
            )
        except Exception as error:
            self.link.failed(error, "heartbeat")

    def _polled(self, result: PollResult, began: float) -> None:
        """Tell the observers that wait for it how the poll went."""
        seconds = self.config.clock.monotonic() - began
        if "polled" in self.observer.wants:
            self.observer.polled(seconds, len(result.claimed))
        if "poll_answered" in self.observer.wants:
            self.observer.poll_answered(result, time.time() - seconds, seconds)

    def _next_wake(
        self, result: PollResult, contended: Backoff, overdue_backoff: Backoff
    ) -> datetime | None:
        """When to poll again before the polling interval, after a poll that left nothing
        more due now: a row a peer's lock hid, the next due time, a held row's slot, or a
        retry of overdue held rows."""
        ahead = self.config.claim_ahead
        if result.next_due is not None and result.next_due <= result.db_now + ahead:
            # A due row this poll did not get: a peer's lock hid it, which is a claim in
            # flight or only a peer's scan. Look again soon, backing off in case the lock
            # is long held, rather than leave the slot to the next polling interval. (The
            # alarm wakes ``claim_ahead`` before a planned due time.)
            return result.db_now + ahead + timedelta(seconds=contended.next())
        if contended.current != contended.floor:
            contended.reset()
        if not result.held:  # the common case: no row of ours is a peer's
            if overdue_backoff.current != overdue_backoff.floor:
                overdue_backoff.reset()
            return result.next_due
        held_due, overdue = self._held_due(result)
        wake = result.next_due
        if held_due is not None and (wake is None or held_due < wake):
            wake = held_due
        if overdue:
            again = result.db_now + timedelta(seconds=overdue_backoff.next())
            wake = again if wake is None or again < wake else wake
        elif overdue_backoff.current != overdue_backoff.floor:
            overdue_backoff.reset()
        return wake


# -- Alarm: when the poller wakes -----------------------------------------------------------------

_LATE = 0.002
"""Seconds after a due time to wake: the comparison in SQL is ``<= now()``."""


class Alarm:
    """The poller's alarm clock."""

    def __init__(
        self, link: DatabaseLink, state: RunState, ahead: timedelta = timedelta(0)
    ) -> None:
        self._link = link
        self._state = state
        """Read for ``stopping`` (an attribute, not a callable: no call per wait)."""
        self._ahead = ahead
        """``claim_ahead``: wake this long before a due time (the poll claims that far ahead)."""
        self._wake = asyncio.Event()
        link.on_recovery(self._wake.set)
        self._requested = False
        self.planned_due: datetime | None = None
        """The earliest due time the poller knows of (database time), if sooner than the
        interval; the poller sets it after each poll."""

    def request_poll(self) -> None:
        """Poll now."""
        self._requested = True
        self._wake.set()

    def note_due(self, when: datetime) -> None:
        """Something becomes due at ``when`` (database time): wake up then, if that is sooner."""
        if self.planned_due is None or when < self.planned_due:
            self.planned_due = when
            self._wake.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep until the deadline, an earlier known due time, or a poll request."""
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + seconds
        while not self._state.stopping:
            if self._requested:  # asked for during a ``backoff``
                self._requested = False
                return
            if self.planned_due is not None:
                link = self._link  # its now(), written out
                until = self.planned_due - self._ahead - (link.clock.now() + link.offset)
                until_due = until.total_seconds() + _LATE
                deadline = min(deadline, loop_time() + max(0.0, until_due))
            remaining = deadline - loop_time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            self._wake.clear()
            if self._requested:
                self._requested = False
                return

    async def backoff(self, seconds: float) -> None:
        """Wait ``seconds`` after a failed statement; only shutdown, or another loop getting
        an answer after an outage (``DatabaseLink.on_recovery``), ends the wait early. A
        known due time (in the past once the outage outlasts it) or a poll request (a
        notification, freed capacity) would end every wait at once and spin the retry loop
        while the database is away (hundreds of connection attempts a second); they are kept
        for the next ``sleep``."""
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + seconds
        recoveries = self._link.recoveries
        while not self._state.stopping:
            remaining = deadline - loop_time()
            if remaining <= 0 or self._link.recoveries != recoveries:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            self._wake.clear()


# -- paced and Backoff: how the loops pace themselves ---------------------------------------------

PACE = 1000
"""Items between two turns of the event loop (a few milliseconds of work)."""


async def paced(items: Iterable[T], every: int = PACE) -> AsyncIterator[T]:
    """``items``, with an ``await asyncio.sleep(0)`` before every ``every``-th one."""
    for index, item in enumerate(items):
        if index and index % every == 0:
            await asyncio.sleep(0)
        yield item


_MIN = 0.05


class Backoff:
    """Exponential backoff from ``floor`` (50 ms) up to ``cap`` seconds (the polling interval,
    so that a database that comes back is used again within one interval)."""

    def __init__(self, cap: float, floor: float = _MIN) -> None:
        self.floor = floor
        self.cap = max(cap, floor)
        self.current = floor

    def next(self) -> float:
        value = self.current
        self.current = min(self.cap, self.current * 2)
        return value

    def reset(self) -> None:
        self.current = self.floor


# -- DatabaseLink: what the instance knows of its database ----------------------------------------

_LOG_EVERY = 60.0
"""Seconds between error lines while the database stays unreachable."""

FAILOVER_CONDITIONS = ("unreachable", "timeout", "read-only")
"""Errors after which the next answer may come from another server (a failover): the
listener's connection, which saw none of them, may still be on the old one."""


OUTAGE_CONDITIONS = ("unreachable", "timeout", "read-only", "login-refused")
"""Errors during which no instance may be able to write (the database is down, silent,
read-only, or refuses logins): every owner's heartbeats may have failed as this instance's
did, so their rows are not judged dead until the database has worked for a heartbeat interval
(``working_for``)."""


def _undiagnosed(error: BaseException) -> Diagnosis:
    return Diagnosis("unreachable", False, f"{type(error).__name__}: {error}")


class DatabaseLink:
    """The database clock, condition and last error of one scheduler instance."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        observer: ObserverDispatch,
        diagnose: Callable[[BaseException], Diagnosis] = _undiagnosed,
    ) -> None:
        self.name = name
        self.clock = clock
        self.observer = observer
        self.diagnose = diagnose
        self.offset = timedelta(0)
        self.reachable: bool | None = None
        """None until the first round trip was attempted; False while the last attempt got
        no answer (an error that is the database's answer leaves it True)."""
        self.condition = "unknown"
        """``ok`` after an answer; else the last error's condition (``Diagnosis``)."""
        self.condition_since: datetime | None = None
        self.last_error: str | None = None
        """The last error, kept after recovery (``last_error_at`` says when)."""
        self.last_error_at: datetime | None = None
        self._stamped: datetime | None = None
        """The latest of ``condition_since`` / ``last_error_at`` given out (see ``_stamp``)."""
        self.answered_at: float | None = None
        """The clock's monotonic time of the last answer (None: none yet)."""
        self._last_logged = -1e9
        self._maybe_moved = False
        self.moved = asyncio.Event()
        """Set when the loops get answers again after a failover-like error."""
        self.outages = 0
        """Outages seen (``OUTAGE_CONDITIONS``, a stall): a statement failed or hung."""
        self._working_since: float | None = None
        """Monotonic time of the first answer after the last outage (None: none since)."""
        self.recoveries = 0
        """Outages that ended (an answer came after one)."""
        self._on_recovery: list[Callable[[], None]] = []
        self.stall_after = math.inf
        """Seconds a statement may take before its answer counts as a stall of the database
        (``stall``; the scheduler sets it from its heartbeat settings)."""
        self._stalled_at: float | None = None
        """Monotonic time the last stall ended (None: none seen)."""

    def on_recovery(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever an answer ends an outage (a loop backing off may try
        again at once: the database is back)."""
        self._on_recovery.append(callback)

    def working_for(self) -> float:
        """Seconds the database has answered since the last outage this instance saw
        (``OUTAGE_CONDITIONS``, or a ``stalled`` statement): 0 during one, infinite when it
        saw none since it started."""
        if self.outages == 0:
            return math.inf
        if self._working_since is None:
            return 0.0
        return max(0.0, self.clock.monotonic() - self._working_since)

    def since_stall(self) -> float:
        """Seconds since the last stall ended (``stalled``; infinite when none was seen)."""
        if self._stalled_at is None:
            return math.inf
        return max(0.0, self.clock.monotonic() - self._stalled_at)

    def stall(self, began: float, where: str) -> bool:
        """A statement of ``where`` sent at monotonic time ``began`` got its answer now: when
        it took longer than ``stall_after``, count it as a stall (``stalled``). Whether it
        did."""
        took = self.clock.monotonic() - began
        if took <= self.stall_after:
            return False
        self.stalled(took, where)
        return True

    def stalled(self, seconds: float, where: str) -> None:
        """A statement of ``where`` got its answer only after ``seconds``: the database (or
        the way to it) hung meanwhile, for peers too; count it as an outage that ended now.
        Writes that hung meanwhile (a heartbeat, a claim) were committed only now, each with
        the time its statement began: a peer's rows read as old as the stall."""
        self.outages += 1
        self._working_since = self._stalled_at = self.clock.monotonic()
        log.warning(
            "scheduler %s: %s took %.1fs (the database stalled); judging no execution dead "
            "for %.1fs",
            self.name,
            where,
            seconds,
            self.stall_after,
            extra={"scheduler": self.name},
        )

    def now(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.clock.now() + self.offset

    def _stamp(self) -> datetime:
        """``now()`` for the status's times, never earlier than the last one given out: the
        estimate moves with each observed offset (by a few milliseconds on a loaded machine),
        and an error followed at once by a recovery must not read as ``ok`` since before it."""
        stamp = self.now()
        if self._stamped is not None and stamp < self._stamped:
            stamp = self._stamped
        self._stamped = stamp
        return stamp

    def observed(self, db_now: datetime, sent: datetime | None = None) -> None:
        """Learn the database clock's offset from ``now()`` read in a statement sent at local
        time ``sent``: ``now()`` is taken when the statement starts, so measuring against the
        time the answer arrived would make every later wake-up late by that round trip."""
        self.offset = db_now - (sent if sent is not None else self.clock.now())
        self.answered()

    def answered(self) -> None:
        """A statement got its answer: the database is reachable and works."""
        self.answered_at = self.clock.monotonic()
        if self.condition != "ok":
            if self.condition != "unknown":
                log.warning(
                    "scheduler %s: the database answers again (was: %s)", self.name, self.condition
                )
            self._set_condition("ok")
        self.reachable = True
        if self._working_since is None and self.outages:
            self._working_since = self.clock.monotonic()
            self.recoveries += 1
            for callback in self._on_recovery:
                callback()
        if self._maybe_moved:
            self._maybe_moved = False
            self.moved.set()

    def answered_within(self, seconds: float) -> bool:
        """The condition is ``ok`` and a statement got its answer in the last ``seconds``."""
        if self.condition != "ok" or self.answered_at is None:
            return False
        return self.clock.monotonic() - self.answered_at <= seconds

    def _set_condition(self, condition: str) -> None:
        if condition != self.condition:
            self.condition = condition
            self.condition_since = self._stamp()

    def report(self, condition: str, message: str) -> None:
        """A condition found without a failed statement (a missing table at startup, a
        crashed loop): shown like an error."""
        self.last_error = message
        self.last_error_at = self._stamp()
        self._set_condition(condition)

    def failed(self, error: BaseException, where: str, *, failover: bool = True) -> None:
        """A statement of ``where`` failed (the caller retries): record, count and log it.
        ``failover``: the error may mean the database moved (the listener's own loss does not
        count: it reconnects anyway)."""
        diagnosis = self.diagnose(error)
        self.last_error = f"{where}: {diagnosis.message}"
        self.last_error_at = self._stamp()
        if self.observer.active:
            self.observer.database_error(where, error)
        was = self.condition
        self.reachable = diagnosis.reachable
        self._set_condition(diagnosis.condition)
        if failover and diagnosis.condition in FAILOVER_CONDITIONS:
            self._maybe_moved = True
        if diagnosis.condition in OUTAGE_CONDITIONS:
            self.outages += 1
            self._working_since = None
        now = self.clock.monotonic()
        if was != diagnosis.condition or now - self._last_logged > _LOG_EVERY:
            self._last_logged = now
            log.error(
                "scheduler %s: database error during %s (will retry): %s",
                self.name,
                where,
                self.last_error,
                extra={"scheduler": self.name},
            )
