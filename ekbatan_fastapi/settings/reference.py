"""The settings reference: every setting with its key, environment variable, default, type,
bounds and description, from the one list (``SchedulerConfig``). The docs' table of settings
is built from ``settings_reference()``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..domain.durations import format_iso_duration
from ..engine.config import Kind, Setting, settings_of
from .model import OVERRIDE_TIMEOUT

__all__ = ["SettingReference", "settings_reference"]

_TYPES: dict[Kind, str] = {
    "duration": "duration (ISO-8601)",
    "integer": "integer",
    "boolean": "boolean",
    "text": "text",
    "texts": "list of text",
    "object": "Python object",
}


@dataclass(frozen=True)
class SettingReference:
    """One row of the settings reference."""

    name: str
    """The ``SchedulerConfig`` field and the builder's method (``polling_interval``)."""
    key: str | None
    """The key under ``ekbatan.jobs`` (``polling-interval``); None: the builder's only."""
    environment: str | None
    """``EKBATAN_JOBS__POLLING_INTERVAL``; None: the builder's only."""
    default: str
    type: str
    description: str
    shortest: str | None = None
    longest: str | None = None
    builder: bool = True
    """Set with ``b.<name>(value)`` in ``customize_scheduler``; False: read by the FastAPI
    integration from the settings only."""


def _bound(value: object) -> str | None:
    if value is None:
        return None
    return format_iso_duration(value) if isinstance(value, timedelta) else str(value)


def _row(setting: Setting) -> SettingReference:
    return SettingReference(
        name=setting.name,
        key=setting.key if setting.in_file else None,
        environment=setting.environment,
        default=setting.default_text,
        type=_TYPES[setting.kind] + (" or none" if setting.optional else ""),
        description=setting.description,
        shortest=_bound(setting.shortest),
        longest=_bound(setting.longest),
        builder=setting.builder,
    )


def settings_reference() -> list[SettingReference]:
    """Every setting, in declaration order, then the per-job overrides."""
    return [
        *(_row(setting) for setting in settings_of()),
        SettingReference(
            name="job_override",
            key="overrides.<job>.timeout",
            environment="EKBATAN_JOBS__OVERRIDES__<JOB>__TIMEOUT",
            default="none",
            type="duration (ISO-8601) or none",
            description=OVERRIDE_TIMEOUT.description[:-1]
            + "; the builder: b.job_override(name, timeout=...).",
            shortest=_bound(OVERRIDE_TIMEOUT.shortest),
            longest=_bound(OVERRIDE_TIMEOUT.longest),
        ),
        SettingReference(
            name="job_override",
            key="overrides.<job>.max-concurrency",
            environment="EKBATAN_JOBS__OVERRIDES__<JOB>__MAX_CONCURRENCY",
            default="none",
            type="integer or none",
            description="At most this many executions of the job at once, cluster-wide, "
            "winning over its class's max_concurrency() (the builder: "
            "b.job_override(name, max_concurrency=...)).",
            shortest="1",
        ),
    ]
