"""``Poller``: claims due rows in batches and hands them to the executor; sleeps until the
earliest known due time or the polling interval, whichever is sooner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from ..domain.logs import library_logger
from ..domain.rows import PollingStrategy, PollResult
from ..store.limited import Limit, poll_limited
from ..store.tasks import TaskStore
from .alarm import Alarm
from .backoff import Backoff
from .config import SchedulerConfig
from .executor import Executor
from .history import HistoryRecorder
from .link import DatabaseLink
from .observer import ObserverDispatch
from .running import RunningExecutions, RunState

__all__ = ["CLAIM_CHUNK", "Poller"]

log = library_logger(__name__)

CLAIM_CHUNK = 100
"""Rows one poll statement claims at most; with more room the poller polls again at once. When
many rows come due together (1,000 recurring jobs in the same second), every instance polling
then gets a share instead of the first poll taking them all, and the first executions start
after a 100-row claim, not after one of thousands. The batch size (how many run at once)
is unchanged."""

_CONTENDED_FLOOR = 0.005
"""Seconds before looking again at a due row a peer's lock hid (doubling up to the interval)."""


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
        running: RunningExecutions,
        executor: Executor,
        history: HistoryRecorder,
        observer: ObserverDispatch,
    ) -> None:
        self.name = name
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

    async def _poll(self, limit: int) -> PollResult:
        """Claim up to ``limit`` due rows: the unlimited jobs' in one statement, then the
        limited jobs' in a transaction that counts their running executions."""
        skip_paused = self.history.available
        result = PollResult([], self.link.now(), None)
        if self.names:
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
        )

    async def poll_once(self, limit: int) -> PollResult:
        """One claim as ``run`` makes it, without its sleeps and retries (an error propagates):
        claim up to ``limit`` due rows, learn the database clock, launch what was claimed.
        ``ekbatan_fastapi.testing.TimeMachine`` drives the scheduler by it."""
        sent = self.config.clock.now()
        with self.state.claim():
            result = await self._poll(limit)
            self.link.observed(result.db_now, sent)
            self.state.last_poll = result.db_now
            for row in result.claimed:
                self.executor.launch(row)
        return result

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.lease.release()

    async def _run(self) -> None:
        interval = self.config.polling_interval.total_seconds()
        backoff = Backoff(interval)
        contended = Backoff(interval, floor=_CONTENDED_FLOOR)
        clock = self.config.clock
        ahead = self.config.claim_ahead
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
            began = clock.monotonic()
            sent = clock.now()
            failed = False
            with self.state.claim():
                try:
                    with self.observer.statement_scope("poll", limit):
                        result = await self._poll(limit)
                        if self.observer.active:
                            self.observer.polled(clock.monotonic() - began, len(result.claimed))
                except Exception as error:
                    self.state.claim_failed_at = clock.monotonic()
                    self.link.failed(error, "poll")
                    failed = True
            if failed:
                # Backing off is not claiming: the housekeeper may release what the failed
                # claim left picked meanwhile, and /jobs may judge this instance's rows.
                await self.alarm.sleep(backoff.next())
                continue
            backoff.reset()
            self.link.observed(result.db_now, sent)
            self.state.last_poll = result.db_now
            for row in result.claimed:
                self.executor.launch(row)
            # More may be due: a full batch claimed, or (fetch) a full batch seen of which peers
            # won some; sleeping now would leave a full table to the winners for a whole interval.
            if len(result.claimed) >= limit or result.more_due:
                continue
            if result.next_due is not None and result.next_due <= result.db_now + ahead:
                # A due row this poll did not get: a peer's lock hid it, which is a claim in
                # flight or only a peer's scan. Look again soon, backing off in case the lock
                # is long held, rather than leave the slot to the next polling interval. (The
                # alarm wakes ``claim_ahead`` before a planned due time.)
                wait = timedelta(seconds=contended.next())
                self.alarm.planned_due = result.db_now + ahead + wait
            else:
                contended.reset()
                self.alarm.planned_due = result.next_due
            await self.lease.release()  # nothing more due now: an idle poller holds no connection
            await self.alarm.sleep(interval)
