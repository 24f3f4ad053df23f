"""``ekbatan_lifespan``: builds the JobRegistry from settings and discovered jobs, starts it
when the application starts and stops it (two-phase) when the application stops.

The lifespan never installs signal handlers (the server owns them) and never waits for the
database: an application starts while its database is unreachable, and ``/jobs`` says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.engine import URL
from starlette.applications import Starlette

from ..domain.errors import ConfigurationError, ScheduleError
from ..domain.job import Job
from ..domain.logs import library_logger
from ..engine.logs import show_library_logs
from ..registry import ConnectionSource, JobRegistry, SchedulerBuilder, job_registry
from ..settings import EkbatanSettings
from ..settings.keys import canonical_key
from ..store.connection import DEFAULT_POOL_SIZE, ConnectionProvider
from .dependencies import get_ekbatan_settings
from .discovery import discover_job_classes, import_job_modules
from .errors import shorten_startup_failure
from .reads import open_web_reads
from .resolver import DependencyResolver
from .state import STATE_KEY, EkbatanState

__all__ = [
    "AppLifespan",
    "EkbatanLifespan",
    "build_registry",
    "create_ekbatan_lifespan",
    "ekbatan_lifespan",
]

log = library_logger(__name__)

AppLifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]


def build_registry(
    settings: EkbatanSettings,
    jobs: Iterable[Job],
    *,
    connection: ConnectionSource | None = None,
    customize: Callable[[SchedulerBuilder], Any] | None = None,
) -> JobRegistry:
    """A JobRegistry configured from ``settings``; opens no connection.

    The pool is the ``jobs-config`` slot of the default shard's first member unless
    ``connection`` (a URL, AsyncEngine or ConnectionProvider) is given. ``customize`` runs
    last and may override any setting (``b.missed_heartbeats_limit(8)``, ``b.dialect(...)``).
    """
    knobs = settings.jobs
    config = knobs.config
    pool_size = DEFAULT_POOL_SIZE
    source: ConnectionSource
    if connection is not None:
        source = connection
    else:
        datasource = settings.jobs_datasource()
        source, pool_size = datasource.sqlalchemy_url(), datasource.maximum_pool_size

    jobs = list(jobs)
    names = _override_names(knobs.overrides, jobs)
    if config.opentelemetry_statements and not config.opentelemetry:
        raise ConfigurationError(
            "ekbatan.jobs.opentelemetry-statements is true but ekbatan.jobs.opentelemetry is "
            "not: statement spans are part of the tracing; set opentelemetry: true as well"
        )

    def apply_settings(b: SchedulerBuilder) -> None:
        b.set(**knobs.values())  # every setting by its name
        for key, override in knobs.overrides.items():
            b.job_override(
                names[key], timeout=override.timeout, max_concurrency=override.max_concurrency
            )
        if config.metrics:
            from ..metrics import EkbatanMetrics

            b.observer(EkbatanMetrics())
        if config.opentelemetry:
            from ..otel import EkbatanTracing

            b.observer(EkbatanTracing(statements=config.opentelemetry_statements))

    builder = (
        job_registry()
        .connection_provider(source, pool_size=pool_size)
        .with_jobs(jobs)
        .customize_scheduler(apply_settings)
    )
    if customize is not None:
        builder.customize_scheduler(customize)
    return builder.build()


def _override_names(overrides: Mapping[str, object], jobs: list[Job]) -> dict[str, str]:
    """Each job's name by its settings key (``overrides`` spell job names like keys); two
    jobs with one key, or an override naming no job, are errors."""
    by_key: dict[str, str] = {}
    for job in jobs:
        key = canonical_key(job.name())
        if key in by_key and overrides:
            raise ConfigurationError(
                f"jobs {by_key[key]!r} and {job.name()!r} are the same key in settings "
                "(overrides spell job names like settings keys): rename one"
            )
        by_key[key] = job.name()
    unknown = sorted(set(overrides) - set(by_key))
    if unknown:
        raise ConfigurationError(
            f"ekbatan.jobs.overrides names {', '.join(map(repr, unknown))}, which no registered "
            f"job is called; registered jobs: {', '.join(sorted(by_key.values())) or 'none'}"
        )
    return by_key


class EkbatanLifespan:
    """A Starlette/FastAPI lifespan; build one with ``create_ekbatan_lifespan``."""

    def __init__(
        self,
        *,
        settings: EkbatanSettings | None = None,
        jobs: Sequence[Job | type[Job]] = (),
        modules: Sequence[str] = (),
        discover: bool = True,
        connection: ConnectionSource | None = None,
        customize: Callable[[SchedulerBuilder], Any] | None = None,
        registry: JobRegistry | None = None,
        app_lifespan: AppLifespan | None = None,
    ) -> None:
        for item in jobs:
            if not isinstance(item, Job) and not (isinstance(item, type) and issubclass(item, Job)):
                raise ConfigurationError(
                    f"jobs=[...] takes job instances or job classes, got {item!r}"
                )
        if registry is not None and (jobs or modules or connection or customize):
            raise ConfigurationError(
                "registry=... is a ready-made JobRegistry: give its jobs and connection to "
                "the builder, not also jobs=, modules=, connection= or customize= here"
            )
        self._settings = settings
        self._jobs = tuple(jobs)
        self._modules = tuple(modules)
        self._discover = discover
        self._connection = connection
        self._customize = customize
        self._registry = registry
        self._app_lifespan = app_lifespan

    def __call__(self, app: Starlette) -> AbstractAsyncContextManager[Mapping[str, Any]]:
        return self._lifespan(app)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[Mapping[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            try:
                app_state: Mapping[str, Any] | None = None
                if self._app_lifespan is not None:
                    # The application's own resources open first and close last: jobs may
                    # use them.
                    app_state = await stack.enter_async_context(self._app_lifespan(app))
                state = await stack.enter_async_context(self._run(app))
            except (ConfigurationError, ScheduleError) as error:
                # A bad setting or job definition: the server shows its message alone, on
                # one line, not under Starlette's traceback (web/errors.py), and stops.
                shorten_startup_failure(error)
                raise
            yield {**(app_state or {}), STATE_KEY: state}

    @contextlib.asynccontextmanager
    async def _run(self, app: Starlette) -> AsyncIterator[EkbatanState]:
        settings = self._settings if self._settings is not None else EkbatanSettings()
        async with contextlib.AsyncExitStack() as stack:
            undo_logs = show_library_logs(settings.jobs.config.log_handler)
            if undo_logs is not None:
                stack.callback(undo_logs)
            if self._registry is not None:
                registry = self._registry
            else:
                if self._connection is None:
                    # A missing or unreadable database setting fails before any provider runs.
                    settings.jobs_datasource().sqlalchemy_url()
                jobs = await self._resolve_jobs(app, settings, stack)
                registry = build_registry(
                    settings, jobs, connection=self._connection, customize=self._customize
                )
            log.info(
                "ekbatan: starting %d jobs (%s) on %r",
                len(registry.jobs),
                ", ".join(sorted(registry.jobs)) or "none",
                registry.connection,
            )
            if not registry.jobs:
                log.warning(
                    "ekbatan: no job is registered, so this instance runs nothing. List the "
                    "modules that define your @distributed_job classes in ekbatan.jobs.modules "
                    "(EKBATAN_JOBS__MODULES=myapp.jobs), import them before the application "
                    "starts, or pass create_ekbatan_lifespan(jobs=[...]) or (modules=[...])"
                )
            # The unauthenticated reads' own pool (issue 27): closed after the registry stops.
            reads = open_web_reads(registry, settings, self._read_url(settings))
            stack.push_async_callback(reads.close)
            await registry.start()
            # Pushed after the providers' teardowns, so it runs before them (LIFO).
            stack.push_async_callback(registry.stop)
            state = EkbatanState(settings, registry, dict(registry.jobs), reads)
            setattr(app.state, STATE_KEY, state)
            try:
                yield state
            finally:
                if getattr(app.state, STATE_KEY, None) is state:
                    delattr(app.state, STATE_KEY)

    def _read_url(self, settings: EkbatanSettings) -> str | URL | None:
        """The URL the scheduler's pool was built from, for the web reads' own pool; None
        when the application handed over a registry, an engine or a provider."""
        if self._registry is not None:
            return None
        if self._connection is None:
            return settings.jobs_datasource().sqlalchemy_url()
        return self._connection if isinstance(self._connection, str | URL) else None

    async def build_jobs(
        self,
        app: Starlette,
        stack: contextlib.AsyncExitStack,
        settings: EkbatanSettings | None = None,
    ) -> list[Job]:
        """The jobs this lifespan runs in ``app``, built with their providers (and
        ``app.dependency_overrides``), teardowns pushed onto ``stack``; no scheduler, no
        database (``ekbatan_fastapi.testing.build_jobs``)."""
        if self._registry is not None:
            return list(self._registry.jobs.values())
        if settings is None:
            settings = self._settings if self._settings is not None else EkbatanSettings()
        return await self._resolve_jobs(app, settings, stack)

    async def _resolve_jobs(
        self, app: Starlette, settings: EkbatanSettings, stack: contextlib.AsyncExitStack
    ) -> list[Job]:
        """Instances as given; classes (given or discovered) built once with their providers."""
        import_job_modules(settings.jobs.config.modules)
        import_job_modules(self._modules, setting="create_ekbatan_lifespan(modules=...)")
        given = [job for job in self._jobs if isinstance(job, Job)]
        classes: list[type[Job]] = [job for job in self._jobs if isinstance(job, type)]
        if self._discover:
            classes += discover_job_classes()
        taken = {type(job) for job in given}
        resolver = DependencyResolver(
            stack,
            overrides=getattr(app, "dependency_overrides", None),
            preset={get_ekbatan_settings: settings},
        )
        jobs = list(given)
        for cls in dict.fromkeys(classes):
            if cls not in taken:
                jobs.append(await resolver.instantiate(cls))
        return jobs


def create_ekbatan_lifespan(
    *,
    settings: EkbatanSettings | None = None,
    jobs: Sequence[Job | type[Job]] = (),
    modules: Sequence[str] = (),
    discover: bool = True,
    connection: ConnectionSource | ConnectionProvider | None = None,
    customize: Callable[[SchedulerBuilder], Any] | None = None,
    registry: JobRegistry | None = None,
    app_lifespan: AppLifespan | None = None,
) -> EkbatanLifespan:
    """A lifespan for everything non-default.

    * ``settings``: instead of reading ``EkbatanSettings()`` at startup;
    * ``jobs``: job instances (used as they are) and classes (built with their providers),
      in addition to the discovered ones; ``discover=False`` keeps only these;
    * ``modules``: imported at startup, in addition to ``ekbatan.jobs.modules``;
    * ``connection``: the jobs pool, instead of the ``jobs-config`` slot;
    * ``customize``: runs last on the scheduler settings (``b.missed_heartbeats_limit(8)``);
    * ``registry``: a JobRegistry wired by hand; it is only started and stopped;
    * ``app_lifespan``: the application's own lifespan; it is entered first and exited last,
      and the state it yields is merged with ours.
    """
    return EkbatanLifespan(
        settings=settings,
        jobs=jobs,
        modules=modules,
        discover=discover,
        connection=connection,
        customize=customize,
        registry=registry,
        app_lifespan=app_lifespan,
    )


ekbatan_lifespan = EkbatanLifespan()
"""The default lifespan: ``FastAPI(lifespan=ekbatan_lifespan)``."""
