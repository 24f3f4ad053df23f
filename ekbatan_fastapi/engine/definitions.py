"""``Definitions``: what each job is, as stored in ``ekbatan_jobs`` (migration V0003), and which
schedule each recurring job runs by while instances of two application versions share the
table (a rolling deploy; the rule is in ``domain.rollout``).

At startup this instance reads the stored definitions of its jobs, writes its own where they
hold, and adopts the stored schedule where a newer version wrote it (``reconcile``). While it
runs, it re-reads the definitions written since it last looked: every heartbeat round, and at
most a second before it records a recurring job's run (``refresh``), so an older instance
follows a newer deploy instead of moving the row back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from ..domain.catchup import CatchUp
from ..domain.job import DistributedJob, Job
from ..domain.limits import JobLimits
from ..domain.logs import library_logger
from ..domain.rollout import Decision, decide
from ..domain.rows import JobDefinition
from ..domain.schedules import Schedule, parse_schedule
from ..store.jobs import JobsStore
from .config import SchedulerConfig
from .poller import paced

__all__ = ["PRE_COMPLETION_MAX_AGE", "Definitions", "definition_of", "fingerprint"]

log = library_logger(__name__)

PRE_COMPLETION_MAX_AGE = 1.0
"""Seconds the stored definitions may be old when a recurring job's run is recorded."""
_OVERLAP = timedelta(seconds=5)
"""Each re-read starts this long before the newest definition seen: a write that committed
after the last read can carry an older timestamp (its transaction started earlier)."""


def fingerprint(schedule: Schedule) -> str:
    """A short stable digest of a schedule (its db-scheduler form)."""
    return hashlib.sha256(schedule.describe().encode("utf-8")).hexdigest()[:32]


def definition_of(
    job: Job,
    limits: JobLimits,
    config: SchedulerConfig,
    written_by: str,
    schedule: Schedule | None = None,
    catch_up: CatchUp | None = None,
) -> JobDefinition:
    """What ``ekbatan_jobs`` says of one job (``written_at`` is the database's)."""
    if isinstance(job, DistributedJob):
        schedule = schedule if schedule is not None else job.schedule()
        catch_up = catch_up if catch_up is not None else job.catch_up()
    return JobDefinition(
        task_name=job.name(),
        kind="recurring" if schedule is not None else "one-time",
        schedule=schedule.describe() if schedule is not None else None,
        fingerprint=fingerprint(schedule) if schedule is not None else None,
        app_version=config.app_version,
        timeout=limits.timeout,
        max_concurrency=limits.max_concurrency,
        keyed=limits.concurrency_key is not None,
        written_by=written_by,
        written_at=datetime.now(UTC),
        catch_up=catch_up.describe() if catch_up is not None else None,
    )


class Definitions:
    """The stored definitions of this instance's jobs, and the schedules it runs them by: the
    one home of each recurring job's current schedule (``schedule``, ``current``), which the
    executor, the poller, startup and the read model ask for."""

    def __init__(
        self,
        *,
        name: str,
        jobs: Mapping[str, Job],
        schedules: Mapping[str, Schedule],
        catch_ups: Mapping[str, CatchUp],
        limits: Mapping[str, JobLimits],
        store: JobsStore,
        config: SchedulerConfig,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.name = name
        self.jobs = jobs
        self._current = dict(schedules)
        """Each recurring job's schedule it runs by now (its own, or an adopted one)."""
        self.local: Mapping[str, Schedule] = MappingProxyType(dict(schedules))
        """This instance's own schedules (what its code says)."""
        self.catch_ups = catch_ups
        self.limits = limits
        self.store = store
        self.config = config
        self._monotonic = config.clock.monotonic
        """The configured clock's monotonic time (the executor compares ``fresh_until`` with
        it)."""
        self.adopted: dict[str, JobDefinition] = {}
        """Recurring jobs run by a stored schedule a newer version wrote."""
        self._seen: datetime | None = None
        self._now = now if now is not None else (lambda: datetime.now(UTC))
        """The database's clock (the scheduler's estimate of it)."""
        self._read_at: datetime | None = None
        """The database's time when the last successful re-read began: what was written
        before it (less ``_OVERLAP``) that read saw."""
        self._handled: dict[str, datetime] = {}
        """The stored definitions already looked at, by job: their ``written_at``."""
        self._stamps: frozenset[datetime] = frozenset()
        """The ``written_at`` of this instance's writes at startup (one per batch of 1,000):
        a re-read leaves out its own rows with those stamps (100,000 definitions are not
        read back 10 s after start; another instance's write, even under the same name, has
        a stamp of its own)."""
        self._ours: dict[str, JobDefinition] | None = None
        self._refreshed = -1e9
        self.fresh_until = -1e9 if self.local else math.inf
        """Until when (``config.clock.monotonic()``) a re-read before a recording is not due:
        the executor compares it with that clock inline before awaiting ``refresh``
        (infinite: no job of this instance to re-read)."""
        self._refreshing: asyncio.Task[None] | None = None

    def schedule(self, name: str) -> Schedule | None:
        """The schedule ``name`` runs by now (None: not a recurring job of this instance)."""
        return self._current.get(name)

    def current(self) -> Mapping[str, Schedule]:
        """Every recurring job's schedule it runs by now (a read-only live view)."""
        return MappingProxyType(self._current)

    def ours(self) -> dict[str, JobDefinition]:
        """This instance's definition of each of its jobs (built once)."""
        if self._ours is None:
            self._ours = self._build()
        return self._ours

    def _build(self) -> dict[str, JobDefinition]:
        return {name: self._definition(name, job) for name, job in self.jobs.items()}

    async def _built(self) -> dict[str, JobDefinition]:
        """``ours``, built with turns of the event loop in between (100,000 jobs)."""
        if self._ours is None:
            self._ours = {
                name: self._definition(name, job) async for name, job in paced(self.jobs.items())
            }
        return self._ours

    def _definition(self, name: str, job: Job) -> JobDefinition:
        return definition_of(
            job,
            self.limits[name],
            self.config,
            self.name,
            self.local.get(name),
            self.catch_ups.get(name),
        )

    async def decisions(self) -> tuple[dict[str, Decision], dict[str, JobDefinition]] | None:
        """Whose definition holds for each job, and the stored ones (None: no table)."""
        if not self.jobs or not await self.store.look():
            return None
        stored = await self.store.definitions(list(self.jobs))
        ours = await self._built()
        return {name: decide(ours[name], stored.get(name)) async for name in paced(ours)}, stored

    async def reconcile(self) -> dict[str, Decision] | None:
        """At startup: write this instance's definitions where they hold, adopt the stored
        schedules where a newer version wrote them. None: the table is missing."""
        found = await self.decisions()
        if found is None:
            return None
        decisions, stored = found
        ours = await self._built()
        async for name, decision in paced(decisions.items()):
            if decision.warning:
                log.warning("%s", decision.warning, extra={"task_name": name})
            if not decision.ours:
                self._adopt(name, stored[name], decision)
        written = await self.store.write([ours[n] for n, d in decisions.items() if d.write])
        self._note_seen(stored.values())
        self._handled.update(written)  # its own: not to decide again at the next re-read
        self._stamps = frozenset(written.values())
        self._mark_refreshed(self._monotonic())
        return decisions

    def _note_seen(self, definitions: Iterable[JobDefinition]) -> None:
        for d in definitions:
            self._handled[d.task_name] = d.written_at
            if self._seen is None or d.written_at > self._seen:
                self._seen = d.written_at

    def _adopt(self, name: str, stored: JobDefinition, decision: Decision) -> None:
        if name not in self.local or stored.schedule is None:
            return
        if self.adopted.get(name) == stored:
            return
        try:
            schedule = parse_schedule(stored.schedule).bind(name)
        except Exception as error:
            log.error(
                "%s: cannot read the schedule %r stored by version %s (%s); running it by "
                "this instance's own schedule",
                name,
                stored.schedule,
                stored.app_version,
                error,
                extra={"task_name": name},
            )
            return
        self._current[name] = schedule
        self.adopted[name] = stored
        log.info(
            "%s runs by the schedule %s that %s stored (%s); this instance's own is %s",
            name,
            stored.schedule,
            stored.written_by,
            decision.reason,
            self.local[name].describe(),
            extra={"task_name": name},
        )

    async def refresh(self, max_age: float = 0.0) -> None:
        """Re-read the definitions written since the last look (at most every ``max_age``
        seconds; concurrent callers share one read). A failure is logged and ignored: the
        next round tries again."""
        if not self.local or not self.store.presence.present:
            return
        if self._monotonic() - self._refreshed < max_age:
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    def _mark_refreshed(self, at: float) -> None:
        self._refreshed = at
        if self.local:
            self.fresh_until = at + PRE_COMPLETION_MAX_AGE

    async def close(self) -> None:
        """At a stop: end a shared re-read still running (its callers, cancelled, left it
        behind holding a connection)."""
        task, self._refreshing = self._refreshing, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _refresh(self) -> None:
        started, read_at = self._monotonic(), self._now()
        # From the newest definition seen, or from when the last read began, whichever is
        # later: definitions all written together (at a deploy) are not read again and again.
        floors = [t for t in (self._seen, self._read_at) if t is not None]
        since = max(floors) - _OVERLAP if floors else None
        try:
            found = await self.store.definitions(
                since=since, not_written_by=(self.name, self._stamps)
            )
        except Exception as error:
            log.debug("%s: could not re-read the job definitions: %s", self.name, error)
            return
        self._read_at = read_at
        self._mark_refreshed(started)
        changed = [
            d
            for d in found.values()
            if d.task_name in self.local and self._handled.get(d.task_name) != d.written_at
        ]
        ours = self.ours() if changed else {}
        for stored in changed:
            name = stored.task_name
            decision = decide(ours[name], stored)
            if decision.ours:
                if self.adopted.pop(name, None) is not None:
                    self._current[name] = self.local[name]
                    log.info("%s runs by this instance's own schedule again", name)
            else:
                self._adopt(name, stored, decision)
        self._note_seen(found.values())
