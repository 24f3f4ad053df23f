"""``Completer``: records the results of executions in batches, each write guarded by the
claimed version, with their history (in the same statement where the dialect can), and tells
the observers; a write that fails is retried with backoff until it gets an answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..domain.job import RECURRING_INSTANCE
from ..domain.logs import library_logger
from ..domain.rows import KIND_SKIPPED, ExecutionRecord, Finish, TaskKey
from ..store.tasks import HistoryTableMissing, HistoryUnwritable, TaskStore
from .config import SchedulerConfig
from .execution import Execution
from .history import HistoryRecorder
from .logs import log_extra
from .observer import ObserverDispatch, finished_event
from .poller import Alarm, Backoff, DatabaseLink
from .running import Capacity
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
        running: Capacity,
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
        pending = self.pending
        pending.append((finish, execution))
        if len(pending) == 1:  # the loop waits only when nothing is pending (``run``)
            self._ready.set()

    def settled(self, finish: Finish, execution: Execution) -> None:
        """A result ``ctx.transaction()`` committed with the effects: nothing to write, only
        what follows a recorded result (no I/O)."""
        execution.recording = True
        self.running.recorded((execution,))
        self._settle([(finish, execution)], None, ambiguous=False, history=False)
        if not execution.history_written:
            self.history.record(execution, finish, True)
        if (counter := self.counter) is not None and (counter.pending or counter.streaks):
            self._ready.set()

    async def _room_freed(self, finishes: Iterable[Finish]) -> None:
        """A limited job's execution ended: its place is free. Claim again here, and (where
        the dialect can) tell every instance, so that waiting work does not wait for a
        polling interval."""
        if not any(f.owned.task_name in self.limited for f in finishes):
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
        """The completer's loop: write what is pending, in batches, until closed."""
        backoff = Backoff(self.config.polling_interval.total_seconds())
        failed = False
        try:
            while True:
                if not self.pending:
                    counter = self.counter  # its ``waiting``, written out (once per batch)
                    if counter is not None and (counter.pending or counter.streaks):
                        await counter.flush()
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
                    failed = True
                    await asyncio.sleep(backoff.next())
                    continue
                if recorded is None:
                    continue
                self.link.answered()
                if failed:
                    failed = False
                    backoff.reset()
                ambiguous, self._retrying, self._history_refused = self._retrying, False, False
                del self.pending[: len(batch.items)]
                self.running.recorded([e for _, e in batch.items])
                self._settle(
                    batch.items, (recorded, batch), ambiguous, history=not batch.history_inline
                )
                if self.limited:
                    await self._room_freed(f for f, _ in batch.items)
        finally:
            await self.lease.release()

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

    async def _write(self, batch: _Batch) -> set[TaskKey] | None:
        """Send one batch; the keys recorded, or None to send it again at once (its history
        could not be written). ``_WriteFailed``: the database failed; try again after a
        backoff."""
        # this batch's history goes with the completion statement
        batch.history_inline = (
            self.tasks.writes_history_with_finish
            and self.history.history_enabled
            and self.history.ops.presence.present
            and not self._history_refused
        )
        history: list[ExecutionRecord] = (
            [e.record(f) for f, e in batch.items] if batch.history_inline else []
        )
        wants = self.observer.wants
        sending = self.tasks.finish(
            batch.current,
            lease=self.lease,
            history=history,
            picked_by=self.name,
            retry=self._retrying,
        )
        try:
            if "statement_scope" not in wants and "results_written" not in wants:
                return await sending
            began = time.monotonic()
            try:
                with self.observer.statement_scope("complete", len(batch.current)):
                    recorded = await sending
            except BaseException as error:
                if "results_written" in wants:
                    seconds = time.monotonic() - began
                    self.observer.results_written(batch.current, None, error, seconds)
                raise
            if "results_written" in wants:
                seconds = time.monotonic() - began
                self.observer.results_written(batch.current, recorded, None, seconds)
            return recorded
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

    def _settle(
        self,
        items: list[tuple[Finish, Execution]],
        recorded: tuple[set[TaskKey], _Batch] | None,
        ambiguous: bool,
        *,
        history: bool,
    ) -> None:
        """After results were written (``recorded``: the keys the store answered, and their
        batch; None: committed by ``ctx.transaction()``) or found superseded: buffer their
        history (``history``: where the completion did not write it), tell the observers,
        plan the recurring rows' next slots. (The executions were forgotten already.)"""
        wants_finished = "execution_finished" in self.observer.wants
        for finish, execution in items:
            if recorded is None:
                ok = True
            else:
                keys, batch = recorded
                key = execution.row.key
                ok = key in keys and finish.owned.version == batch.newest[key]
            if history:
                self.history.record(execution, finish, ok)
            # a skipped slot is no execution
            if wants_finished and finish.kind is not KIND_SKIPPED:
                self.observer.execution_finished(finished_event(execution, finish, ok))
            if ok:
                if self.counter is not None:
                    self.counter.count(execution, finish)
                if finish.next_time is not None and (
                    finish.owned.task_instance == RECURRING_INSTANCE
                    or execution.persistent is not None
                ):
                    self.alarm.note_due(finish.next_time)
            else:
                self._not_recorded(execution, ambiguous)

    def _not_recorded(self, execution: Execution, ambiguous: bool) -> None:
        """A result found superseded: say why nothing was recorded."""
        if execution.persistent is not None and not ambiguous:
            log.info(
                "%s (slot %s) finished; its schedule was deleted, or revived elsewhere, "
                "meanwhile: nothing recorded",
                execution.label,
                execution.row.execution_time.isoformat(),
                extra=log_extra(execution.row, self.name),
            )
            return
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
