"""``SlotTransaction``: ``ctx.transaction()``, where an execution's effects in the jobs database
commit together with its slot's completion.

The block runs the user's statements; at its end, in the same transaction, the completion
(reschedule a recurring row, delete a one-time one) is written guarded by the claimed
version, with the execution's history record, and the transaction commits. A guarded write
that matches no row means the execution was superseded (revived elsewhere): everything rolls
back and ``ExecutionSuperseded`` is raised. The version check runs under the row lock, so two
executions of one slot can never both commit (PostgreSQL and InnoDB re-read the row for the
update at any isolation level).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ..domain.errors import ConfigurationError, DatabaseTimeout, ExecutionSuperseded
from ..domain.logs import library_logger
from ..domain.rows import Finish
from ..store.external import Caller
from ..store.operations import OperationsStore
from ..store.schedules import ScheduleRows
from ..store.tasks import TaskStore
from .config import SchedulerConfig
from .execution import Execution
from .history import HistoryRecorder
from .observer import ObserverDispatch
from .persistent import count_run
from .poller import DatabaseLink

__all__ = ["SlotTransaction"]

log = library_logger(__name__)


class SlotTransaction:
    """Opens ``ctx.transaction()`` for one execution (once)."""

    def __init__(
        self,
        execution: Execution,
        *,
        tasks: TaskStore,
        operations: OperationsStore,
        history: HistoryRecorder,
        config: SchedulerConfig,
        link: DatabaseLink,
        observer: ObserverDispatch,
        schedule_rows: ScheduleRows | None = None,
    ) -> None:
        self.execution = execution
        self.tasks = tasks
        self.operations = operations
        self.history = history
        self.config = config
        self.link = link
        self.observer = observer
        self.schedule_rows = schedule_rows
        """Where a ``PersistentScheduleJob``'s run is counted (``runs + 1``, with the
        completion: its ``max_runs`` ends it)."""
        self._opened = False

    def __call__(self, target: Any = None) -> contextlib.AbstractAsyncContextManager[Any]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise TypeError(
                "ctx.transaction() is for `async def execute`: a plain `def execute` runs in "
                "a worker thread, away from the event loop the jobs database is used on. Make "
                "execute async (run blocking parts with asyncio.to_thread), or write the slot's "
                "effects idempotently with ctx.idempotency_key"
            ) from None
        if self._opened:
            raise ConfigurationError(
                f"{self.execution.label}: ctx.transaction() can be used once per execution "
                "(the slot completes when the block ends)"
            )
        db = self.tasks.db
        caller = None
        if target is not None:  # refused here, at the call, when on another database
            caller = Caller(
                target, db.engine, what="ctx.transaction(session)", translate=db.translate
            )
        self._opened = True
        return self._block(caller)

    @contextlib.asynccontextmanager
    async def _block(self, caller: Caller | None) -> AsyncIterator[Any]:
        db = self.tasks.db
        async with contextlib.AsyncExitStack() as stack:
            if caller is None:
                conn = await stack.enter_async_context(db.tx_engine.connect())
                caller = Caller(conn, db.engine, what="ctx.transaction()", translate=db.translate)
            await caller.begin()
            try:
                yield caller.target
                await caller.flush()
                finish = await self._complete(caller)
            except BaseException:
                with contextlib.suppress(Exception):
                    await caller.rollback()
                raise
            await self._commit(caller, finish)

    async def _complete(self, caller: Caller) -> Finish:
        """Write the completion and the history record; raise if superseded."""
        execution = self.execution
        execution.recording = True  # a heartbeat blocked by our row lock is no failure
        if execution.persistent is not None and self.schedule_rows is not None:
            # counted as the executor counts a run that did not use ctx.transaction(): the
            # schedule as it is now decides the next slot, runs + 1 reaches max_runs
            async with asyncio.timeout(self.tasks.db.statement_timeout):
                await count_run(self.schedule_rows, execution, caller)
        execution.finished_at = self.link.now()
        finish = execution.finish(
            execution.finished_at,
            error=None,
            cancelled=False,
            fallback_delay=self.config.polling_interval,
        )
        async with asyncio.timeout(self.tasks.db.statement_timeout):
            mark = execution.mark  # a buffered slot (Overlap.buffer_one), before the result
            if mark is not None and not await self.tasks.mark_on(caller, execution.owned, mark):
                finish = execution.without_retry(finish, execution.finished_at)
            if not await self.tasks.finish_on(caller, finish):
                execution.recording = False
                raise ExecutionSuperseded(
                    f"{execution.label} (slot {execution.row.execution_time.isoformat()}, "
                    f"version {execution.row.version}) was revived by another instance while "
                    "its transaction was open: nothing of it was committed"
                )
            if self.history.enabled:
                record = execution.record(finish)
                await self.operations.insert_history_on(caller, [record])
                execution.history_written = True
            for statement in self.tasks.db.commit_guard(self.config.dead_after.total_seconds()):
                await caller.execute(statement)
        if "transaction_completing" in self.observer.wants:
            self.observer.transaction_completing(finish)
        return finish

    async def _commit(self, caller: Caller, finish: Finish) -> None:
        try:
            async with asyncio.timeout(self.tasks.db.statement_timeout):
                await caller.commit()
        except TimeoutError:
            raise DatabaseTimeout(
                f"{self.execution.label}: no answer to the commit of ctx.transaction() within "
                f"{self.tasks.db.statement_timeout:g}s; it may or may not have committed"
            ) from None
        self.execution.settled = finish
        if "transaction_committed" in self.observer.wants:
            self.observer.transaction_committed(finish)
        for statement in self.tasks.db.commit_guard_reset():
            try:
                await caller.execute(statement)
                if caller.in_transaction():
                    await caller.commit()
            except Exception as error:  # the transaction is committed: only a session knob
                log.debug("could not reset the commit guard: %s", error)
