"""``EkbatanState``: what the running integration exposes (``request.state.ekbatan``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..client import SchedulerClient
from ..client.read_model import ReadModel
from ..domain.job import Job
from ..registry import JobRegistry
from ..settings import EkbatanSettings
from .reads import WebReads, reads_of

__all__ = ["STATE_KEY", "EkbatanState"]

STATE_KEY = "ekbatan"
"""The lifespan-state key (``request.state.ekbatan``) and ``app.state`` attribute."""


@dataclass(frozen=True)
class EkbatanState:
    """The settings, the running registry and the job singletons of one application."""

    settings: EkbatanSettings
    registry: JobRegistry
    jobs: Mapping[str, Job] = field(default_factory=dict)
    """The job instances by name (the managed singletons)."""
    reads: WebReads | None = None
    """The read budget of ``/jobs``, its history and the dashboard (``web/reads.py``): the
    lifespan opens it; None: a gate on the scheduler's pool, made on first use."""

    @property
    def client(self) -> SchedulerClient:
        return self.registry.client

    def read_model(self) -> ReadModel:
        """The operator read model (``client/read_model.py``) over the read budget's client
        (``web/reads.py``): what ``/jobs``, its history and the dashboard show."""
        return ReadModel.of(reads_of(self).client, self.registry.scheduler)
