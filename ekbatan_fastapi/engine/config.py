"""The scheduler's settings, with Ekbatan's defaults and their validation."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from ..domain.clock import Clock, SystemClock
from ..domain.errors import ConfigurationError
from ..domain.limits import JobOverride
from ..domain.rows import PollingStrategy
from ..domain.tasks import dead_after
from ..domain.text import is_valid_name

if TYPE_CHECKING:
    from .observer import SchedulerObserver

__all__ = [
    "DEFAULT_RESULTS_WAIT",
    "MAX_CLAIM_AHEAD",
    "MIN_MISSED_HEARTBEATS",
    "SchedulerConfig",
    "default_scheduler_name",
]

MIN_MISSED_HEARTBEATS = 4
DEFAULT_RESULTS_WAIT = 5.0
"""Seconds a stop gives the database to record the last results (see ``shutdown_results_wait``)."""
MAX_CLAIM_AHEAD = timedelta(seconds=10)
"""The longest ``claim_ahead``: rows claimed ahead are held by this instance until their time,
out of reach of the others."""
SCHEDULER_NAME_LENGTH = 50
"""The ``picked_by`` column's limit (``varchar(50)`` on MySQL)."""


def default_scheduler_name() -> str:
    """``<host>-<pid>`` cut to 50 characters (the ``picked_by`` value)."""
    return f"{socket.gethostname()}-{os.getpid()}"[-SCHEDULER_NAME_LENGTH:]


@dataclass
class SchedulerConfig:
    """Everything the scheduler core needs besides the repository and the jobs."""

    polling_interval: timedelta = timedelta(seconds=10)
    heartbeat_interval: timedelta = timedelta(seconds=10)
    missed_heartbeats_limit: int = 6
    shutdown_max_wait: timedelta = timedelta(minutes=30)
    shutdown_results_wait: timedelta = timedelta(seconds=DEFAULT_RESULTS_WAIT)
    """At shutdown, once the executions have ended: how long the database may take to record
    their results and history (and, before the executions' wait, to answer the poller's last
    claim). What is still unrecorded then is left: those rows stay picked and are revived
    after the dead window, like an abandoned execution. It keeps a stop with the database
    down within a pod's grace period (docs/deployment.md). Never longer than
    ``shutdown_max_wait``."""
    delete_unresolved_after: timedelta = timedelta(days=14)
    polling_strategy: PollingStrategy | str | None = None
    """None: lock-and-fetch where the dialect has SKIP LOCKED, fetch otherwise."""
    batch_size: int | None = None
    """None: ``max(50, 3 x number of jobs)``."""
    history: bool = True
    """Record every execution in ``ekbatan_execution_history`` (batched, off the hot path)."""
    history_retention: timedelta = timedelta(days=7)
    listen: bool = True
    """Where the database supports it (PostgreSQL LISTEN/NOTIFY), hold one pooled connection
    that wakes this instance when any instance schedules work."""
    scheduler_name: str = field(default_factory=default_scheduler_name)
    clock: Clock = field(default_factory=SystemClock)
    observers: list[SchedulerObserver] = field(default_factory=list)
    """Hooks called at the scheduler's events (metrics); see ``ekbatan_fastapi.observer``."""
    app_version: str | None = None
    """The application's version, written with the job definitions (rolling deploys)."""
    job_overrides: dict[str, JobOverride] = field(default_factory=dict)
    """Per job: a timeout or concurrency limit that wins over the job class's."""
    timeout_grace: timedelta | None = None
    """How long a timed-out ``async`` execution has to clean up after its cancellation before
    it is abandoned (None: one heartbeat interval)."""
    claim_ahead: timedelta = timedelta(0)
    """Claim rows that come due within this lead, and start each at its own time: when many
    come due together, the claims are made before the slot instead of after it (every dialect;
    0: claim only due rows, as db-scheduler does). docs/schedules.md, "Claiming ahead"."""

    @property
    def grace(self) -> timedelta:
        """The effective ``timeout_grace``."""
        return self.timeout_grace if self.timeout_grace is not None else self.heartbeat_interval

    @property
    def dead_after(self) -> timedelta:
        """A picked row whose heartbeat is older than this is revived elsewhere."""
        return dead_after(self.heartbeat_interval, self.missed_heartbeats_limit)

    def validate(self) -> None:
        for name in (
            "polling_interval",
            "heartbeat_interval",
            "shutdown_max_wait",
            "shutdown_results_wait",
        ):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigurationError(f"{name} must be a positive timedelta, got {value!r}")
        if not isinstance(self.history_retention, timedelta) or (
            self.history_retention <= timedelta(0)
        ):
            raise ConfigurationError(
                f"history_retention must be a positive timedelta, got {self.history_retention!r}"
            )
        if not isinstance(self.delete_unresolved_after, timedelta) or (
            self.delete_unresolved_after <= timedelta(0)
        ):
            raise ConfigurationError(
                "delete_unresolved_after must be a positive timedelta, "
                f"got {self.delete_unresolved_after!r}"
            )
        if (
            not isinstance(self.missed_heartbeats_limit, int)
            or self.missed_heartbeats_limit < MIN_MISSED_HEARTBEATS
        ):
            raise ConfigurationError(
                f"missed_heartbeats_limit must be an integer >= {MIN_MISSED_HEARTBEATS}, got "
                f"{self.missed_heartbeats_limit!r}; fewer would declare executions dead after "
                "one slow heartbeat"
            )
        if self.polling_strategy is not None and self.polling_strategy not in list(PollingStrategy):
            raise ConfigurationError(
                f"polling_strategy {self.polling_strategy!r} is unknown; use one of "
                f"{', '.join(PollingStrategy)}"
            )
        if self.batch_size is not None and (
            not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= 10_000
        ):
            raise ConfigurationError(
                f"batch_size must be an integer from 1 to 10000, got {self.batch_size!r}"
            )
        if self.timeout_grace is not None and (
            not isinstance(self.timeout_grace, timedelta) or self.timeout_grace < timedelta(0)
        ):
            raise ConfigurationError(
                f"timeout_grace must be a timedelta of zero or more, got {self.timeout_grace!r}"
            )
        if not isinstance(self.claim_ahead, timedelta) or not (
            timedelta(0) <= self.claim_ahead <= MAX_CLAIM_AHEAD
        ):
            raise ConfigurationError(
                f"claim_ahead must be a timedelta from 0 to {MAX_CLAIM_AHEAD.total_seconds():g} "
                f"seconds, got {self.claim_ahead!r} (e.g. timedelta(milliseconds=200); 0 claims "
                "only due rows)"
            )
        name = self.scheduler_name
        if not is_valid_name(name, SCHEDULER_NAME_LENGTH):
            raise ConfigurationError(
                f"scheduler_name must be 1 to 50 characters (the picked_by column; no NUL, no "
                f"lone surrogate), got {name!r}"
            )
