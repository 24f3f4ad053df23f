"""The job model: what a user implements (a recurring or a one-time job) and its marker."""

from __future__ import annotations

import abc
import inspect
import typing
from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, get_args, get_origin

from typing_extensions import TypeVar

from .codec import DataModel
from .rows import RECURRING_INSTANCE

if TYPE_CHECKING:
    from .catchup import CatchUp
    from .context import ExecutionContext
    from .failure import FailureHandler
    from .overlap import Overlap
    from .schedules import Schedule

__all__ = [
    "RECURRING_INSTANCE",
    "DistributedJob",
    "Job",
    "OneTimeJob",
    "data_model_of",
    "distributed_job",
    "is_distributed_job",
    "pause_threshold",
    "schedule_of",
]


_MARKER = "__ekbatan_distributed_job__"


class Job(abc.ABC):
    """What every job has: a cluster-wide unique name and an ``execute`` (the base of
    ``DistributedJob`` and ``OneTimeJob``; subclass one of those)."""

    @abc.abstractmethod
    def name(self) -> str:
        """The cluster-wide unique task name (the ``task_name`` column, at most 100 characters)."""

    @abc.abstractmethod
    def execute(self, ctx: ExecutionContext) -> Awaitable[None] | None:
        """Run one execution. ``async def`` runs on the event loop; a plain ``def`` in a thread."""

    def priority(self) -> int:
        """Rows with a higher priority are claimed first when more are due than fit a batch."""
        return 0

    def timeout(self) -> timedelta | None:
        """How long one execution may run (None: no limit). An ``async def`` execution is
        cancelled at the timeout and given a grace period to clean up; a plain ``def`` one
        sees ``ctx.is_timed_out`` turn true. Either way its row stays picked until it has
        really ended, and it counts as a failure (history outcome ``timed_out``)."""
        return None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.execute)


class DistributedJob(Job):
    """A recurring job: one row per job, each slot of its schedule runs on one instance."""

    @abc.abstractmethod
    def schedule(self) -> Schedule:
        """When the job runs; see ``Schedules``."""

    def catch_up(self) -> CatchUp:
        """What happens to the slots missed while nothing ran the job: ``CatchUp.latest()``
        (the default: coalesced into one run), ``CatchUp.all(max_slots)`` or
        ``CatchUp.skip(grace)``; see ``CatchUp``."""
        from .catchup import CatchUp

        return CatchUp.latest()

    def overlap(self) -> Overlap:
        """What happens to a slot that comes due while an execution of the job still runs:
        ``Overlap.skip()`` (the default: it does not run), ``Overlap.buffer_one()`` (the
        first such slot runs right after) or ``Overlap.cancel_other()`` (it stops the running
        execution, then runs); see ``Overlap``."""
        from .overlap import Overlap

        return Overlap.skip()

    def failure_handler(self) -> FailureHandler | None:
        """How a failed slot is retried: ``RetryLater``, ``ExponentialBackoff``, ``MaxRetries``
        (as for one-time jobs), or None (the default, db-scheduler's behaviour: the next slot
        follows). A retry runs the same slot (``ctx.execution_time`` unchanged, ``ctx.attempt``
        2, 3...); a retry that would come at or after the next slot's time is dropped, and the
        schedule goes on with that slot."""
        return None

    def pause_after_failures(self) -> int | None:
        """Pause the job cluster-wide after this many consecutive failed attempts (the row's
        ``consecutive_failures``: a slot's retries count too), ``paused_by="ekbatan"``, the
        reason naming the count and the last error; ``resume`` clears it as any pause. None
        (the default): never."""
        return None

    def record_missed_slots(self) -> bool | None:
        """Record each slot that passes without a run in the history (outcome ``missed``,
        its reason: merged by ``CatchUp.latest``, skipped by the catch-up policy, due while a
        run was going) and tell it to ``slot_missed``; None (the default): as the
        ``record_missed_slots`` setting says (on unless turned off)."""
        return None


def records_missed(job: Job, default: bool) -> bool:
    """Whether ``job`` records its missed slots (its ``record_missed_slots()``, checked, or
    ``default``, the setting)."""
    method = getattr(job, "record_missed_slots", None)
    value = method() if method is not None else None
    if value is None:
        return default
    if not isinstance(value, bool):
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"{job.name()}.record_missed_slots() must return True, False or None (follow the "
            f"record_missed_slots setting), got {value!r}"
        )
    return value


def pause_threshold(job: Job) -> int | None:
    """The job's ``pause_after_failures()``, checked: a whole number >= 1, or None."""
    value = getattr(job, "pause_after_failures", lambda: None)()
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"{job.name()}.pause_after_failures() must return a whole number >= 1 or None, "
            f"got {value!r}"
        )
    return value


def schedule_of(job: DistributedJob) -> Schedule:
    """The job's schedule bound to its name (jitter derives its offsets from the name)."""
    return job.schedule().bind(job.name())


D = TypeVar("D", default=Any)
"""A one-time job's task data: ``Any`` (plain JSON) unless the job names a model."""


class OneTimeJob(Job, Generic[D]):
    """A job whose instances are scheduled explicitly through ``registry.client.schedule``.

    Each instance (``task_instance``) runs once; on failure it is retried per
    ``failure_handler()`` (default: retry after five minutes, forever, as db-scheduler does).

    ``class SendInvoice(OneTimeJob[InvoiceData])`` with a pydantic model types its data:
    ``schedule()`` validates it (``TaskDataInvalid`` names the field) and stores its JSON
    form, ``ctx.data`` is the model instance, and a row whose stored data no longer fits is
    parked, not retried (docs/task-data.md). A plain ``OneTimeJob`` takes any JSON.
    """

    data_model: ClassVar[DataModel | None] = None
    """The model its data must fit, found in ``OneTimeJob[Model]`` (None: untyped)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, OneTimeJob):
                (argument,) = get_args(base) or (Any,)
                if argument is not Any and not isinstance(argument, typing.TypeVar):
                    cls.data_model = DataModel(argument, f"{cls.__module__}.{cls.__qualname__}")

    def failure_handler(self) -> FailureHandler:
        from .failure import RetryLater

        return RetryLater(timedelta(minutes=5))

    def max_concurrency(self) -> int | None:
        """At most this many executions of the job run at once across the cluster (counted
        on the database, per ``concurrency_key`` when it gives one); None: no limit."""
        return None

    def concurrency_key(self, task_instance: str) -> str | None:
        """Group instances for ``max_concurrency``: at most that many per key run at once
        (e.g. per tenant: ``task_instance.split(":")[0]``). None: one group for the job."""
        return None


def data_model_of(job: Job | None) -> DataModel | None:
    """The model a one-time job's data must fit (None: untyped, or not a one-time job)."""
    return job.data_model if isinstance(job, OneTimeJob) else None


J = TypeVar("J", bound=type[Job])


def distributed_job(cls: J) -> J:
    """Mark a job class for discovery by the DI integration (``ekbatan_lifespan``)."""
    if not (isinstance(cls, type) and issubclass(cls, Job)):
        raise TypeError(
            f"@distributed_job decorates a DistributedJob or OneTimeJob subclass, got {cls!r}"
        )
    setattr(cls, _MARKER, True)
    return cls


def is_distributed_job(obj: object) -> bool:
    """True for a class marked with ``@distributed_job`` itself (not merely inherited)."""
    return isinstance(obj, type) and bool(obj.__dict__.get(_MARKER, False))
