"""The state every loop of one scheduler shares: its lifecycle flags (``RunState``) and the
executions it holds (``RunningExecutions``), with the capacity rule the poller claims by."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from ..domain.rows import TaskKey
from .execution import Execution

__all__ = ["Holdings", "RunState", "RunningExecutions"]


class Holdings(NamedTuple):
    """What an instance held at one moment, to tell whether a row it has picked is an
    orphaned claim (see ``Scheduler.holdings``)."""

    keys: frozenset[TaskKey]
    launches: int
    claiming: bool

    def settled_since(self, later: Holdings) -> bool:
        """No claim was in flight at either moment and nothing was launched in between: a
        row picked by this instance and held at neither moment is not the answer of a claim
        being processed (nor one whose execution started and ended in between)."""
        return not (self.claiming or later.claiming) and self.launches == later.launches


@dataclass
class RunState:
    """Where the scheduler is in its life."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Startup reached the database and created the recurring rows."""
    stopping: bool = False
    started_at: datetime | None = None
    last_poll: datetime | None = None
    """The database time of the last poll that got an answer."""
    loop_restarts: int = 0
    claims: int = 0
    """Claim statements in flight (the poller's, a forced run's): their rows are not among
    the executions yet."""
    claim_failed_at: float | None = None
    """Monotonic time of the last claim statement that failed: it may still have executed on
    the server (its answer lost), leaving rows picked by this instance that nothing runs."""

    @property
    def claiming(self) -> bool:
        return self.claims > 0

    @contextlib.contextmanager
    def claim(self) -> Iterator[None]:
        """Around a claim statement and the launch of what it claimed."""
        self.claims += 1
        try:
            yield
        finally:
            self.claims -= 1


class RunningExecutions:
    """The executions this instance holds, by row: claimed and running, or whose result is
    being recorded.

    Only executions whose job has not returned yet count against ``batch_size``, so the next
    claim overlaps the recording of the previous batch's results; at most ``2 x batch_size``
    are held at once. When capacity frees up after a poll found none, ``on_capacity`` is
    called (it wakes the poller).
    """

    def __init__(self, batch_size: int, on_capacity: Callable[[], None]) -> None:
        self.batch_size = batch_size
        self.by_key: dict[TaskKey, Execution] = {}
        self.executing = 0
        """Executions whose job has not returned yet."""
        self.launches = 0
        """Executions started so far (a counter only moment-to-moment comparisons read)."""
        self._on_capacity = on_capacity
        self._waiting = False

    def __len__(self) -> int:
        return len(self.by_key)

    def __iter__(self) -> Iterator[Execution]:
        return iter(list(self.by_key.values()))

    def claim_limit(self) -> int:
        """How many rows a poll may claim now; 0: none until executions finish (the poller
        is woken then)."""
        limit = self.batch_size - self.executing
        if limit <= 0 or len(self.by_key) >= 2 * self.batch_size:
            self._waiting = True
            return 0
        return limit

    def started(self, execution: Execution) -> None:
        self.by_key[execution.row.key] = execution
        self.executing += 1
        self.launches += 1

    def returned(self) -> None:
        """An execution's job returned (or raised): its place in the batch is free."""
        self.executing -= 1
        if self._waiting:
            self._waiting = False
            self._on_capacity()

    def forget(self, execution: Execution) -> None:
        """Its result is recorded (or it was abandoned): no longer held. A newer claim of the
        same row, held meanwhile, stays."""
        key = execution.row.key
        if self.by_key.get(key) is execution:
            del self.by_key[key]

    def recorded(self) -> None:
        """A batch of results was recorded: wake a poller that waits for room."""
        if self._waiting and len(self.by_key) < 2 * self.batch_size:
            self._waiting = False
            self._on_capacity()

    def async_labels(self) -> list[str]:
        """The running ``async def`` executions (suspects when the event loop blocks)."""
        return sorted({e.label for e in self.by_key.values() if e.job.is_async})
