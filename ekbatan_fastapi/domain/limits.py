"""Execution control: a job's timeout and its cluster-wide concurrency limit, as the job
declares them (``timeout()``, ``max_concurrency()``, ``concurrency_key()``) or as settings
override them (``jobs.overrides.<name>``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from .errors import ConfigurationError
from .job import DistributedJob, Job, OneTimeJob

__all__ = ["JobLimits", "JobOverride", "check_overrides", "resolve_limits"]


@dataclass(frozen=True)
class JobOverride:
    """Settings for one job that win over what its class says (None: the class's value)."""

    timeout: timedelta | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True)
class JobLimits:
    """What the scheduler enforces for one job."""

    timeout: timedelta | None = None
    max_concurrency: int | None = None
    concurrency_key: Callable[[str], str | None] | None = None
    """Groups instances for ``max_concurrency`` (None: one group for the job)."""

    @property
    def limited(self) -> bool:
        return self.max_concurrency is not None


def _timeout(value: object, where: str) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ConfigurationError(
            f"{where} must be a positive timedelta or None, got {value!r}; "
            "e.g. timedelta(minutes=10)"
        )
    return value


def _limit(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{where} must be a positive integer or None, got {value!r}")
    return value


def _has_key(job: OneTimeJob) -> bool:
    """The job overrides ``concurrency_key`` (the default gives one group)."""
    return type(job).concurrency_key is not OneTimeJob.concurrency_key


def resolve_limits(job: Job, override: JobOverride | None = None) -> JobLimits:
    """The limits to enforce for ``job``: its own, with ``override`` applied; values are
    checked here (at build time), each error naming the job and the fix."""
    kind = type(job).__name__
    timeout = _timeout(job.timeout(), f"{kind}.timeout()")
    limit: int | None = None
    key: Callable[[str], str | None] | None = None
    if isinstance(job, OneTimeJob):
        limit = _limit(job.max_concurrency(), f"{kind}.max_concurrency()")
        key = job.concurrency_key if _has_key(job) else None
    if override is not None:
        name = job.name()
        if override.timeout is not None:
            timeout = _timeout(override.timeout, f"jobs.overrides.{name}.timeout")
        if override.max_concurrency is not None:
            if isinstance(job, DistributedJob):
                raise ConfigurationError(
                    f"jobs.overrides.{name}.max-concurrency: {name} is a recurring job, whose "
                    "single row runs at most once at a time anyway; limits apply to one-time "
                    "jobs"
                )
            limit = _limit(override.max_concurrency, f"jobs.overrides.{name}.max-concurrency")
    return JobLimits(timeout, limit, key if limit is not None else None)


def check_overrides(overrides: Mapping[str, JobOverride], jobs: Mapping[str, Job]) -> None:
    """Every override names a registered job."""
    unknown = sorted(set(overrides) - set(jobs))
    if unknown:
        raise ConfigurationError(
            f"jobs.overrides names {', '.join(map(repr, unknown))}, which no registered job "
            f"is called; registered jobs: {', '.join(sorted(jobs)) or '(none)'}"
        )
