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
from .domain.clock import Clock
from .domain.errors import ConfigurationError
from .domain.job import DistributedJob, Job, OneTimeJob
from .domain.limits import JobOverride, check_overrides, resolve_limits
from .domain.logs import library_logger
from .domain.schedules import Schedule
from .domain.text import MAX_NAME_LENGTH, is_valid_name
from .engine.config import SchedulerConfig
from .engine.observer import SchedulerObserver
from .engine.scheduler import Scheduler
from .engine.status import SchedulerStatus
from .store.connection import DEFAULT_POOL_SIZE, ConnectionProvider, resolve_connection
from .store.dialects import Dialect, Store, open_store
from .store.options import DEFAULT_IDLE_TRANSACTION_TIMEOUT, TRANSACTION_POOLING, validate_pooler
from .store.tables import DEFAULT_TABLE_NAME, validate_table_name

__all__ = ["JobRegistry", "JobRegistryBuilder", "SchedulerBuilder", "job_registry"]

log = library_logger(__name__)

ConnectionSource = str | URL | AsyncEngine | ConnectionProvider


class SchedulerBuilder:
    """Every scheduler setting; ``customize_scheduler`` receives one and may change anything."""

    def __init__(self) -> None:
        self.config = SchedulerConfig()
        self._dialect: str | Dialect | None = None
        self._table_name = DEFAULT_TABLE_NAME
        self._statement_timeout: timedelta | None = timedelta(seconds=30)
        self._pooler = "none"
        self._idle_transaction_timeout: timedelta | None = timedelta(
            seconds=DEFAULT_IDLE_TRANSACTION_TIMEOUT
        )

    def polling_interval(self, value: timedelta) -> SchedulerBuilder:
        self.config.polling_interval = value
        return self

    def heartbeat_interval(self, value: timedelta) -> SchedulerBuilder:
        self.config.heartbeat_interval = value
        return self

    def shutdown_max_wait(self, value: timedelta) -> SchedulerBuilder:
        self.config.shutdown_max_wait = value
        return self

    def shutdown_results_wait(self, value: timedelta) -> SchedulerBuilder:
        """How long a stop waits for the database to record the last results (default 5 s);
        what is left unrecorded is revived after the dead window."""
        self.config.shutdown_results_wait = value
        return self

    def missed_heartbeats_limit(self, value: int) -> SchedulerBuilder:
        self.config.missed_heartbeats_limit = value
        return self

    def delete_unresolved_after(self, value: timedelta) -> SchedulerBuilder:
        self.config.delete_unresolved_after = value
        return self

    def polling_strategy(self, value: str) -> SchedulerBuilder:
        """``"lock-and-fetch"`` (FOR UPDATE SKIP LOCKED) or ``"fetch"`` (optimistic)."""
        self.config.polling_strategy = value
        return self

    def batch_size(self, value: int) -> SchedulerBuilder:
        self.config.batch_size = value
        return self

    def scheduler_name(self, value: str) -> SchedulerBuilder:
        self.config.scheduler_name = value
        return self

    def history(self, value: bool) -> SchedulerBuilder:
        """Record each execution in the history table (default True)."""
        self.config.history = value
        return self

    def history_retention(self, value: timedelta) -> SchedulerBuilder:
        """How long history records are kept (default 7 days)."""
        self.config.history_retention = value
        return self

    def listen(self, value: bool) -> SchedulerBuilder:
        """Use LISTEN/NOTIFY for newly scheduled work where supported (default True)."""
        self.config.listen = value
        return self

    def clock(self, value: Clock) -> SchedulerBuilder:
        self.config.clock = value
        return self

    def observer(self, value: SchedulerObserver) -> SchedulerBuilder:
        """Add an observer of the scheduler's events (e.g. ``ekbatan_fastapi.metrics``)."""
        if not isinstance(value, SchedulerObserver):
            raise ConfigurationError(
                f"observer must be a SchedulerObserver (ekbatan_fastapi.observer), got {value!r}"
            )
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

    def app_version(self, value: str | None) -> SchedulerBuilder:
        """The application's version (e.g. ``"2026.12.1"``), written with the job definitions:
        during a rolling deploy an older version never changes what a newer one wrote."""
        self.config.app_version = value
        return self

    def timeout_grace(self, value: timedelta) -> SchedulerBuilder:
        """How long a timed-out async execution may clean up after its cancellation before
        it is abandoned (default: one heartbeat interval)."""
        self.config.timeout_grace = value
        return self

    def claim_ahead(self, value: timedelta) -> SchedulerBuilder:
        """Claim rows that come due within ``value`` and start each at its own time (default
        0): for many jobs due in the same second (docs/schedules.md)."""
        self.config.claim_ahead = value
        return self

    def statement_timeout(self, value: timedelta | None) -> SchedulerBuilder:
        """How long one database statement may take (default 30 s; None: unbounded). A
        connection that died without a reset never answers; past this bound it is discarded
        and the statement retried on a new one, instead of the loop waiting forever."""
        self._statement_timeout = value
        return self

    def pooler(self, value: str | None) -> SchedulerBuilder:
        """What sits between the scheduler and PostgreSQL: ``"none"`` (default; also right for
        PgBouncer's session mode) or ``"pgbouncer-transaction"``: the pool built from the URL
        then keeps no prepared statement past its statement, and LISTEN is off (polling and
        due-time wake-ups go on). See docs/deployment.md."""
        self._pooler = validate_pooler(value)
        return self

    def idle_transaction_timeout(self, value: timedelta | None) -> SchedulerBuilder:
        """MySQL/MariaDB (default 10 s): the library's sessions wait at most this long for a
        row lock, and on MariaDB the server ends a transaction of theirs left idle this long
        (orphaned by a partition) so that its locks cannot stall the cluster. None: leave the
        server's session settings alone."""
        self._idle_transaction_timeout = value
        return self

    def dialect(self, value: str | Dialect) -> SchedulerBuilder:
        """Override the dialect read from the URL (e.g. ``"mysql5"`` for MySQL before 8), by
        name or as a ``Dialect`` (see ``ekbatan_fastapi.store.dialects``)."""
        self._dialect = value
        return self

    def table_name(self, value: str) -> SchedulerBuilder:
        self._table_name = value
        return self


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
        for name in ("polling_interval", "heartbeat_interval", "shutdown_max_wait"):
            value = getattr(config, name)
            if not isinstance(value, timedelta):
                raise ConfigurationError(
                    f"{name} must be a datetime.timedelta, got {type(value).__name__} {value!r}; "
                    "e.g. timedelta(seconds=10)"
                )
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
        provider = self._provider()
        table_name = validate_table_name(self._scheduler._table_name)
        timeout = self._scheduler._statement_timeout
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigurationError(
                f"statement_timeout must be a positive timedelta or None, got {timeout!r}"
            )
        if self._scheduler._pooler == TRANSACTION_POOLING and config.listen:
            config.listen = False  # LISTEN would hold a shared server connection, deaf
        if config.listen and _pool_size(provider) == 1:
            # LISTEN holds its connection for good: the only one would be gone for the polls
            config.listen = False
            log.info(
                "pool_size=1: no LISTEN (it would hold the only connection); new work is "
                "found by the polls, within one polling interval"
            )
        store = open_store(
            provider.engine,
            self._scheduler._dialect or provider.dialect,
            table_name,
            statement_timeout=timeout.total_seconds() if timeout is not None else None,
        )
        return JobRegistry(provider, store, jobs, config)

    def _provider(self) -> ConnectionProvider:
        """The pool: built now from a URL with the pooler and session settings."""
        scheduler = self._scheduler
        bound = scheduler._idle_transaction_timeout
        if bound is not None and (not isinstance(bound, timedelta) or bound < timedelta(0)):
            raise ConfigurationError(
                f"idle_transaction_timeout must be a timedelta (zero or None: leave the server's "
                f"settings), got {bound!r}"
            )
        assert self._connection is not None
        provider = resolve_connection(
            self._connection,
            pool_size=self._pool_size,
            pooler=scheduler._pooler,
            idle_transaction_timeout=bound.total_seconds() if bound else None,
        )
        if provider.options is None and scheduler._pooler == TRANSACTION_POOLING:
            log.warning(
                "pooler=%s with an engine the application built: the scheduler sends no "
                "LISTEN and takes no session lock, but the engine's prepared statements are "
                "its own to configure (statement_cache_size=0, prepared_statement_cache_size=0, "
                "unnamed statements: see docs/deployment.md), or pass the URL instead",
                TRANSACTION_POOLING,
            )
        return provider


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
                f"surrogate), got {name!r}"
            )
        if name in seen:
            raise ConfigurationError(
                f"two jobs are named {name!r} ({type(seen[name]).__name__} and {kind}); "
                "job names are cluster-wide unique task names"
            )
        if isinstance(job, DistributedJob):
            _check_recurring(job, kind)
        seen[name] = job
    return list(seen.values())


def _check_recurring(job: DistributedJob, kind: str) -> None:
    schedule = job.schedule()
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
