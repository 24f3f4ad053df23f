"""What happens to a one-time task instance whose execution raised.

A ``OneTimeJob`` instance is retried per its job's ``failure_handler()``; a recurring job's
failed slot is retried the same way when its ``DistributedJob.failure_handler()`` names one
(by default it is not: db-scheduler's behaviour, the next slot follows).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from .errors import ConfigurationError

__all__ = ["ExponentialBackoff", "FailureHandler", "MaxRetries", "RetryLater"]


class FailureHandler(Protocol):
    """Decides when a failed instance runs again."""

    def next_attempt(self, consecutive_failures: int, now: datetime) -> datetime | None:
        """The time of the next attempt, or None to give up and delete the instance.

        ``consecutive_failures`` counts this failure too (1 after the first one).
        """
        ...


def _positive(value: timedelta, what: str) -> None:
    if value <= timedelta(0):
        raise ConfigurationError(f"{what} must be positive, got {value!r}")


@dataclass(frozen=True)
class RetryLater:
    """Retry after a fixed delay, forever (db-scheduler's default for one-time tasks: 5 min)."""

    delay: timedelta

    def __post_init__(self) -> None:
        _positive(self.delay, "RetryLater.delay")

    def next_attempt(self, consecutive_failures: int, now: datetime) -> datetime | None:
        return now + self.delay


@dataclass(frozen=True)
class ExponentialBackoff:
    """Retry after ``initial * rate ** (failures - 1)``, capped at ``maximum``."""

    initial: timedelta
    rate: float = 1.5
    maximum: timedelta | None = None

    def __post_init__(self) -> None:
        _positive(self.initial, "ExponentialBackoff.initial")
        if self.rate < 1.0:
            raise ConfigurationError(f"ExponentialBackoff.rate must be >= 1.0, got {self.rate}")

    def next_attempt(self, consecutive_failures: int, now: datetime) -> datetime | None:
        exponent = max(0, consecutive_failures - 1)
        seconds = self.initial.total_seconds() * self.rate ** min(exponent, 64)
        if self.maximum is not None:
            seconds = min(seconds, self.maximum.total_seconds())
        return now + timedelta(seconds=seconds)


@dataclass(frozen=True)
class MaxRetries:
    """Retry per ``then`` at most ``retries`` times, then give up (the row is deleted)."""

    retries: int
    then: FailureHandler

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ConfigurationError(f"MaxRetries.retries must be >= 0, got {self.retries}")

    def next_attempt(self, consecutive_failures: int, now: datetime) -> datetime | None:
        if consecutive_failures > self.retries:
            return None
        return self.then.next_attempt(consecutive_failures, now)
