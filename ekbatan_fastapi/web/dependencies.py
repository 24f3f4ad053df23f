"""FastAPI dependencies that hand the running integration to routes (and to job providers).

``get_ekbatan_settings`` also works as a provider for job classes: at startup the lifespan
answers it with the settings it was started with, so a provider can read them::

    def get_mailer(settings: Annotated[EkbatanSettings, Depends(get_ekbatan_settings)]): ...
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from ..client import SchedulerClient
from ..settings import EkbatanSettings
from .state import STATE_KEY, EkbatanState

__all__ = ["get_ekbatan", "get_ekbatan_settings", "get_scheduler_client"]


def get_ekbatan(request: Request) -> EkbatanState:
    """The running integration, from the lifespan state (or ``app.state``)."""
    state: Any = getattr(request.state, STATE_KEY, None)
    if state is None:
        state = getattr(request.app.state, STATE_KEY, None)
    if state is None:
        raise HTTPException(
            status_code=500,
            detail=(
                "ekbatan is not running in this application: create it with "
                "FastAPI(lifespan=ekbatan_lifespan) or compose create_ekbatan_lifespan(...) "
                "with your own lifespan"
            ),
        )
    return state  # type: ignore[no-any-return]


def get_ekbatan_settings(request: Request) -> EkbatanSettings:
    """The settings the integration was started with."""
    return get_ekbatan(request).settings


def get_scheduler_client(
    state: Annotated[EkbatanState, Depends(get_ekbatan)],
) -> SchedulerClient:
    """The client for scheduling one-time tasks and reading the table from a route."""
    return state.client
