"""``HistoryRecorder``: the operations tables for one scheduler: execution history in batches,
its instance row, and the pruning of both.

On PostgreSQL the history is written by the completion statement itself (one statement per
batch of results writes both). Elsewhere it is written off the hot path: the completer only
appends to a buffer; this recorder's own loop inserts the buffer in one statement per batch.
Whether the tables exist is the operations store's to know (``OperationsStore.look``); this
recorder warns once while they are missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..domain.logs import library_logger
from ..domain.rows import ExecutionRecord, Finish
from ..domain.version import VERSION
from ..store.operations import OperationsStore
from .poller import Backoff

if TYPE_CHECKING:
    from .execution import Execution

__all__ = ["HistoryRecorder"]

log = library_logger(__name__)

_MAX_BATCH = 1000
_LINGER = 0.1
"""Seconds the writer waits for a batch to fill: one statement per 1000 records or 100 ms,
not one per completion batch (a statement's fixed cost dominates small inserts)."""
_MAX_BUFFER = 50_000
_INSTANCE_RETENTION = timedelta(days=1)
PRUNE_BATCH = 5000
"""History records one retention batch deletes (at most, ties at its edge aside)."""
PRUNE_PAUSE = 0.1
"""Seconds, at least, between two retention batches."""
PRUNE_PAUSE_FACTOR = 9.0
"""The pause after a batch is this many times the batch's time (at least ``PRUNE_PAUSE``):
retention keeps at most a tenth of one connection busy (on a 2-core MariaDB a quarter
still cost the completions 0.6x of their rate while it ran)."""
PRUNE_SLOW_BATCH = 0.25
"""A retention batch slower than this (seconds) halves the next one."""
_PRUNE_MIN_BATCH = 100


class HistoryRecorder:
    """History, instance row and their pruning, for one scheduler."""

    def __init__(
        self,
        ops: OperationsStore,
        scheduler_name: str,
        *,
        history: bool,
        retention: timedelta,
        on_db_error: Callable[[BaseException, str], None],
        retry_cap: float = 5.0,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        self.ops = ops
        self.retry_cap = retry_cap
        """Seconds the history writer waits at most between attempts while the database
        fails (the scheduler's polling interval)."""
        self.name = scheduler_name
        self.library_version = VERSION
        """Written in this instance's row (the liveness watch appends ``LIVENESS_MARK`` while
        this instance holds its liveness lock)."""
        self.history_enabled = history
        self.retention = retention
        self._on_db_error = on_db_error
        self._on_answer = on_answer
        """Called when a write of this instance's row got its answer (the database works)."""
        self._buffer: list[ExecutionRecord] = []
        self._ready = asyncio.Event()
        self._full = asyncio.Event()
        self._dropped = 0
        self._warned_missing = False
        self._closing = False
        self._prune_due = asyncio.Event()

    @property
    def available(self) -> bool:
        """The operations tables were found."""
        return self.ops.presence.present

    async def check(self) -> bool:
        """Look for the tables (at startup, then at most every 30 s until they are found);
        warn once while they are missing."""
        if await self.ops.look():
            return True
        if not self._warned_missing:
            self._warned_missing = True
            log.warning(
                "scheduler %s: the operations tables (%s) are missing, so execution history, "
                "pause/resume and the live-instance list are off; run `ekbatan-jobs migrate` "
                "(it applies ekbatan_fastapi/migrations/%s/V0002__ekbatan_operations.sql, "
                "installed with the package) or call create_schema(engine)",
                self.name,
                ", ".join(t.name for t in self.ops.tables.operations),
                self.ops.db.migrations_folder,
                extra={"scheduler": self.name},
            )
        return False

    @property
    def enabled(self) -> bool:
        """History is on and its table exists."""
        return self.history_enabled and self.ops.presence.present

    def table_lost(self, error: BaseException) -> None:
        """The history table went away while running: stop writing history until the hourly
        housekeeping finds the operations tables again."""
        self.ops.forget()
        self._warned_missing = False
        log.warning(
            "scheduler %s: the execution history table is gone (%s); history is off until it "
            "is back",
            self.name,
            error,
            extra={"scheduler": self.name},
        )

    def dropped(self, count: int, error: BaseException) -> None:
        """The database refused a batch's history (its results are sent without it)."""
        self._dropped += count
        log.warning(
            "scheduler %s: the database refused the history of %d executions (%s); their "
            "results are recorded without it",
            self.name,
            count,
            error,
            extra={"scheduler": self.name},
        )

    def record(self, execution: Execution, finish: Finish, recorded: bool) -> None:
        """Buffer one execution's record (no I/O)."""
        if self.enabled:
            self.add(execution.record(finish, recorded))

    def add(self, record: ExecutionRecord) -> None:
        """Buffer one record (no I/O)."""
        if not self.enabled:
            return
        if len(self._buffer) >= _MAX_BUFFER:
            self._dropped += 1
            if self._dropped in (1, 1000) or self._dropped % 100_000 == 0:
                log.warning(
                    "scheduler %s: history buffer full (database slow or down); %d records "
                    "dropped so far",
                    self.name,
                    self._dropped,
                )
            return
        self._buffer.append(record)
        self._ready.set()
        if len(self._buffer) >= _MAX_BATCH:
            self._full.set()

    async def run(self) -> None:
        """The history writer loop: insert whatever the buffer holds, in batches."""
        backoff = Backoff(self.retry_cap)
        while True:
            if self._closing and not self._buffer:
                return
            await self._ready.wait()
            self._ready.clear()
            if not self._closing and len(self._buffer) < _MAX_BATCH:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LINGER):
                        await self._full.wait()
            self._full.clear()
            while self._buffer:
                batch = self._buffer[:_MAX_BATCH]
                try:
                    await self.ops.insert_history(batch)
                except Exception as error:
                    self._on_db_error(error, "writing execution history")
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
                del self._buffer[: len(batch)]

    @property
    def pending(self) -> int:
        """Records buffered and not yet written."""
        return len(self._buffer)

    def close(self) -> None:
        """Let ``run`` return once the buffer is written (at shutdown)."""
        self._closing = True
        self._ready.set()
        self._full.set()

    async def report_instance(self, started_at: datetime) -> None:
        if not self.available:
            return
        try:
            await self.ops.report_instance(
                self.name, socket.gethostname()[:255], os.getpid(), started_at, self.library_version
            )
        except Exception as error:
            self._on_db_error(error, "reporting this instance")
            return
        if self._on_answer is not None:
            self._on_answer()

    async def leave(self) -> None:
        """Remove this instance's row at a graceful stop (a crashed one shows as dead)."""
        if not self.available:
            return
        try:
            await self.ops.remove_instance(self.name)
        except Exception as error:
            self._on_db_error(error, "removing this instance's row")

    async def maintain(self) -> None:
        """Prune long-gone instances, look again for missing tables, and wake the retention
        loop (``retain``), which prunes the history in paced batches: a big first prune takes
        minutes and must not hold up the housekeeper's heartbeats."""
        if not await self.check():
            return
        gone = await self.ops.prune_instances(_INSTANCE_RETENTION)
        if gone:
            log.info("scheduler %s: pruned %d instances", self.name, gone)
        self._prune_due.set()

    async def retain(self) -> None:
        """The retention loop: each time ``maintain`` asks (hourly), prune the history."""
        while True:
            await self._prune_due.wait()
            self._prune_due.clear()
            try:
                pruned = await self.prune()
            except Exception as error:
                self._on_db_error(error, "pruning execution history")
                continue
            if pruned:
                log.info(
                    "scheduler %s: pruned %d history records older than %s",
                    self.name,
                    pruned,
                    self.retention,
                    extra={"scheduler": self.name},
                )

    async def prune(
        self,
        *,
        batch_size: int = PRUNE_BATCH,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> int:
        """Delete the records older than the retention in batches, oldest first: each batch
        is two short statements in transactions of their own, followed by a pause of nine
        times what the batch took (at least ``PRUNE_PAUSE``), so retention keeps at most a
        tenth of one connection busy and never holds a lock for long. A batch slower than
        ``PRUNE_SLOW_BATCH`` seconds halves the next one (a loaded server); fast ones grow it
        back. ``on_batch(deleted, seconds)``: each batch's size and time (benchmarks)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive number of records, got {batch_size!r}")
        cutoff = await self.ops.history_cutoff(self.retention)
        size, total, after = batch_size, 0, None
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            deleted, after = await self.ops.prune_history_batch(cutoff, after, size)
            took = loop.time() - began
            total += deleted
            if on_batch is not None:
                on_batch(deleted, took)
            if after is None:
                return total
            if took > PRUNE_SLOW_BATCH:
                size = max(_PRUNE_MIN_BATCH, size // 2)
            elif took < PRUNE_SLOW_BATCH / 4:
                size = min(batch_size, size * 2)
            await asyncio.sleep(max(PRUNE_PAUSE, PRUNE_PAUSE_FACTOR * took))
