"""EkbatanSettings: defaults, key spellings, ISO durations, YAML + environment, secrets."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.settings import DataSourceConfig, EkbatanSettings
from ekbatan_fastapi.web import build_registry

SLOT_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG"


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "application.yml"
    path.write_text(text, encoding="utf-8")
    return path


def with_jobs_slot(slot: dict[str, object], slot_name: str = "jobs-config") -> EkbatanSettings:
    return EkbatanSettings(sharding={"groups": [{"members": [{"configs": {slot_name: slot}}]}]})


def test_defaults_are_ekbatans() -> None:
    jobs = EkbatanSettings().jobs
    assert jobs.polling_interval == timedelta(seconds=10)
    assert jobs.heartbeat_interval == timedelta(seconds=10)
    assert jobs.shutdown_max_wait == timedelta(minutes=30)
    assert jobs.missed_heartbeats_limit == 6
    assert jobs.delete_unresolved_after == timedelta(days=14)
    assert jobs.modules == []


@pytest.mark.parametrize("key", ["polling_interval", "polling-interval", "pollingInterval"])
def test_keys_accept_snake_kebab_and_camel_case(key: str) -> None:
    settings = EkbatanSettings(jobs={key: "PT0.2S", "shutdownMaxWait": "PT5S"})
    assert settings.jobs.polling_interval == timedelta(milliseconds=200)
    assert settings.jobs.shutdown_max_wait == timedelta(seconds=5)


def test_environment_uses_prefix_and_double_underscore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__POLLING_INTERVAL", "PT2S")
    monkeypatch.setenv("EKBATAN_JOBS__HEARTBEAT_INTERVAL", "PT30S")
    monkeypatch.setenv("EKBATAN_JOBS__MISSED_HEARTBEATS_LIMIT", "8")
    monkeypatch.setenv("EKBATAN_JOBS__MODULES", "app.jobs, app.more_jobs")
    jobs = EkbatanSettings().jobs
    assert jobs.polling_interval == timedelta(seconds=2)
    assert jobs.heartbeat_interval == timedelta(seconds=30)
    assert jobs.missed_heartbeats_limit == 8
    assert jobs.modules == ["app.jobs", "app.more_jobs"]


def test_modules_from_the_environment_may_be_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__MODULES", '["a.jobs", "b.jobs"]')
    assert EkbatanSettings().jobs.modules == ["a.jobs", "b.jobs"]


def test_a_section_variable_that_is_not_json_names_the_variable_and_both_fixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__OVERRIDES", "timeout=PT5M")
    with pytest.raises(ConfigurationError) as caught:
        EkbatanSettings()
    message = str(caught.value)
    assert "EKBATAN_JOBS__OVERRIDES='timeout=PT5M'" in message
    assert "ekbatan.jobs.overrides is a section" in message and "JSON" in message
    assert "EKBATAN_JOBS__OVERRIDES__<key>" in message


def test_one_override_per_variable_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__OVERRIDES__SEND_REPORT__TIMEOUT", "PT5M")
    monkeypatch.setenv("EKBATAN_JOBS__OVERRIDES__SEND_REPORT__MAX_CONCURRENCY", "2")
    override = EkbatanSettings().jobs.override_for("send-report")
    assert override is not None
    assert override.timeout == timedelta(minutes=5) and override.max_concurrency == 2


def test_shorthand_duration_in_environment_names_the_key_and_the_iso_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__POLLING_INTERVAL", "10s")
    with pytest.raises(ConfigurationError) as caught:
        EkbatanSettings()
    message = str(caught.value)
    assert "ekbatan.jobs.polling-interval" in message
    assert "EKBATAN_JOBS__POLLING_INTERVAL" in message
    assert "'10s'" in message and "PT10S" in message


@pytest.mark.parametrize(
    ("value", "hint"), [("200ms", "PT0.2S"), ("5m", "PT5M"), (10, "PT10S"), ("P1M", "days")]
)
def test_non_iso_durations_are_rejected_with_a_hint(value: object, hint: str) -> None:
    with pytest.raises(ConfigurationError, match=hint) as caught:
        EkbatanSettings(jobs={"heartbeat-interval": value})
    assert "ekbatan.jobs.heartbeat-interval" in str(caught.value)


def test_zero_interval_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"polling-interval.*longer than zero"):
        EkbatanSettings(jobs={"polling-interval": "PT0S"})


def test_missed_heartbeats_limit_below_four_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"missed-heartbeats-limit.*at least 4"):
        EkbatanSettings(jobs={"missedHeartbeatsLimit": 3})


def test_unknown_jobs_key_is_rejected_with_the_known_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__POLL_INTERVAL", "PT1S")
    with pytest.raises(ConfigurationError, match=r"poll-interval.*unknown key.*polling-interval"):
        EkbatanSettings()


def test_one_key_in_two_spellings_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="'polling-interval' and 'pollingInterval'"):
        EkbatanSettings(jobs={"polling-interval": "PT1S", "pollingInterval": "PT2S"})


def test_invalid_json_in_environment_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EKBATAN_JOBS", "{not json")
    with pytest.raises(ConfigurationError, match="jobs"):
        EkbatanSettings()


YAML = """
ekbatan:
  jobs:
    polling-interval: PT5S
    heartbeatInterval: PT30S
    shutdown_max_wait: ${SHUTDOWN_WAIT:PT1M}
    modules: [app.jobs]
  sharding:
    groups:
      - members:
          - configs:
              primary-config:
                jdbc-url: jdbc:postgresql://primary:5432/app
              jobs-config:
                jdbc-url: jdbc:postgresql://primary:5432/app
                username: app
                password: ${APP_PASSWORD}
                maximum-pool-size: 3
  events: {ignored: true}
other-library: {also: ignored}
"""


def test_yaml_file_with_ekbatan_root_and_interpolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EKBATAN_CONFIG_FILE", str(write_yaml(tmp_path, YAML)))
    monkeypatch.setenv("APP_PASSWORD", "s3cret-from-env")
    settings = EkbatanSettings()
    assert settings.jobs.polling_interval == timedelta(seconds=5)
    assert settings.jobs.heartbeat_interval == timedelta(seconds=30)
    assert settings.jobs.shutdown_max_wait == timedelta(minutes=1)  # the ${VAR:default}
    assert settings.jobs.modules == ["app.jobs"]
    slot = settings.jobs_datasource()
    assert slot.maximum_pool_size == 3
    url = slot.sqlalchemy_url()
    assert url.drivername == "postgresql+asyncpg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "app",
        "s3cret-from-env",
        "primary",
        5432,
        "app",
    )


def test_environment_wins_over_the_file_key_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_PASSWORD", "from-file")
    monkeypatch.setenv("EKBATAN_JOBS__POLLING_INTERVAL", "PT1S")
    monkeypatch.setenv(f"{SLOT_ENV}__PASSWORD", "from-env")
    path = write_yaml(tmp_path, YAML)
    settings = EkbatanSettings(_config_file=path)
    assert settings.jobs.polling_interval == timedelta(seconds=1)
    assert settings.jobs.heartbeat_interval == timedelta(seconds=30)  # still the file's
    slot = settings.jobs_datasource()
    assert slot.jdbc_url == "jdbc:postgresql://primary:5432/app"  # the list item was merged
    assert slot.sqlalchemy_url().password == "from-env"


def test_constructor_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_JOBS__POLLING_INTERVAL", "PT1S")
    settings = EkbatanSettings(jobs={"polling-interval": "PT3S"})
    assert settings.jobs.polling_interval == timedelta(seconds=3)


def test_yaml_variable_without_value_or_default_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("APP_PASSWORD", raising=False)
    with pytest.raises(ConfigurationError, match=r"configs\.jobs-config\.password.*APP_PASSWORD"):
        EkbatanSettings(_config_file=write_yaml(tmp_path, YAML))


def test_yaml_without_ekbatan_root_is_rejected(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "jobs:\n  polling-interval: PT1S\n")
    with pytest.raises(ConfigurationError, match="no 'ekbatan:' mapping"):
        EkbatanSettings(_config_file=path)


def test_missing_yaml_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EKBATAN_CONFIG_FILE", str(tmp_path / "nope.yml"))
    with pytest.raises(ConfigurationError, match=r"nope\.yml \(EKBATAN_CONFIG_FILE\)"):
        EkbatanSettings()


def test_yaml_shorthand_duration_names_the_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "ekbatan:\n  jobs:\n    shutdown-max-wait: 30s\n")
    with pytest.raises(ConfigurationError, match=r"shutdown-max-wait.*write PT30S"):
        EkbatanSettings(_config_file=path)


@pytest.mark.parametrize("slot_name", ["jobs-config", "jobsConfig", "jobs_config"])
def test_jobs_slot_spellings(slot_name: str) -> None:
    settings = with_jobs_slot({"url": "postgresql+asyncpg://db/app"}, slot_name)
    member = settings.sharding.groups[0].members[0]
    assert member.config_for("jobs_config") is member.config_for("jobsConfig") is not None
    assert settings.jobs_datasource().sqlalchemy_url().host == "db"


def test_jobs_slot_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{SLOT_ENV}__URL", "postgresql+asyncpg://app@db:5433/app")
    monkeypatch.setenv(f"{SLOT_ENV}__MAXIMUM_POOL_SIZE", "2")
    slot = EkbatanSettings().jobs_datasource()
    assert slot.maximum_pool_size == 2
    assert slot.sqlalchemy_url().port == 5433


def test_no_database_says_which_key_to_set() -> None:
    with pytest.raises(ConfigurationError) as caught:
        EkbatanSettings().jobs_datasource()
    message = str(caught.value)
    assert "ekbatan.sharding.groups[0].members[0].configs.jobs-config.url" in message
    assert f"{SLOT_ENV}__URL" in message


def test_member_without_jobs_slot_lists_its_slots() -> None:
    settings = with_jobs_slot({"url": "postgresql+asyncpg://db/app"}, "primary-config")
    with pytest.raises(ConfigurationError, match="primary-config"):
        settings.jobs_datasource()


@pytest.mark.parametrize(
    ("jdbc", "expected"),
    [
        ("jdbc:postgresql://h:5432/app", "postgresql+asyncpg://h:5432/app"),
        ("jdbc:postgresql://h/app?user=u&password=p", "postgresql+asyncpg://u:p@h/app"),
        ("jdbc:postgresql://h/app?sslmode=require", "postgresql+asyncpg://h/app?ssl=require"),
        ("jdbc:mysql://h:3306/app", "mysql+asyncmy://h:3306/app"),
        ("jdbc:mariadb://h/app", "mariadb+asyncmy://h/app"),
    ],
)
def test_jdbc_urls_are_translated(jdbc: str, expected: str) -> None:
    url = DataSourceConfig(jdbc_url=jdbc).sqlalchemy_url()
    assert url.render_as_string(hide_password=False) == expected


@pytest.mark.parametrize(
    ("jdbc", "message"),
    [
        ("jdbc:postgresql://h/app?currentSchema=x", "currentSchema"),
        ("jdbc:postgresql://h1,h2/app", "several hosts"),
        ("jdbc:oracle:thin:@h:1521/x", "not a jdbc:postgresql"),
    ],
)
def test_untranslatable_jdbc_urls_are_explained(jdbc: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DataSourceConfig(jdbc_url=jdbc).sqlalchemy_url()


def test_url_and_jdbc_url_together_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="either url or jdbc-url"):
        with_jobs_slot({"url": "postgresql+asyncpg://h/a", "jdbc-url": "jdbc:postgresql://h/a"})


def test_password_never_appears_in_repr_or_errors() -> None:
    secret = "hunter2-very-secret"
    settings = with_jobs_slot(
        {"url": f"postgresql+asyncpg://app:{secret}@db/app", "password": secret}
    )
    assert secret not in repr(settings)
    assert secret not in str(settings)
    provider = settings.jobs_datasource().connection_provider()
    assert secret not in repr(provider)
    with pytest.raises(ConfigurationError) as caught:
        with_jobs_slot({"url": "postgresql+asyncpg://db/app", "password": {"nested": secret}})
    assert secret not in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        DataSourceConfig(jdbc_url=f"jdbc:postgresql://h/app?password={secret}&x=1").sqlalchemy_url()
    assert secret not in str(caught.value)


async def test_build_registry_applies_the_settings() -> None:
    settings = with_jobs_slot({"url": "postgresql+asyncpg://db/app", "maximumPoolSize": 2})
    settings = EkbatanSettings(
        jobs={
            "polling-interval": "PT0.5S",
            "heartbeat-interval": "PT2S",
            "shutdown-max-wait": "PT3S",
            "missed-heartbeats-limit": 5,
            "delete-unresolved-after": "P2D",
        },
        sharding=settings.sharding,
    )
    registry = build_registry(settings, [])
    try:
        config = registry.config
        assert config.polling_interval == timedelta(milliseconds=500)
        assert config.heartbeat_interval == timedelta(seconds=2)
        assert config.shutdown_max_wait == timedelta(seconds=3)
        assert config.missed_heartbeats_limit == 5
        assert config.delete_unresolved_after == timedelta(days=2)
        assert registry.engine.pool.size() == 2  # type: ignore[attr-defined]
    finally:
        await registry.connection.dispose()
