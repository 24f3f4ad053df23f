"""``JobRegistry``: the builder facade over one scheduler (Ekbatan's "wiring without DI")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from .client import SchedulerClient
from .domain.catchup import CatchUp
from .domain.errors import ConfigurationError, ScheduleError
from .domain.job import DistributedJob, Job, OneTimeJob
from .domain.limits import JobOverride, check_overrides, resolve_limits
from .domain.logs import library_logger
from .domain.overlap import checked_overlap
from .domain.persistent import PersistentScheduleJob
from .domain.schedules import Schedule
from .domain.text import MAX_NAME_LENGTH, is_valid_name
from .engine.config import SchedulerConfig, closest, settings_of
from .engine.observer import SchedulerObserver
from .engine.scheduler import Scheduler, SchedulerStatus
from .store.connection import DEFAULT_POOL_SIZE, ConnectionProvider, resolve_connection
from .store.dialects import Store, open_store
from .store.options import TRANSACTION_POOLING

__all__ = ["JobRegistry", "JobRegistryBuilder", "SchedulerBuilder", "job_registry"]

log = library_logger(__name__)

ConnectionSource = str | URL | AsyncEngine | ConnectionProvider


class SchedulerBuilder:
    """Every setting of ``SchedulerConfig`` by its name: ``b.polling_interval(value)``,
    ``b.claim_ahead(value)``, ... (docs/fastapi.md lists them), or several at once with
    ``b.set(polling_interval=..., batch_size=...)``. ``customize_scheduler`` receives one and
    may change anything; ``build()`` checks every value by its setting's rule."""

    def __init__(self) -> None:
        self.config = SchedulerConfig()

    def set(self, **values: Any) -> SchedulerBuilder:
        """Settings by their ``SchedulerConfig`` names; an unknown name is an error naming
        the nearest one."""
        for name, value in values.items():
            if name not in _SETTINGS:
                raise ConfigurationError(_not_a_setting(name))
            setattr(self.config, name, value)
        return self

    def __getattr__(self, name: str) -> Callable[[Any], SchedulerBuilder]:
        """``b.<setting>(value)`` for every setting the scheduler reads."""
        setting = _SETTINGS.get(name)
        if setting is None or not setting.builder:
            raise AttributeError(_not_a_setting(name))
        return lambda value: self.set(**{name: value})

    def __dir__(self) -> list[str]:
        builder = [name for name, setting in _SETTINGS.items() if setting.builder]
        return sorted({*super().__dir__(), *builder})

    def pooler(self, value: str | None) -> SchedulerBuilder:
        """``"none"`` (also for None), ``"pgbouncer-session"`` or ``"pgbouncer-transaction"``."""
        return self.set(pooler="none" if value is None else value)

    def observer(self, value: SchedulerObserver) -> SchedulerBuilder:
        """Add an observer of the scheduler's events (e.g. ``ekbatan_fastapi.metrics``)."""
        self.config.observers.append(value)
        return self

    def job_override(
        self,
        name: str,
        *,
        timeout: timedelta | None = None,
        max_concurrency: int | None = None,
    ) -> SchedulerBuilder:
        """Override one job's ``timeout()`` and/or ``max_concurrency()`` (what settings'
        ``jobs.overrides.<name>`` does); None keeps the job's own."""
        self.config.job_overrides[name] = JobOverride(timeout, max_concurrency)
        return self


_SETTINGS = {setting.name: setting for setting in settings_of()}


def _not_a_setting(name: str) -> str:
    setting = _SETTINGS.get(name)
    if setting is not None:
        return (
            f"{name} is read by the FastAPI integration from ekbatan.jobs.{setting.key} "
            f"({setting.environment}), not by the scheduler's builder"
        )
    known = [s.name for s in _SETTINGS.values() if s.builder]
    nearest = closest(name, known)
    guess = f"did you mean {nearest}? " if nearest is not None else ""
    return f"the scheduler has no setting {name!r}; {guess}its settings are {', '.join(known)}"


class JobRegistryBuilder:
    """Collects the jobs and settings; ``build()`` validates them and opens no connection."""

    def __init__(self) -> None:
        self._connection: ConnectionSource | None = None
        self._pool_size = DEFAULT_POOL_SIZE
        self._jobs: list[Job] = []
        self._scheduler = SchedulerBuilder()
        self._customizers: list[Callable[[SchedulerBuilder], Any]] = []

    def connection_provider(
        self, value: ConnectionSource, *, pool_size: int = DEFAULT_POOL_SIZE
    ) -> JobRegistryBuilder:
        """A database URL (a dedicated pool of ``pool_size``, default 5, is built at
        ``build()``, with the pooler and session settings), an AsyncEngine or a provider
        (used as they are)."""
        self._connection = value
        self._pool_size = pool_size
        return self

    def with_job(self, job: Job) -> JobRegistryBuilder:
        self._jobs.append(job)
        return self

    def with_jobs(self, jobs: Iterable[Job]) -> JobRegistryBuilder:
        self._jobs.extend(jobs)
        return self

    def poll_interval(self, value: timedelta) -> JobRegistryBuilder:
        self._scheduler.polling_interval(value)
        return self

    polling_interval = poll_interval

    def heartbeat_interval(self, value: timedelta) -> JobRegistryBuilder:
        self._scheduler.heartbeat_interval(value)
        return self

    def shutdown_max_wait(self, value: timedelta) -> JobRegistryBuilder:
        self._scheduler.shutdown_max_wait(value)
        return self

    def customize_scheduler(self, fn: Callable[[SchedulerBuilder], Any]) -> JobRegistryBuilder:
        """Runs last in ``build()``; may override any setting, including the ones above."""
        self._customizers.append(fn)
        return self

    def build(self) -> JobRegistry:
        for fn in self._customizers:
            fn(self._scheduler)
        config = self._scheduler.config
        config.validate()
        jobs = _validate_jobs(self._jobs)
        by_name = {job.name(): job for job in jobs}
        check_overrides(config.job_overrides, by_name)
        for name, job in by_name.items():
            resolve_limits(job, config.job_overrides.get(name))  # raises naming the value
        if self._connection is None:
            raise ConfigurationError(
                "no database configured: call .connection_provider('postgresql+asyncpg://...') "
                "with a URL, an AsyncEngine or a ConnectionProvider"
            )
        provider = self._provider(config)
        if config.pooler == TRANSACTION_POOLING and config.listen:
            config.listen = False  # LISTEN would hold a shared server connection, deaf
        _choose_liveness(config, _pool_size(provider))
        if config.listen and _pool_size(provider) == 1:
            # LISTEN holds its connection for good: the only one would be gone for the polls
            config.listen = False
            log.info(
                "pool_size=1: no LISTEN (it would hold the only connection); new work is "
                "found by the polls, within one polling interval"
            )
        timeout = config.statement_timeout
        store = open_store(
            provider.engine,
            config.dialect or provider.dialect,
            config.table_name,
            statement_timeout=timeout.total_seconds() if timeout is not None else None,
        )
        return JobRegistry(provider, store, jobs, config)

    def _provider(self, config: SchedulerConfig) -> ConnectionProvider:
        """The pool: built now from a URL with the pooler and session settings."""
        bound = config.idle_transaction_timeout
        assert self._connection is not None
        provider = resolve_connection(
            self._connection,
            pool_size=self._pool_size,
            pooler=config.pooler,
            idle_transaction_timeout=bound.total_seconds() if bound else None,
        )
        if provider.options is None and config.pooler == TRANSACTION_POOLING:
            log.warning(
                "pooler=%s with an engine the application built: the scheduler sends no "
                "LISTEN and takes no session lock, but the engine's prepared statements are "
                "its own to configure (statement_cache_size=0, prepared_statement_cache_size=0, "
                "unnamed statements: see docs/deployment.md), or pass the URL instead",
                TRANSACTION_POOLING,
            )
        return provider


def _choose_liveness(config: SchedulerConfig, pool_size: int | None) -> None:
    """``liveness_lock``: where sessions are not stable, or the instance is to hold one
    connection only (``pool_size=1``; the lock's connection is held outside the pool), ``auto``
    is off and ``on`` refused."""
    mode = config.liveness_lock
    if mode == "off":
        return
    reason = None
    if config.pooler == TRANSACTION_POOLING:
        reason = f"pooler={TRANSACTION_POOLING} shares server sessions between clients"
    elif pool_size == 1:
        reason = "pool_size=1 asks for one connection per instance (the lock needs its own)"
    if reason is None:
        return
    if mode == "on":
        raise ConfigurationError(
            f"liveness_lock is on, but {reason}: set liveness_lock to auto or off (peers then "
            "revive this instance's executions after the dead window)"
        )
    config.liveness_lock = "off"
    log.info("no liveness lock: %s; dead executions wait for the dead window", reason)


def _pool_size(provider: ConnectionProvider) -> int | None:
    """The most connections the provider's pool opens, where the pool says (QueuePool)."""
    pool: Any = provider.engine.pool
    size, overflow = getattr(pool, "size", None), getattr(pool, "_max_overflow", None)
    if callable(size) and isinstance(overflow, int) and overflow >= 0:
        return int(size()) + overflow
    return None


def _validate_jobs(jobs: list[Job]) -> list[Job]:
    seen: dict[str, Job] = {}
    for job in jobs:
        if isinstance(job, type):
            raise ConfigurationError(
                f"with_job takes a job instance, got the class {job.__name__}; "
                f"write with_job({job.__name__}(...))"
            )
        if not isinstance(job, DistributedJob | OneTimeJob):
            raise ConfigurationError(
                f"{job!r} is not a DistributedJob or OneTimeJob; subclass one of them"
            )
        name = job.name()
        kind = type(job).__name__
        if not is_valid_name(name):
            raise ConfigurationError(
                f"{kind}.name() must return 1 to {MAX_NAME_LENGTH} characters (no NUL, no lone "
                f"surrogate), not blank, not '.' or '..', got {name!r}"
            )
        if name in seen:
            raise ConfigurationError(
                f"two jobs are named {name!r} ({type(seen[name]).__name__} and {kind}); "
                "job names are cluster-wide unique task names"
            )
        if isinstance(job, DistributedJob):
            _check_recurring(job, kind)
        elif isinstance(job, PersistentScheduleJob):
            checked_overlap(job.overlap(), kind)
        seen[name] = job
    return list(seen.values())


def _check_recurring(job: DistributedJob, kind: str) -> None:
    try:
        schedule = job.schedule()
    except ScheduleError as error:  # a bad cron, zone or duration: say whose
        raise ScheduleError(f"job {job.name()!r} ({kind}.schedule()): {error}") from None
    if not isinstance(schedule, Schedule):
        raise ConfigurationError(
            f"{kind}.schedule() must return a Schedule (see Schedules), got {schedule!r}"
        )
    catch_up = job.catch_up()
    if not isinstance(catch_up, CatchUp):
        raise ConfigurationError(
            f"{kind}.catch_up() must return CatchUp.latest(), CatchUp.all(max_slots) or "
            f"CatchUp.skip(grace), got {catch_up!r}"
        )
    checked_overlap(job.overlap(), kind)


def job_registry() -> JobRegistryBuilder:
    """Start building a JobRegistry."""
    return JobRegistryBuilder()


class JobRegistry:
    """The running unit: one scheduler over one jobs pool, started and stopped as one."""

    def __init__(
        self,
        provider: ConnectionProvider,
        store: Store,
        jobs: list[Job],
        config: SchedulerConfig,
    ) -> None:
        self.connection = provider
        self.store = store
        self.config = config
        self.jobs = {job.name(): job for job in jobs}
        self.scheduler = Scheduler(store, jobs, config)
        observer = self.scheduler.observer
        self.client = SchedulerClient(
            store,
            self.jobs,
            self.scheduler,
            dead_after=config.dead_after,
            carrier=observer.scheduling_context if observer.carries_context else None,
        )
        self._started = False

    @property
    def engine(self) -> AsyncEngine:
        return self.connection.engine

    async def start(self) -> None:
        """Start scheduling in the background; returns without waiting for the database."""
        if self._started:
            return
        self._started = True
        await self.scheduler.start()

    async def stop(self) -> None:
        """Stop in two phases (see ``shutdown_max_wait``), then close the pool if ours."""
        if not self._started:
            return
        self._started = False
        try:
            await self.scheduler.stop()
        finally:
            # Closing a connection politely waits for the server's answer: bounded, so that a
            # database that went silent cannot hold up the exit.
            await self.connection.dispose(self.config.shutdown_results_wait.total_seconds())

    async def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until the scheduler has reached the database and created its rows."""
        return await self.scheduler.wait_until_ready(timeout)

    def status(self) -> SchedulerStatus:
        return self.scheduler.status()

    async def __aenter__(self) -> JobRegistry:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
