"""The job model: what a user implements and what an execution is told about itself."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .failure import FailureHandler
    from .schedules import Schedule

__all__ = [
    "RECURRING_INSTANCE",
    "DistributedJob",
    "ExecutionContext",
    "HeartbeatState",
    "OneTimeJob",
    "distributed_job",
    "is_distributed_job",
]

RECURRING_INSTANCE = "recurring"
"""The ``task_instance`` of a recurring job's single row (db-scheduler's convention)."""

_MARKER = "__ekbatan_distributed_job__"


class _Job(abc.ABC):
    """What every job has: a cluster-wide unique name and an ``execute``."""

    @abc.abstractmethod
    def name(self) -> str:
        """The cluster-wide unique task name (the ``task_name`` column, at most 100 characters)."""

    @abc.abstractmethod
    def execute(self, ctx: ExecutionContext) -> Awaitable[None] | None:
        """Run one execution. ``async def`` runs on the event loop; a plain ``def`` in a thread."""

    def priority(self) -> int:
        """Rows with a higher priority are claimed first when more are due than fit a batch."""
        return 0

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.execute)


class DistributedJob(_Job):
    """A recurring job: one row per job, each slot of its schedule runs on one instance."""

    @abc.abstractmethod
    def schedule(self) -> Schedule:
        """When the job runs; see ``Schedules``."""


class OneTimeJob(_Job):
    """A job whose instances are scheduled explicitly through ``registry.client.schedule``.

    Each instance (``task_instance``) runs once; on failure it is retried per
    ``failure_handler()`` (default: retry after five minutes, forever, as db-scheduler does).
    """

    def failure_handler(self) -> FailureHandler:
        from .failure import RetryLater

        return RetryLater(timedelta(minutes=5))


J = TypeVar("J", bound=type[_Job])


def distributed_job(cls: J) -> J:
    """Mark a job class for discovery by the DI integration (``ekbatan_lifespan``)."""
    if not (isinstance(cls, type) and issubclass(cls, _Job)):
        raise TypeError(
            f"@distributed_job decorates a DistributedJob or OneTimeJob subclass, got {cls!r}"
        )
    setattr(cls, _MARKER, True)
    return cls


def is_distributed_job(obj: object) -> bool:
    """True for a class marked with ``@distributed_job`` itself (not merely inherited)."""
    return isinstance(obj, type) and bool(obj.__dict__.get(_MARKER, False))


@dataclass
class HeartbeatState:
    """This instance's own view of an execution's heartbeats (db-scheduler's definitions).

    ``fraction_dead`` is 0.0 right after a successful heartbeat and 1.0 at the moment another
    instance may revive the row. A failed heartbeat is one whose update did not reach the
    database, or found the row no longer ours (it was revived elsewhere).
    """

    heartbeat_interval: timedelta
    dead_after: timedelta
    _monotonic: Callable[[], float]
    last_success: float
    failures_since_last_success: int = 0
    last_failure: float | None = None

    def record_success(self) -> None:
        self.last_success = self._monotonic()
        self.failures_since_last_success = 0

    def record_failure(self) -> None:
        self.last_failure = self._monotonic()
        self.failures_since_last_success += 1

    @property
    def since_last_success(self) -> timedelta:
        return timedelta(seconds=max(0.0, self._monotonic() - self.last_success))

    @property
    def has_stale_heartbeat(self) -> bool:
        """A heartbeat failed, or none succeeded for longer than an interval plus some slack."""
        interval = self.heartbeat_interval.total_seconds()
        slack = min(10.0, interval * 0.25)
        return (
            self.failures_since_last_success > 0
            or self.since_last_success.total_seconds() > interval + slack
        )

    @property
    def fraction_dead(self) -> float:
        return self.since_last_success / self.dead_after

    @property
    def failed_heartbeats(self) -> int:
        return self.failures_since_last_success


@dataclass
class ExecutionContext:
    """What an execution knows about itself.

    ``execution_time`` is the slot being run; it stays the same when a dead execution is
    revived elsewhere, so ``(task_name, task_instance, execution_time)`` is an idempotency
    key. ``version`` grows with every claim and can serve as a fencing token.
    """

    task_name: str
    task_instance: str
    execution_time: datetime
    picked_by: str
    version: int
    task_data: bytes | None = field(repr=False)
    heartbeat_state: HeartbeatState
    consecutive_failures: int
    _shutting_down: Callable[[], bool] = field(repr=False)

    @cached_property
    def data(self) -> Any:
        """The instance's data, decoded from JSON on first use.

        Raises ``TaskDataError`` when the row holds bytes this library did not write; the
        execution then fails like any other exception (a job that never reads ``data`` runs).
        """
        from .codec import decode_data

        return decode_data(self.task_data, where=f"{self.task_name}/{self.task_instance}")

    @property
    def is_shutting_down(self) -> bool:
        """True once the scheduler began to stop: a long job may wind down early."""
        return self._shutting_down()
