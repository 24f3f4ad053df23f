"""The state every loop of one scheduler shares: its lifecycle flags (``RunState``) and its
``Capacity``: the executions it holds, the claims in flight, and the rule the poller claims by.
A launch takes a slot that is given back exactly once (``Capacity.release``): when the job
returns, when its task ends however it ends (its done callback), or when the launch raises or
runs nothing, so no path can keep it (a slot never given back would stall the poller)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from ..domain.rows import TaskKey
from .execution import Execution

__all__ = ["Capacity", "Holdings", "RunState"]


class Holdings(NamedTuple):
    """What an instance held at one moment, to tell whether a row it has picked is an
    orphaned claim (``Capacity.holdings``, ``Scheduler.holdings``)."""

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
    ready_at: datetime | None = None
    """The database time at which startup finished (before this incarnation's first claim)."""
    last_poll: datetime | None = None
    """The database time of the last poll that got an answer."""
    loop_restarts: int = 0
    claim_failed_at: float | None = None
    """Monotonic time of the last claim statement that failed: it may still have executed on
    the server (its answer lost), leaving rows picked by this instance that nothing runs."""
    abandoned_at: float | None = None
    """Monotonic time of the last execution abandoned (it ignored its cancellation): its row
    stays picked by this instance, unheartbeated, and this instance never revives its own
    rows, so it releases it once its heartbeat is a dead window old (as a peer would revive
    it; a single instance must not leave the slot to nobody)."""


class Capacity:
    """What this instance holds and may claim: the executions by row (claimed and running, or
    whose result is being recorded), the claims in flight, and how many rows a poll may claim.

    Only executions whose job has not returned yet count against ``batch_size`` (they hold a
    slot), so the next claim overlaps the recording of the previous batch's results; at
    most ``2 x batch_size`` are held at once. When capacity frees up after a poll found none,
    ``on_capacity`` is called (it wakes the poller).
    """

    def __init__(self, batch_size: int, on_capacity: Callable[[], None]) -> None:
        self.batch_size = batch_size
        self.by_key: dict[TaskKey, Execution] = {}
        self.executing = 0
        """Executions whose job has not returned yet (slots held)."""
        self._slots: set[Execution] = set()
        """The executions holding a slot (each given back once)."""
        self.launches = 0
        """Executions started so far (a counter only moment-to-moment comparisons read)."""
        self.claims = 0
        """Claim statements in flight (the poller's, a forced run's): their rows are not among
        the executions yet."""
        self._on_capacity = on_capacity
        self._waiting = False

    def __len__(self) -> int:
        return len(self.by_key)

    def __iter__(self) -> Iterator[Execution]:
        return iter(list(self.by_key.values()))

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

    def holdings(self) -> Holdings:
        """The rows held now, how many executions were launched so far, and whether a claim
        is in flight (see ``Holdings.settled_since``)."""
        return Holdings(frozenset(self.by_key), self.launches, self.claiming)

    def claim_limit(self) -> int:
        """How many rows a poll may claim now; 0: none until executions finish (the poller
        is woken then)."""
        limit = self.batch_size - self.executing
        if limit <= 0 or len(self.by_key) >= 2 * self.batch_size:
            self._waiting = True
            return 0
        return limit

    def launch(self, execution: Execution) -> None:
        """Hold ``execution`` and take its slot. The launcher gives it back whatever happens:
        ``release`` if the launch raises or runs nothing, else the task it starts does, as its
        done callback (``release_task``) unless its own code did, however that task ends,
        even cancelled before it ran any of its code."""
        self.by_key[execution.row.key] = execution
        self._slots.add(execution)
        self.executing += 1
        self.launches += 1

    def release(self, execution: Execution, _: object = None) -> None:
        """The job returned (or raised, or will not run): its slot is free, once (a second
        call does nothing); a poller that found no room is woken."""
        slots = self._slots
        if execution in slots:
            slots.discard(execution)
            self.executing -= 1
            if self._waiting:
                self._waiting = False
                self._on_capacity()

    def release_task(self, task: object) -> None:
        """``release`` the execution that ran in ``task`` (the done callback of a task that
        ended before its own ``release``: held, or cancelled before it ran any code)."""
        for execution in [e for e in self._slots if e.task is task]:
            self.release(execution)

    def forget(self, execution: Execution) -> None:
        """Its result is recorded (or it was abandoned): no longer held. A newer claim of the
        same row, held meanwhile, stays."""
        key = execution.row.key
        if self.by_key.get(key) is execution:
            del self.by_key[key]

    def recorded(self, executions: Iterable[Execution]) -> None:
        """A batch of results was recorded (or found superseded): its executions are no longer
        held (a newer claim of the same row, held meanwhile, stays); wake a poller that waits
        for room."""
        by_key = self.by_key
        for execution in executions:
            key = execution.row.key
            if by_key.get(key) is execution:
                del by_key[key]
        if self._waiting and len(self.by_key) < 2 * self.batch_size:
            self._waiting = False
            self._on_capacity()

    def async_labels(self) -> list[str]:
        """The running ``async def`` executions (suspects when the event loop blocks)."""
        return sorted({e.label for e in self.by_key.values() if e.job.is_async})
