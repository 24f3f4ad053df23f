"""The read budget of the unauthenticated routes (``/jobs``, its history, the dashboard).

Anyone who reaches ``/jobs`` may send it as many requests as they like; the scheduler's own
work (claims, heartbeats, completions) must never wait behind them. So the web reads:

* have a **pool of their own** (``ekbatan.jobs.web-read-pool-size`` connections, default 2),
  built from the same URL and settings as the scheduler's, and never touch the scheduler's
  connections (with an engine the application made, they share it: see SECURITY.md);
* pass a **gate** of that many reads at once; a read that finds the gate full waits at most
  ``QUEUE_WAIT`` seconds (and only a few may wait), then is answered ``429`` with
  ``Retry-After``, at once;
* are **shared**: concurrent requests for the same page wait for one read, and its answer
  serves every request for ``ekbatan.jobs.web-report-cache`` (default 1 s) more, rendered
  once (the JSON body or the page), so a flood costs one read per page per second; while the
  gate is full, a page read within the last ``STALE_LIMIT`` seconds serves again rather than
  a 429 (a readiness probe keeps answering through a flood of other pages), but only while
  the reads move or the database answers the scheduler: when the reads in the gate have had no
  answer for ``STUCK_AFTER`` seconds and the scheduler has had none since they began either (a
  silent network, a frozen server), the answer is ``503`` rather than an old ``200``.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import HTTPException
from sqlalchemy.engine import URL

from ..client import SchedulerClient
from ..domain.logs import library_logger
from ..registry import JobRegistry
from ..settings import EkbatanSettings
from ..store.connection import ConnectionProvider
from ..store.dialects import open_store

__all__ = [
    "QUEUE_WAIT",
    "STALE_LIMIT",
    "STUCK_AFTER",
    "ReadBusy",
    "ReadsStuck",
    "WebReads",
    "open_web_reads",
    "reads_of",
]

log = library_logger(__name__)

T = TypeVar("T")

QUEUE_WAIT = 0.25
"""Seconds a read waits for the gate before it is answered 429."""
_WAITERS_PER_READ = 4
"""At most this many reads per gate place may wait; more are answered 429 at once."""
_MAX_ENTRIES = 512
"""Pages remembered at once (the oldest are dropped first)."""
STALE_LIMIT = 10.0
"""Seconds an answer may serve again while the gate is full (then: 429)."""
RETRY_AFTER = 1
STUCK_AFTER = 1.0
"""Seconds after which reads that hold the gate without an answer count as stuck."""


class ReadsStuck(HTTPException):
    """503: the reads that hold the gate got no answer, and neither did the scheduler."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            503,
            detail=(
                f"database unreachable: the report's reads got no answer for {seconds:.1f} s, "
                "and the scheduler's own connections none since (a silent network or a "
                "frozen server); an older answer is not served"
            ),
            headers={"Retry-After": str(RETRY_AFTER)},
        )


class ReadBusy(HTTPException):
    """429: the read budget is in use; try again in a second."""

    def __init__(self, size: int) -> None:
        super().__init__(
            429,
            detail=(
                f"busy: {size} report(s) are being read from the database already (the read "
                "budget of the unauthenticated routes, ekbatan.jobs.web-read-pool-size); "
                f"retry after {RETRY_AFTER} s"
            ),
            headers={"Retry-After": str(RETRY_AFTER)},
        )


@dataclass
class _Entry:
    task: asyncio.Task[Any]
    expires: float = float("inf")
    """Loop time after which a finished read no longer answers (inf: still running)."""
    built: float = float("inf")
    """Loop time its answer was read from the database (inf: still running)."""

    def answered(self) -> bool:
        return self.task.done() and not self.task.cancelled() and self.task.exception() is None


class WebReads:
    """The read budget: a client on the reads' own pool, a gate, and one-flight answers."""

    def __init__(
        self,
        client: SchedulerClient,
        size: int,
        *,
        cache_seconds: float = 1.0,
        provider: ConnectionProvider | None = None,
        vouch: Callable[[float], bool] | None = None,
    ) -> None:
        self.client = client
        """Reads through the web reads' pool (or the scheduler's, see ``open_web_reads``)."""
        self.size = size
        self.cache_seconds = cache_seconds
        self.provider = provider
        """The reads' own pool, closed by ``close()``; None when they share the scheduler's."""
        self.vouch = vouch
        """``vouch(s)``: the scheduler's connections got an answer in the last ``s`` seconds
        (``DatabaseLink.answered_within``); None: nothing vouches, stale answers never serve
        past ``STUCK_AFTER``."""
        self._gate = asyncio.Semaphore(size)
        self._holding: dict[int, float] = {}
        """Loop time each read in the gate got its place (by a token of its own)."""
        self._waiting = 0
        self._entries: dict[Hashable, _Entry] = {}

    @property
    def separate(self) -> bool:
        """The reads have a pool of their own."""
        return self.provider is not None

    async def close(self) -> None:
        for entry in self._entries.values():
            entry.task.cancel()
        self._entries.clear()
        if self.provider is not None:
            await self.provider.dispose()

    def forget(self) -> None:
        """Read afresh from now on (an admin action changed what the pages show); reads in
        flight finish for the requests that wait for them."""
        self._entries.clear()

    @contextlib.asynccontextmanager
    async def _place(self) -> AsyncIterator[None]:
        """A place at the gate, or ReadBusy: after ``QUEUE_WAIT`` s, or at once when enough
        reads wait already."""
        if self._gate.locked() and self._waiting >= _WAITERS_PER_READ * self.size:
            raise ReadBusy(self.size)
        self._waiting += 1
        try:
            async with asyncio.timeout(QUEUE_WAIT):
                await self._gate.acquire()
        except TimeoutError:
            raise ReadBusy(self.size) from None
        finally:
            self._waiting -= 1
        token = object()
        self._holding[id(token)] = asyncio.get_running_loop().time()
        try:
            yield
        finally:
            del self._holding[id(token)]
            self._gate.release()

    def _stale_may_serve(self) -> None:
        """Nothing, when an older answer may serve while the gate is full: the reads in it
        move (the oldest began less than ``STUCK_AFTER`` s ago), or the database answered the
        scheduler since the oldest began. Else ReadsStuck."""
        if not self._holding:
            return
        stuck = asyncio.get_running_loop().time() - min(self._holding.values())
        if stuck < STUCK_AFTER or (self.vouch is not None and self.vouch(stuck)):
            return
        raise ReadsStuck(stuck)

    async def read(
        self, key: Hashable, build: Callable[[], Awaitable[T]], *, gated: bool = True
    ) -> T:
        """``build()``'s result for ``key``: the one being built or built within the cache
        interval, else a new one (through the gate when ``gated``: it reads the database).
        When the gate is full, an answer for ``key`` read within ``STALE_LIMIT`` seconds
        serves again (a readiness probe keeps its answer through a flood of other pages);
        without one, ReadBusy. A failed build is not kept; every request waiting for it gets
        its exception."""
        loop = asyncio.get_running_loop()
        entry = self._entries.get(key)
        if entry is None or (entry.task.done() and loop.time() >= entry.expires):
            stale = entry if entry is not None and entry.answered() else None
            entry = self._start(key, build, gated, stale)
        result: T = await asyncio.shield(entry.task)
        return result

    def _start(
        self,
        key: Hashable,
        build: Callable[[], Awaitable[T]],
        gated: bool,
        stale: _Entry | None,
    ) -> _Entry:
        loop = asyncio.get_running_loop()
        if len(self._entries) >= _MAX_ENTRIES:
            now = loop.time()
            for old in [k for k, e in self._entries.items() if now - e.built > STALE_LIMIT]:
                del self._entries[old]
            while len(self._entries) >= _MAX_ENTRIES:  # still full: drop the oldest
                self._entries.pop(next(iter(self._entries)))
        built: list[float] = []

        async def run() -> T:
            if not gated:
                return await build()
            try:
                async with self._place():
                    return await build()
            except ReadBusy:
                if stale is None or loop.time() - stale.built > STALE_LIMIT:
                    raise
                self._stale_may_serve()
                built.append(stale.built)
                result: T = stale.task.result()
                return result

        entry = _Entry(asyncio.ensure_future(run()))
        self._entries[key] = entry

        def settled(task: asyncio.Task[Any]) -> None:
            if task.cancelled() or task.exception() is not None:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            else:
                entry.built = built[0] if built else loop.time()
                entry.expires = loop.time() + self.cache_seconds

        entry.task.add_done_callback(settled)
        return entry


def open_web_reads(
    registry: JobRegistry, settings: EkbatanSettings, url: str | URL | None
) -> WebReads:
    """The read budget of ``registry``'s application. With the URL its pool was built from,
    the reads get a pool of their own, built the same way (the pooler and the session bounds
    of ``registry``'s pool); without one (an engine or a provider the application made), they
    share the scheduler's pool, still through the gate. Opens no connection."""
    knobs = settings.jobs.config
    size = knobs.web_read_pool_size
    cache = knobs.web_report_cache.total_seconds()
    options = registry.connection.options
    vouch = registry.scheduler.link.answered_within
    if url is None or options is None:
        return WebReads(registry.client, size, cache_seconds=cache, vouch=vouch)
    provider = ConnectionProvider.from_url(
        url,
        pool_size=size,
        pooler=options.pooler,
        idle_transaction_timeout=options.idle_transaction_timeout,
    )
    db = registry.store.db
    store = open_store(
        provider.engine,
        registry.store.dialect,
        db.tables.table_name,
        statement_timeout=db.statement_timeout,
    )
    client = SchedulerClient(store, registry.jobs, dead_after=registry.config.dead_after)
    return WebReads(client, size, cache_seconds=cache, provider=provider, vouch=vouch)


_SHARED: weakref.WeakKeyDictionary[JobRegistry, WebReads] = weakref.WeakKeyDictionary()


def reads_of(state: Any) -> WebReads:
    """The read budget of a running integration (``EkbatanState``): the lifespan's, or for a
    state built by hand a gate on the scheduler's pool (made once per registry)."""
    reads: WebReads | None = state.reads
    if reads is not None:
        return reads
    registry: JobRegistry = state.registry
    if registry not in _SHARED:
        _SHARED[registry] = open_web_reads(registry, state.settings, None)
    return _SHARED[registry]
