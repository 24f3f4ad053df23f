"""``GET /metrics``: the scheduler's Prometheus metrics (the ``[metrics]`` extra).

Turn them on with ``ekbatan.jobs.metrics: true`` (environment ``EKBATAN_JOBS__METRICS=true``)
or register an ``EkbatanMetrics`` yourself (``customize=lambda b: b.observer(metrics)``);
the route serves the first one the running registry has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response, params

from ..domain.logs import library_logger
from ..domain.persistent import PersistentScheduleJob
from ..metrics import EkbatanMetrics
from .dependencies import get_ekbatan
from .reads import reads_of
from .state import EkbatanState

__all__ = ["create_metrics_router", "find_metrics", "metrics_router"]

State = Annotated[EkbatanState, Depends(get_ekbatan)]


def find_metrics(state: EkbatanState) -> EkbatanMetrics | None:
    """The ``EkbatanMetrics`` registered with the running registry, if any."""
    for observer in state.registry.config.observers:
        if isinstance(observer, EkbatanMetrics):
            return observer
    return None


def create_metrics_router(
    *, path: str = "/metrics", dependencies: Sequence[params.Depends] = ()
) -> APIRouter:
    """A router with ``GET <path>`` in the Prometheus text format (OpenMetrics when the
    scraper asks for it). ``dependencies`` guard it (e.g. an IP allow-list or a token)."""
    router = APIRouter(dependencies=list(dependencies))

    @router.get(path, include_in_schema=False)
    async def metrics(request: Request, state: State) -> Response:
        """The Prometheus metrics of this instance (text format, or OpenMetrics when the
        scraper asks for it); 404 while metrics are off (``ekbatan.jobs.metrics``)."""
        found = find_metrics(state)
        if found is None:
            raise HTTPException(
                status_code=404,
                detail=(
                    "metrics are off: set ekbatan.jobs.metrics: true (environment "
                    "EKBATAN_JOBS__METRICS=true) and pip install 'ekbatan-fastapi[metrics]'"
                ),
            )
        if any(isinstance(j, PersistentScheduleJob) for j in state.jobs.values()):
            try:  # one grouped read, shared by the scrapes within the read cache interval
                counts = await reads_of(state).read(
                    ("schedule-counts",), state.client.schedule_counts
                )
                found.schedules_counted(counts)
            except Exception as error:  # the other metrics are still worth a scrape
                log.debug("could not count the schedules for /metrics: %s", error)
        body, content_type = found.render(request.headers.get("accept"))
        return Response(content=body, media_type=content_type)

    return router


log = library_logger(__name__)

metrics_router = create_metrics_router()
"""``app.include_router(metrics_router)``: ``GET /metrics``."""
