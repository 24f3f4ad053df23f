"""``EkbatanState``: what the running integration exposes (``request.state.ekbatan``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..client import SchedulerClient
from ..domain.job import Job
from ..registry import JobRegistry
from ..settings import EkbatanSettings

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

    @property
    def client(self) -> SchedulerClient:
        return self.registry.client
