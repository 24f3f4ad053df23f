"""One configuration model (issue 28 item 1): every setting is declared once, in
``SchedulerConfig``; the settings model, the builder, the validation and the reference follow
from it, and a variable under the ``EKBATAN_`` prefix that names no setting is an error that
names the nearest real one."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ekbatan_fastapi import ConfigurationError, job_registry
from ekbatan_fastapi.engine.config import SchedulerConfig, settings_of
from ekbatan_fastapi.settings import EkbatanSettings, JobsSettings, settings_reference
from ekbatan_fastapi.settings.model import DURATION_BOUNDS

UNREACHABLE = "postgresql+asyncpg://nobody@127.0.0.1:1/nowhere"


def build(**values: Any) -> Any:
    builder = job_registry().connection_provider(UNREACHABLE)
    return builder.customize_scheduler(lambda b: b.set(**values)).build()


# -- unknown EKBATAN_ variables ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("EKBATAN_JOB__POLLING_INTERVAL", "EKBATAN_JOBS__POLLING_INTERVAL"),  # the section
        ("EKBATAN_JOBS_POLLING_INTERVAL", "EKBATAN_JOBS__POLLING_INTERVAL"),  # one underscore
        ("EKBATAN_JOBS__POLL_INTERVAL", "EKBATAN_JOBS__POLLING_INTERVAL"),
        ("EKBATAN_JOBS__OVERRIDES__EXPORT__TIMOUT", "EKBATAN_JOBS__OVERRIDES__EXPORT__TIMEOUT"),
        (
            "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URI",
            "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL",
        ),
        ("EKBATAN_DATABASE_URI", "EKBATAN_DATABASE_URL"),
        ("EKBATAN_CONFIGFILE", "EKBATAN_CONFIG_FILE"),
    ],
)
def test_a_variable_naming_no_setting_is_an_error_naming_the_nearest(
    monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    monkeypatch.setenv(variable, "PT1S")
    with pytest.raises(ConfigurationError) as raised:
        EkbatanSettings()
    message = str(raised.value)
    assert f"(environment: {variable}): unknown key; did you mean {meant}?" in message
    assert "PT1S" not in message  # the value is never shown: it may be a secret


def test_a_value_or_a_list_spelt_as_a_section_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__POLLING_INTERVAL__SECONDS", "1")
    monkeypatch.setenv("EKBATAN_SHARDING__GROUPS__FIRST__MEMBERS", "[]")
    with pytest.raises(ConfigurationError) as raised:
        EkbatanSettings()
    message = str(raised.value)
    assert (
        "ekbatan.jobs.polling-interval.seconds" in message and "a value, not a section" in message
    )
    assert "ekbatan.sharding.groups.first" in message and "by index (__0__" in message


def test_every_unknown_variable_is_named_at_once_and_the_others_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__OVERRIDES__ANY_JOB__TIMEOUT", "PT1M")  # job names: any
    monkeypatch.setenv("EKBATAN_TEST_ANYTHING", "x")  # the test suite's own variables
    monkeypatch.setenv("EKBATAN_DATABASE_URL", "postgresql+asyncpg://db/app")
    monkeypatch.setenv("ekbatan_jobs__polling_interval", "PT2S")  # any case
    assert EkbatanSettings().jobs.polling_interval == timedelta(seconds=2)
    monkeypatch.setenv("EKBATAN_NOTHING", "1")
    monkeypatch.setenv("EKBATAN_JOBS__METRIX", "true")
    with pytest.raises(ConfigurationError) as raised:
        EkbatanSettings()
    message = str(raised.value)
    assert "EKBATAN_NOTHING" in message and "EKBATAN_JOBS__METRIX" in message
    assert "did you mean EKBATAN_JOBS__METRICS?" in message
    assert "the keys of ekbatan are jobs, sharding (and EKBATAN_CONFIG_FILE" in message


def test_a_dotenv_file_is_held_to_the_same_keys(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("EKBATAN_JOBS__POLLING_INTERVAL=PT3S\n", encoding="utf-8")
    settings = EkbatanSettings(_env_file=dotenv)
    assert settings.jobs.polling_interval == timedelta(seconds=3)
    dotenv.write_text("EKBATAN_JOB__POLLING_INTERVAL=PT3S\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="did you mean EKBATAN_JOBS__POLLING_INTERVAL"):
        EkbatanSettings(_env_file=dotenv)


def test_an_unknown_section_in_the_constructor_or_a_near_miss_in_the_file(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError, match=r"EkbatanSettings\(job=...\).*did you mean jobs"):
        EkbatanSettings(job={"polling-interval": "PT1S"})
    path = tmp_path / "application.yml"
    path.write_text("ekbatan:\n  job:\n    polling-interval: PT1S\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"ekbatan\.job in .*did you mean ekbatan\.jobs"):
        EkbatanSettings(_config_file=path)
    # another tool's section under ekbatan: (the JVM Ekbatan's) is left alone
    path.write_text("ekbatan:\n  events:\n    enabled: true\n", encoding="utf-8")
    assert EkbatanSettings(_config_file=path).jobs.polling_interval == timedelta(seconds=10)


# -- one list, one rule ----------------------------------------------------------------------


def test_every_setting_of_the_file_is_a_field_of_the_settings_model_by_its_name() -> None:
    in_file = [setting.name for setting in settings_of() if setting.in_file]
    assert [name for name in JobsSettings.model_fields if name != "overrides"] == in_file
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert {setting.name for setting in settings_of()} == fields
    for setting in settings_of():
        if setting.in_file:
            default = getattr(JobsSettings(), setting.name)
            assert default == getattr(SchedulerConfig(), setting.name), setting.name


def test_the_settings_map_onto_the_scheduler_config_by_name() -> None:
    settings = EkbatanSettings(
        jobs={"claim-ahead": "PT0.5S", "web-read-pool-size": 3, "app-version": "v9"}
    )
    config = settings.jobs.config
    assert config.claim_ahead == timedelta(milliseconds=500)
    assert config.web_read_pool_size == 3 and config.app_version == "v9"


@pytest.mark.parametrize("name", sorted(DURATION_BOUNDS))
def test_the_builder_and_the_settings_apply_the_same_bounds(name: str) -> None:
    """One rule per setting: a duration beyond its bound is refused by the settings and by the
    builder with the same words (before, the builder took any positive duration up to 100
    years for most of them)."""
    high = DURATION_BOUNDS[name][1]
    beyond = high + timedelta(seconds=1)
    with pytest.raises(ConfigurationError) as from_settings:
        EkbatanSettings(jobs={name: beyond})
    with pytest.raises(ConfigurationError) as from_builder:
        build(**{name: beyond})
    said = re.search(
        r"is longer than the longest allowed, \S+ \(allowed: [^)]*\)", str(from_settings.value)
    )
    assert said is not None
    assert said.group(0) in str(from_builder.value)
    assert str(from_builder.value).startswith(f"{name}: ")


def test_the_builder_sets_any_setting_by_name_and_refuses_a_misspelt_one() -> None:
    registry = (
        job_registry()
        .connection_provider(UNREACHABLE)
        .customize_scheduler(lambda b: b.history_retention(timedelta(days=3)).batch_size(9))
        .build()
    )
    assert registry.config.history_retention == timedelta(days=3)
    assert registry.scheduler.batch_size == 9
    with pytest.raises(ConfigurationError, match="did you mean polling_interval"):
        build(poling_interval=timedelta(seconds=1))
    with pytest.raises(AttributeError, match="did you mean claim_ahead"):
        job_registry().customize_scheduler(lambda b: b.claim_ahaed(timedelta(0))).build()
    with pytest.raises(AttributeError, match=r"modules is read by the FastAPI integration"):
        job_registry().customize_scheduler(lambda b: b.modules(["x"])).build()


def test_the_reference_lists_every_setting_with_its_variable_default_and_type() -> None:
    rows = {row.key: row for row in settings_reference() if row.key is not None}
    assert rows["polling-interval"].environment == "EKBATAN_JOBS__POLLING_INTERVAL"
    assert rows["polling-interval"].default == "PT10S"
    assert rows["polling-interval"].type == "duration (ISO-8601)"
    assert (rows["claim-ahead"].shortest, rows["claim-ahead"].longest) == ("PT0S", "PT10S")
    assert rows["missed-heartbeats-limit"].shortest == "4"
    assert rows["overrides.<job>.timeout"].longest == "P30D"
    assert all(row.description for row in settings_reference())
    keys = {setting.key for setting in settings_of() if setting.in_file}
    assert keys <= set(rows)
