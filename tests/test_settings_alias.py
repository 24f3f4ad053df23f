"""``EKBATAN_DATABASE_URL``: the short name of the jobs database's URL, and its precedence
(constructor > the slot's own variable > the alias > the YAML file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.settings import EkbatanSettings

ALIAS = "EKBATAN_DATABASE_URL"
SLOT_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG"
URL = "postgresql+asyncpg://app@db:5432/app"
YAML = """
ekbatan:
  sharding:
    groups:
      - members:
          - configs:
              jobs-config:
                url: postgresql+asyncpg://app@yaml-host:5432/app
                maximum-pool-size: 3
"""


def url_of(settings: EkbatanSettings) -> str:
    return settings.jobs_datasource().sqlalchemy_url().render_as_string(hide_password=False)


def test_the_alias_sets_the_jobs_slots_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS, URL)
    assert url_of(EkbatanSettings()) == URL
    # the slot's other keys still come from their own variables
    monkeypatch.setenv(f"{SLOT_ENV}__PASSWORD", "s3cret")
    monkeypatch.setenv(f"{SLOT_ENV}__MAXIMUM_POOL_SIZE", "2")
    settings = EkbatanSettings()
    assert url_of(settings) == "postgresql+asyncpg://app:s3cret@db:5432/app"
    assert settings.jobs_datasource().maximum_pool_size == 2


def test_the_alias_and_the_slots_variable_may_agree_but_not_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ALIAS, "postgresql+asyncpg://app:pw1@db:5432/app")
    monkeypatch.setenv(f"{SLOT_ENV}__URL", "postgresql+asyncpg://app:pw1@db:5432/app")
    assert url_of(EkbatanSettings()).endswith("@db:5432/app")
    monkeypatch.setenv(f"{SLOT_ENV}__URL", "postgresql+asyncpg://app:pw2@other:5432/app")
    with pytest.raises(ConfigurationError) as caught:
        EkbatanSettings()
    message = str(caught.value)
    assert f"{ALIAS} and {SLOT_ENV}__URL are both set, to different URLs; keep one" in message
    assert "pw1" not in message and "pw2" not in message


def test_the_alias_beside_the_slots_jdbc_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS, URL)
    monkeypatch.setenv(f"{SLOT_ENV}__JDBC_URL", "jdbc:postgresql://db:5432/app")
    with pytest.raises(ConfigurationError, match=f"{ALIAS} sets the jobs database's url and "):
        EkbatanSettings()


def test_the_alias_agrees_with_a_json_sharding_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS, URL)
    monkeypatch.setenv(
        "EKBATAN_SHARDING",
        json.dumps({"groups": [{"members": [{"configs": {"jobsConfig": {"url": URL}}}]}]}),
    )
    assert url_of(EkbatanSettings()) == URL
    monkeypatch.setenv(
        "EKBATAN_SHARDING",
        '{"groups": [{"members": [{"configs": {"jobs-config": {"url": "x"}}}]}]}',
    )
    with pytest.raises(ConfigurationError, match="both set, to different URLs"):
        EkbatanSettings()


def test_the_alias_wins_over_the_yaml_file_and_loses_to_the_constructor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "application.yml"
    config.write_text(YAML, encoding="utf-8")
    monkeypatch.setenv("EKBATAN_CONFIG_FILE", str(config))
    assert url_of(EkbatanSettings()) == "postgresql+asyncpg://app@yaml-host:5432/app"
    monkeypatch.setenv(ALIAS, URL)
    settings = EkbatanSettings()
    assert url_of(settings) == URL
    assert settings.jobs_datasource().maximum_pool_size == 3  # the file's other keys stay
    given = "postgresql+asyncpg://app@given:5432/app"
    slot = {"configs": {"jobs_config": {"url": given}}}
    assert url_of(EkbatanSettings(sharding={"groups": [{"members": [slot]}]})) == given


def test_a_lower_case_alias_counts_as_the_other_variables_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ALIAS.lower(), URL)
    assert url_of(EkbatanSettings()) == URL


def test_without_a_database_the_error_names_the_alias_first() -> None:
    with pytest.raises(ConfigurationError) as caught:
        EkbatanSettings().jobs_datasource()
    assert f"(environment: {ALIAS}, or {SLOT_ENV}__URL)" in str(caught.value)
