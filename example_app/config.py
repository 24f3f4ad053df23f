"""The example's own settings (``EXAMPLE_`` environment variables), next to ekbatan's."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ekbatan_fastapi.domain.durations import parse_iso_duration


def _iso(value: Any) -> Any:
    return parse_iso_duration(value) if isinstance(value, str) else value


class ExampleSettings(BaseSettings):
    """``EXAMPLE_DEMO_INTERVAL`` (ISO-8601, default PT5S), ``EXAMPLE_ADMIN_TOKEN``."""

    model_config = SettingsConfigDict(env_prefix="EXAMPLE_", frozen=True)

    demo_interval: Annotated[timedelta, BeforeValidator(_iso)] = timedelta(seconds=5)
    admin_token: SecretStr | None = None
    """Enables the admin routes (run now, pause, resume) and the dashboard's buttons for callers
    sending ``X-Admin-Token: <token>``, or signing in (HTTP basic) with the token as password."""


@lru_cache
def get_example_settings() -> ExampleSettings:
    """A provider (usable with ``Depends``): read once per process."""
    return ExampleSettings()
