"""``build_jobs``: an application's jobs, built as its lifespan builds them (discovery,
providers, ``app.dependency_overrides``), with no scheduler started and no database."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from ..domain.errors import ConfigurationError
from ..domain.job import Job

if TYPE_CHECKING:
    from ..settings import EkbatanSettings
    from ..web.lifespan import EkbatanLifespan

__all__ = ["build_jobs"]


def _lifespan_of(app: Any) -> EkbatanLifespan:
    """The ``EkbatanLifespan`` the application was created with, or the default one."""
    from ..web.lifespan import EkbatanLifespan, ekbatan_lifespan

    router = getattr(app, "router", None)
    found = getattr(router, "lifespan_context", None)
    return found if isinstance(found, EkbatanLifespan) else ekbatan_lifespan


@contextlib.asynccontextmanager
async def build_jobs(
    app: Any,
    *,
    settings: EkbatanSettings | None = None,
    lifespan: EkbatanLifespan | None = None,
    jobs: Sequence[Job | type[Job]] | None = None,
    modules: Sequence[str] = (),
    discover: bool = True,
) -> AsyncIterator[dict[str, Job]]:
    """``async with build_jobs(app) as jobs:`` the job instances by name, built as the
    application's lifespan builds them at startup: the modules of ``ekbatan.jobs.modules``
    imported, the ``@distributed_job`` classes discovered, each built once with its
    providers, ``app.dependency_overrides`` applied. Generator providers are torn down when
    the block ends. Nothing is started and no database is needed.

    The lifespan is the one ``app`` was created with (``FastAPI(lifespan=...)`` given an
    ``ekbatan_lifespan`` or ``create_ekbatan_lifespan(...)``), else ``lifespan``; when it is
    neither, or ``jobs`` is given, one is made of ``jobs``, ``modules`` and ``discover`` as
    ``create_ekbatan_lifespan`` takes them. ``settings``: instead of the lifespan's (or
    ``EkbatanSettings()``).
    """
    from ..web.lifespan import EkbatanLifespan

    if jobs is not None or modules or not discover:
        chosen = EkbatanLifespan(
            settings=settings, jobs=tuple(jobs or ()), modules=modules, discover=discover
        )
    else:
        chosen = lifespan if lifespan is not None else _lifespan_of(app)
    async with contextlib.AsyncExitStack() as stack:
        built = await chosen.build_jobs(app, stack, settings)
        by_name: dict[str, Job] = {}
        for job in built:
            if job.name() in by_name:
                raise ConfigurationError(
                    f"two jobs are named {job.name()!r} ({type(by_name[job.name()]).__name__} "
                    f"and {type(job).__name__}); job names are cluster-wide unique task names"
                )
            by_name[job.name()] = job
        yield by_name
