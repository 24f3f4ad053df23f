"""``liveness-lock``: its values, where ``auto`` turns it off and where ``on`` refuses to start
(no database: the registries are built, never started)."""

from __future__ import annotations

import pytest

from ekbatan_fastapi import OneTimeJob, job_registry
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.engine.config import SchedulerConfig
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import build_registry

URL = "postgresql+asyncpg://app@db.invalid/app"


class Probe(OneTimeJob):
    def name(self) -> str:
        return "probe"

    async def execute(self, ctx: object) -> None:
        return None


def test_the_default_is_auto_and_a_bad_value_names_the_choices() -> None:
    assert EkbatanSettings().jobs.liveness_lock == "auto"
    assert EkbatanSettings(jobs={"liveness-lock": "off"}).jobs.liveness_lock == "off"
    with pytest.raises(ValueError, match=r"'sometimes'.*auto.*on.*off"):
        EkbatanSettings(jobs={"liveness-lock": "sometimes"})
    with pytest.raises(ConfigurationError, match="liveness_lock must be one of auto, on, off"):
        SchedulerConfig(liveness_lock="yes").validate()


def test_the_setting_reaches_the_scheduler() -> None:
    settings = EkbatanSettings(jobs={"liveness-lock": "off"})
    registry = build_registry(settings, [Probe()], connection=URL)
    assert registry.config.liveness_lock == "off"
    assert registry.scheduler.liveness is None


@pytest.mark.parametrize(
    ("customize", "why"),
    [
        (lambda b: b.pooler("pgbouncer-transaction"), "pgbouncer-transaction"),
        (lambda b: None, "pool_size=1"),
    ],
)
def test_auto_is_off_where_sessions_are_not_stable_and_on_refuses(customize, why) -> None:  # type: ignore[no-untyped-def]
    pool = 1 if why == "pool_size=1" else 5

    def build(mode: str):  # type: ignore[no-untyped-def]
        return (
            job_registry()
            .connection_provider(URL, pool_size=pool)
            .with_job(Probe())
            .customize_scheduler(customize)
            .customize_scheduler(lambda b: b.liveness_lock(mode))
            .build()
        )

    assert build("auto").config.liveness_lock == "off"
    with pytest.raises(ConfigurationError, match=f"liveness_lock is on, but .*{why}"):
        build("on")


def test_auto_is_on_for_a_direct_connection() -> None:
    registry = job_registry().connection_provider(URL).with_job(Probe()).build()
    assert registry.config.liveness_lock == "auto"
    assert registry.scheduler.liveness is not None
