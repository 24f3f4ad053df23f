"""Settings for the FastAPI integration: environment, an optional YAML file, and defaults.

Sources, strongest first: constructor arguments, environment variables (``EKBATAN_`` prefix,
``__`` between levels, list items by index: ``EKBATAN_SHARDING__GROUPS__0__...``), then
``EKBATAN_DATABASE_URL`` (the jobs database's URL by its short name), the YAML
file named by ``EKBATAN_CONFIG_FILE`` (``ekbatan:`` root, ``${VAR}`` interpolation), defaults.
Keys may be written in snake_case, kebab-case or camelCase. Durations are ISO-8601 only, so a
shorthand such as ``10s`` stops startup with a message naming the key and the ISO form.

This module does not import FastAPI: the settings are usable from any process.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ..domain.durations import parse_iso_duration
from ..domain.errors import ConfigurationError
from ..engine.config import DEFAULT_RESULTS_WAIT, MAX_CLAIM_AHEAD, MIN_MISSED_HEARTBEATS
from ..engine.logs import LOG_HANDLER_MODES
from ..store.options import DEFAULT_IDLE_TRANSACTION_TIMEOUT, validate_pooler
from .datasource import DataSourceConfig
from .keys import SettingsSection, canonical_key, canonical_mapping, display_key
from .sources import (
    CONFIG_FILE,
    CONFIG_FILE_ENV,
    DATABASE_URL_ENV,
    JOBS_SLOT_ENV,
    DatabaseUrlAlias,
    YamlFileSource,
)

__all__ = [
    "EkbatanSettings",
    "JobOverrideSettings",
    "JobsSettings",
    "ShardGroup",
    "ShardMember",
    "ShardingSettings",
]

JOBS_SLOT = "jobs_config"
_ENV_PREFIX = "EKBATAN_"


def _canonical_tree(value: Any) -> Any:
    """``canonical_mapping`` applied at every level (constructor arguments), so that they
    merge key by key with the environment's snake_case keys."""
    if isinstance(value, dict):
        return {k: _canonical_tree(v) for k, v in canonical_mapping(value, "").items()}
    if isinstance(value, list):
        return [_canonical_tree(item) for item in value]
    return value


def _indexed_list(value: Any) -> Any:
    """Lists arrive from the environment as ``{"0": ..., "1": ...}``; turn them back."""
    if isinstance(value, dict) and all(isinstance(k, str) and k.isdigit() for k in value):
        items = {int(k): v for k, v in value.items()}
        if len(items) != len(value) or sorted(items) != list(range(len(items))):
            raise ValueError(
                f"list indices must run 0, 1, 2, ... without gaps, got {', '.join(value)}"
            )
        return [items[i] for i in range(len(items))]
    return value


def _module_list(value: Any) -> Any:
    """``modules`` also accepts a comma-separated string (handy in environment variables)."""
    value = _indexed_list(value)
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a JSON list of module names") from None
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _iso_duration(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected an ISO-8601 duration such as PT10S, got {value!r}")
    return parse_iso_duration(str(value))


IsoDuration = Annotated[timedelta, BeforeValidator(_iso_duration)]


class JobOverrideSettings(SettingsSection):
    """``ekbatan.jobs.overrides.<job name>``: a timeout or concurrency limit that wins over the
    job class's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: IsoDuration | None = None
    max_concurrency: int | None = Field(default=None, ge=1)

    @field_validator("timeout")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be longer than zero, e.g. PT10M")
        return value


class JobsSettings(SettingsSection):
    """``ekbatan.jobs``: the scheduler's knobs (their defaults: docs/fastapi.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    polling_interval: IsoDuration = timedelta(seconds=10)
    heartbeat_interval: IsoDuration = timedelta(seconds=10)
    shutdown_max_wait: IsoDuration = timedelta(minutes=30)
    """Applied twice at shutdown: wait, cancel, wait again."""
    missed_heartbeats_limit: int = 6
    delete_unresolved_after: IsoDuration = timedelta(days=14)
    modules: Annotated[list[str], NoDecode, BeforeValidator(_module_list)] = Field(
        default_factory=list
    )
    """Modules imported at startup so that their ``@distributed_job`` classes are found."""
    metrics: bool = False
    """Collect Prometheus metrics (the ``[metrics]`` extra); ``metrics_router`` serves them."""
    opentelemetry: bool = False
    """Trace every execution with OpenTelemetry (the ``[otel]`` extra, docs/opentelemetry.md);
    off: opentelemetry is never imported by Ekbatan."""
    opentelemetry_statements: bool = False
    """Also a span per poll and completion statement (needs ``opentelemetry: true``)."""
    app_version: str | None = None
    """The application's version, written with the job definitions: during a rolling deploy
    an older version never changes what a newer one wrote."""
    timeout_grace: IsoDuration | None = None
    """How long a timed-out async execution may clean up (default: one heartbeat interval)."""
    claim_ahead: IsoDuration = timedelta(0)
    """Claim rows due within this lead and start each at its time (``PT0.2S``; PostgreSQL;
    ``PT0S``: only due rows, as db-scheduler)."""
    overrides: dict[str, JobOverrideSettings] = Field(default_factory=dict)
    """Per job (by name, spelled like any key: ``nightly-export`` = ``NIGHTLY_EXPORT``):
    ``timeout`` and ``max-concurrency`` that win over the job class's."""

    def override_for(self, job_name: str) -> JobOverrideSettings | None:
        """The override of ``job_name`` (keys compare as settings keys do)."""
        return self.overrides.get(canonical_key(job_name))

    pooler: str = "none"
    """``none``, ``pgbouncer-session`` or ``pgbouncer-transaction`` (docs/deployment.md)."""
    idle_transaction_timeout: IsoDuration = timedelta(seconds=DEFAULT_IDLE_TRANSACTION_TIMEOUT)
    """MySQL/MariaDB session bounds of the jobs pool (``PT0S``: leave the server's settings)."""
    shutdown_results_wait: IsoDuration = timedelta(seconds=DEFAULT_RESULTS_WAIT)
    """At shutdown, how long the database may take to record the last results."""

    log_handler: str = "auto"
    """``auto``: when nothing receives the library's log records (no root handler, none on
    ``ekbatan_fastapi``), hand them to uvicorn's or gunicorn's handlers, or stderr;
    ``none``: leave logging alone (docs/logging.md)."""

    @field_validator("log_handler", mode="before")
    @classmethod
    def _known_log_handler(cls, value: Any) -> str:
        if value not in LOG_HANDLER_MODES:
            raise ValueError(
                f"is {value!r}; use auto (the server's log handlers when nothing else receives "
                "the library's records) or none (leave logging alone)"
            )
        return str(value)

    @field_validator("pooler", mode="before")
    @classmethod
    def _known_pooler(cls, value: Any) -> str:
        try:
            return validate_pooler(value)
        except ConfigurationError as error:
            raise ValueError(str(error)) from None

    @field_validator("idle_transaction_timeout")
    @classmethod
    def _not_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative, e.g. PT10S (PT0S: leave the server's settings)")
        return value

    @field_validator("claim_ahead")
    @classmethod
    def _short_lead(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= MAX_CLAIM_AHEAD:
            raise ValueError(
                f"must be from PT0S to PT{MAX_CLAIM_AHEAD.total_seconds():g}S, e.g. PT0.2S "
                "(PT0S claims only due rows)"
            )
        return value

    @field_validator(
        "polling_interval", "heartbeat_interval", "shutdown_max_wait", "shutdown_results_wait"
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero, e.g. PT10S")
        return value

    @field_validator("delete_unresolved_after")
    @classmethod
    def _positive_days(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero, e.g. P14D")
        return value

    @field_validator("missed_heartbeats_limit")
    @classmethod
    def _enough_misses(cls, value: int) -> int:
        if value < MIN_MISSED_HEARTBEATS:
            raise ValueError(
                f"must be at least {MIN_MISSED_HEARTBEATS}, got {value}; fewer would declare "
                "executions dead after one slow heartbeat"
            )
        return value


class ShardMember(SettingsSection):
    """A member of a shard group; its ``configs`` slots name pools (``jobs-config``, ...)."""

    configs: dict[str, DataSourceConfig] = Field(default_factory=dict)

    @field_validator("configs", mode="before")
    @classmethod
    def _canonical_slots(cls, value: Any) -> Any:
        return canonical_mapping(value, " in configs")

    def config_for(self, slot: str) -> DataSourceConfig | None:
        """The slot's config; ``jobs_config``, ``jobs-config`` and ``jobsConfig`` are one slot."""
        return self.configs.get(canonical_key(slot))


class ShardGroup(SettingsSection):
    members: Annotated[list[ShardMember], BeforeValidator(_indexed_list)] = Field(
        default_factory=list
    )


class ShardingSettings(SettingsSection):
    """``ekbatan.sharding``: the default shard is ``groups[0]``."""

    groups: Annotated[list[ShardGroup], BeforeValidator(_indexed_list)] = Field(
        default_factory=list
    )


_JOBS_SLOT_PATH = "ekbatan.sharding.groups[0].members[0].configs.jobs-config"
_JOBS_SLOT_ENV = JOBS_SLOT_ENV


class EkbatanSettings(BaseSettings):
    """Everything the FastAPI integration reads from configuration.

    ``EkbatanSettings()`` reads the sources; ``EkbatanSettings(jobs={...}, _config_file=path)``
    overrides them. Invalid values raise ConfigurationError naming the key, its environment
    variable and the fix.
    """

    model_config = SettingsConfigDict(
        env_prefix=_ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="ignore",
        frozen=True,
    )

    jobs: JobsSettings = Field(default_factory=JobsSettings)
    sharding: ShardingSettings = Field(default_factory=ShardingSettings)

    config_file_env: ClassVar[str] = CONFIG_FILE_ENV

    def __init__(self, _config_file: str | Path | None = None, **values: Any) -> None:
        try:
            values = _canonical_tree(values)
        except ValueError as error:
            raise ConfigurationError(f"invalid ekbatan settings: {error}") from None
        token = CONFIG_FILE.set(_config_file)
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigurationError(_describe(error)) from None
        except SettingsError as error:
            # e.g. EKBATAN_JOBS__OVERRIDES='not json': pydantic-settings names only the field.
            raise ConfigurationError(_describe_environment(error)) from None
        finally:
            CONFIG_FILE.reset(token)

    @model_validator(mode="before")
    @classmethod
    def _canonical_keys(cls, data: Any) -> Any:
        return canonical_mapping(data, "")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            DatabaseUrlAlias(settings_cls, env_settings),
            dotenv_settings,
            YamlFileSource(settings_cls),
            file_secret_settings,
        )

    def find_jobs_datasource(self) -> DataSourceConfig | None:
        """The ``jobs-config`` slot of the default shard's first member, if configured."""
        if not self.sharding.groups or not self.sharding.groups[0].members:
            return None
        return self.sharding.groups[0].members[0].config_for(JOBS_SLOT)

    def jobs_datasource(self) -> DataSourceConfig:
        """Like ``find_jobs_datasource`` but a missing or empty slot is a ConfigurationError."""
        config = self.find_jobs_datasource()
        if config is None:
            found = ""
            if self.sharding.groups and self.sharding.groups[0].members:
                slots = self.sharding.groups[0].members[0].configs
                found = f" (that member has {', '.join(map(display_key, slots)) or 'no'} slots)"
            raise ConfigurationError(
                f"no database is configured for the jobs{found}: set {_JOBS_SLOT_PATH}.url "
                f"(environment: {DATABASE_URL_ENV}, or {_JOBS_SLOT_ENV}__URL), e.g. "
                "postgresql+asyncpg://app@db:5432/app, or jdbc-url"
            )
        if config.url is None and config.jdbc_url is None:
            raise ConfigurationError(
                f"{_JOBS_SLOT_PATH} has neither url nor jdbc-url: set {_JOBS_SLOT_PATH}.url "
                f"(environment: {DATABASE_URL_ENV}, or {_JOBS_SLOT_ENV}__URL)"
            )
        return config


def _location(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """The key path as written in YAML and as an environment variable."""
    path, env = "ekbatan", _ENV_PREFIX.rstrip("_")
    for part in loc:
        if isinstance(part, int) or part.isdigit():
            path += f"[{part}]"
        elif "[" in part or "(" in part:
            continue  # pydantic's validator/type markers, not keys
        else:
            path += f".{display_key(part)}"
        env += f"__{str(part).upper()}" if env != "EKBATAN" else f"_{str(part).upper()}"
    return path, env


def _describe(error: ValidationError) -> str:
    """One line per problem, never echoing the input (it may hold a password)."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        path, env = _location(tuple(item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            section = JobOverrideSettings if "overrides" in item["loc"] else JobsSettings
            where = (
                "ekbatan.jobs.overrides.<job>" if section is JobOverrideSettings else "ekbatan.jobs"
            )
            known = ", ".join(display_key(name) for name in section.model_fields)
            message = f"unknown key; the keys of {where} are {known}"
        lines.append(f"  - {path} (environment: {env}): {message}")
    return "invalid ekbatan settings:\n" + "\n".join(lines)


def _structured_field(path: list[str]) -> bool:
    """Whether ``EKBATAN_<path>`` names a mapping, list or section, which the environment
    must spell as JSON (or one variable per leaf)."""
    annotation: Any = EkbatanSettings
    for part in path:
        while get_origin(annotation) in (dict, list):
            annotation = get_args(annotation)[-1]
            part = ""
        if not part:
            continue
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return False
        fields = {canonical_key(name): field for name, field in annotation.model_fields.items()}
        field = fields.get(canonical_key(part))
        if field is None:
            return False
        annotation = field.annotation
    return get_origin(annotation) in (dict, list) or (
        isinstance(annotation, type) and issubclass(annotation, BaseModel)
    )


def _describe_environment(error: SettingsError) -> str:
    """Name each ``EKBATAN_`` variable that holds a section but is not JSON, and the fix."""
    named = []
    for variable, value in os.environ.items():
        if not variable.upper().startswith(_ENV_PREFIX) or variable.upper() == CONFIG_FILE_ENV:
            continue
        path = variable[len(_ENV_PREFIX) :].lower().split("__")
        if not _structured_field(path):
            continue
        try:
            json.loads(value)
        except ValueError:
            dotted = "ekbatan." + ".".join(display_key(part) for part in path)
            named.append(
                f"  {variable}={value[:40]!r}: {dotted} is a section, so the variable must "
                f"hold JSON (e.g. {variable}='{{...}}'), or set one value per variable "
                f"({variable}__<key>=...)"
            )
    if not named:
        return f"invalid ekbatan settings: {error}"
    return "invalid ekbatan settings:\n" + "\n".join(named)
