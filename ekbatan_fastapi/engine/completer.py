"""``Completer``: records the results of executions in batches, each write guarded by the
claimed version, with their history (in the same statement where the dialect can), and tells
the observers; a write that fails is retried with backoff until it gets an answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from ..domain.job import RECURRING_INSTANCE
from ..domain.logs import library_logger
from ..domain.records import ExecutionRecord
from ..domain.rows import Finish, FinishKind, TaskKey
from ..store.tasks import HistoryTableMissing, HistoryUnwritable, TaskStore
from .alarm import Alarm
from .backoff import Backoff
from .config import SchedulerConfig
from .execution import Execution
from .history import HistoryRecorder
from .link import DatabaseLink
from .logs import log_extra
from .observer import ObserverDispatch, finished_event
from .running import RunningExecutions
from .slots import SlotCounter

__all__ = ["Completer"]

log = library_logger(__name__)

MAX_BATCH = 1000
"""Results per completion statement."""


class _WriteFailed(Exception):
    """A completion statement failed (the database's error is its cause)."""


@dataclass
class _Batch:
    """The results of one completion statement."""

    items: list[tuple[Finish, Execution]]
    current: list[Finish]
    """The results sent: only the newest claim of each row (see ``Completer._next_batch``)."""
    newest: dict[TaskKey, int]
    history_inline: bool = False
    """Its history went with the completion statement (decided when it was sent)."""


class Completer:
    """Takes results from the executor and writes them."""

    def __init__(
        self,
        *,
        name: str,
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        running: RunningExecutions,
        history: HistoryRecorder,
        observer: ObserverDispatch,
        limited: set[str] | None = None,
        counter: SlotCounter | None = None,
    ) -> None:
        self.name = name
        self.tasks = tasks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.running = running
        self.history = history
        self.observer = observer
        self.counter = counter
        """Counts the slots catch-up policies decided (None: not counted)."""
        self.limited = limited or set()
        """Jobs with a concurrency limit: an execution of one that ends frees a place."""
        self.pending: list[tuple[Finish, Execution]] = []
        """Results handed over and not yet written, oldest first."""
        self.lease = tasks.db.lease()
        self._ready = asyncio.Event()
        self.closed = False
        self._retrying = False
        """The last attempt failed: it may have committed, its answer lost."""
        self._history_refused = False
        """The database refused this batch's history: send it without."""

    def submit(self, finish: Finish, execution: Execution) -> None:
        """Queue one result (no I/O)."""
        if self.closed:
            log.warning(
                "%s finished after shutdown; its row stays picked and is revived later",
                execution.label,
                extra=log_extra(execution.row, self.name),
            )
            return
        execution.recording = True
        self.pending.append((finish, execution))
        self._ready.set()

    def settled(self, finish: Finish, execution: Execution) -> None:
        """A result ``ctx.transaction()`` committed with the effects: nothing to write, only
        what follows a recorded result (no I/O)."""
        execution.recording = True
        self._after_write(finish, execution, True, ambiguous=False)
        if not execution.history_written:
            self.history.record(execution, finish, True)
        self.running.recorded()
        if self.counter is not None and self.counter.pending:
            self._ready.set()

    async def _room_freed(self, finishes: Iterable[Finish]) -> None:
        """A limited job's execution ended: its place is free. Claim again here, and (where
        the dialect can) tell every instance, so that waiting work does not wait for a
        polling interval."""
        if not self.limited or not any(f.owned.task_name in self.limited for f in finishes):
            return
        self.alarm.request_poll()
        if self.tasks.supports_notify:
            try:
                await self.tasks.notify(None)
            except Exception as error:  # only a wake-up: the next poll finds the work anyway
                log.debug("could not notify the cluster of a freed place: %s", error)

    def close(self) -> None:
        """Let ``run`` return once everything pending is written (at shutdown)."""
        self.closed = True
        self._ready.set()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.lease.release()

    async def _run(self) -> None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while True:
            if not self.pending:
                if self.counter is not None and self.counter.pending:
                    await self.counter.flush()
                if self.closed:
                    return
                self.lease.idle()
                await self._ready.wait()
                self._ready.clear()
                continue
            batch = self._next_batch()
            try:
                recorded = await self._write(batch)
            except _WriteFailed:
                await asyncio.sleep(backoff.next())
                continue
            if recorded is None:
                continue
            self.link.answered()
            backoff.reset()
            ambiguous, self._retrying, self._history_refused = self._retrying, False, False
            del self.pending[: len(batch.items)]
            self._settle(batch, recorded, ambiguous)
            self.running.recorded()
            await self._room_freed(f for f, _ in batch.items)

    def _next_batch(self) -> _Batch:
        items = self.pending[:MAX_BATCH]
        # After an outage a row revived and claimed again by this instance can have a stale
        # result and a fresh one pending together. Only the newest claim can still match the
        # row's version, and the store answers with keys: the older results are not sent,
        # and count as superseded.
        newest: dict[TaskKey, int] = {}
        repeated = False
        for finish, _ in items:
            owned = finish.owned
            key = (owned.task_name, owned.task_instance)
            seen = newest.get(key)
            if seen is None:
                newest[key] = owned.version
            else:
                repeated = True
                newest[key] = max(seen, owned.version)
        if not repeated:
            return _Batch(items, [f for f, _ in items], newest)
        current = [f for f, _ in items if f.owned.version == newest[f.owned.key]]
        return _Batch(items, current, newest)

    @property
    def _history_inline(self) -> bool:
        """Whether this batch's history goes with the completion statement."""
        return (
            self.tasks.writes_history_with_finish
            and self.history.enabled
            and not self._history_refused
        )

    async def _write(self, batch: _Batch) -> set[TaskKey] | None:
        """Send one batch; the keys recorded, or None to send it again at once (its history
        could not be written). ``_WriteFailed``: the database failed; try again after a
        backoff."""
        batch.history_inline = self._history_inline
        history: list[ExecutionRecord] = (
            [e.record(f) for f, e in batch.items] if batch.history_inline else []
        )
        try:
            with self.observer.statement_scope("complete", len(batch.current)):
                return await self.tasks.finish(
                    batch.current,
                    lease=self.lease,
                    history=history,
                    picked_by=self.name,
                    retry=self._retrying,
                )
        except HistoryTableMissing as error:
            self.history.table_lost(error)
        except HistoryUnwritable as error:
            # Nothing was written: send the results again at once, without their history.
            self.history.dropped(len(history), error)
            self._history_refused = True
        except Exception as error:
            self.link.failed(error, "recording results")
            self._retrying = True
            raise _WriteFailed from error
        return None

    def _settle(self, batch: _Batch, recorded: set[TaskKey], ambiguous: bool) -> None:
        """After a batch was written: forget its executions, buffer their history (where the
        completion did not write it), tell the observers, and plan the next slots."""
        for finish, execution in batch.items:
            key = execution.row.key
            ok = key in recorded and finish.owned.version == batch.newest[key]
            if not batch.history_inline:
                self.history.record(execution, finish, ok)
            self._after_write(finish, execution, ok, ambiguous=ambiguous)

    def _after_write(
        self, finish: Finish, execution: Execution, ok: bool, *, ambiguous: bool
    ) -> None:
        """One result written (``ok``) or found superseded: forget the execution, tell the
        observers, plan the recurring row's next slot."""
        self.running.forget(execution)
        if self.observer.active and finish.kind is not FinishKind.SKIPPED:  # not an execution
            self.observer.execution_finished(finished_event(execution, finish, ok))
        if not ok:
            log.warning(
                "%s (slot %s) finished, but its row was revived by another instance "
                "meanwhile: result not recorded%s",
                execution.label,
                execution.row.execution_time.isoformat(),
                " (or recorded by an earlier attempt of this write whose answer was "
                "lost to the database error)"
                if ambiguous
                else "",
                extra=log_extra(execution.row, self.name),
            )
        else:
            if self.counter is not None:
                self.counter.count(execution, finish)
            if finish.next_time is not None and finish.owned.task_instance == RECURRING_INSTANCE:
                self.alarm.note_due(finish.next_time)
