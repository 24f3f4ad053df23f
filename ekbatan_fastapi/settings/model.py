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
from collections.abc import Callable
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
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
from ..domain.text import is_secret_name, mask_url
from ..engine.config import SchedulerConfig, Setting, closest, settings_of
from .datasource import DataSourceConfig
from .environment import KnownVariables
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


def _text_list(value: Any, what: str) -> Any:
    """A list that also comes as a comma-separated string (handy in environment variables)."""
    value = _indexed_list(value)
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a JSON list of {what}") from None
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _text_list_of(what: str) -> Callable[[Any], Any]:
    """``_text_list`` for a list of ``what`` (in its error)."""

    def parse(value: Any) -> Any:
        return _text_list(value, what)

    return parse


def _iso_duration(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected an ISO-8601 duration such as PT10S, got {value!r}")
    return parse_iso_duration(str(value))


IsoDuration = Annotated[timedelta, BeforeValidator(_iso_duration)]

DURATION_BOUNDS: dict[str, tuple[timedelta, timedelta, str]] = {
    setting.name: (setting.shortest, setting.longest, setting.example or "")
    for setting in settings_of()
    if setting.in_file and setting.kind == "duration"
}
"""Each duration setting of ``ekbatan.jobs``: (shortest, longest, an example), from its
declaration in ``SchedulerConfig``. A value outside stops startup with an error naming the
key, the value and the bound (docs/fastapi.md)."""
OVERRIDE_TIMEOUT = Setting(
    "timeout",
    "The job's timeout, winning over its class's timeout() (docs/execution-control.md).",
    "duration",
    None,
    optional=True,
    shortest=timedelta(milliseconds=1),
    longest=timedelta(days=30),
    example="PT10M",
)
"""``ekbatan.jobs.overrides.<job>.timeout``, checked as the settings of ``SchedulerConfig``."""


class JobOverrideSettings(SettingsSection):
    """``ekbatan.jobs.overrides.<job name>``: a timeout or concurrency limit that wins over the
    job class's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: IsoDuration | None = None
    """The job's timeout, winning over its class's ``timeout()`` (docs/execution-control.md)."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """At most this many executions of the job at once, cluster-wide, winning over its
    class's ``max_concurrency()``."""

    @field_validator("timeout")
    @classmethod
    def _bounded(cls, value: timedelta | None) -> timedelta | None:
        checked: timedelta | None = OVERRIDE_TIMEOUT.checked(value)
        return checked


def _annotation(setting: Setting) -> Any:
    """The type pydantic reads a setting's value as (from the environment, YAML, ...)."""
    annotation: Any = {
        "duration": IsoDuration,
        "integer": int,
        "boolean": bool,
        "text": str,
        "texts": Annotated[
            list[str],
            NoDecode,
            BeforeValidator(_text_list_of(setting.item)),
        ],
    }[setting.kind]
    return annotation | None if setting.optional else annotation


def _field(setting: Setting) -> tuple[Any, Any]:
    default = setting.default
    if isinstance(default, list):
        return _annotation(setting), Field(default_factory=list, description=setting.description)
    return _annotation(setting), Field(default=default, description=setting.description)


_FILE_SETTINGS = {setting.name: setting for setting in settings_of() if setting.in_file}

if TYPE_CHECKING:
    _JobsFields = SettingsSection
else:
    _JobsFields = create_model(
        "_JobsFields",
        __base__=SettingsSection,
        **{name: _field(setting) for name, setting in _FILE_SETTINGS.items()},
    )


class JobsSettings(_JobsFields):
    """``ekbatan.jobs``: a field per ``SchedulerConfig`` setting of the settings file, by the
    same name (generated: a new setting needs no edit here), and ``overrides``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    overrides: dict[str, JobOverrideSettings] = Field(default_factory=dict)
    """Per job (by name, spelled like any key: ``nightly-export`` = ``NIGHTLY_EXPORT``):
    ``timeout`` and ``max-concurrency`` that win over the job class's."""

    def override_for(self, job_name: str) -> JobOverrideSettings | None:
        """The override of ``job_name`` (keys compare as settings keys do)."""
        return self.overrides.get(canonical_key(job_name))

    @field_validator(*_FILE_SETTINGS)
    @classmethod
    def _by_its_rule(cls, value: Any, info: ValidationInfo) -> Any:
        """The setting's rule, as ``SchedulerConfig.validate`` applies it (one rule each)."""
        return _FILE_SETTINGS[info.field_name or ""].checked(value)

    @cached_property
    def config(self) -> SchedulerConfig:
        """These settings, typed, as a ``SchedulerConfig`` (the builder's own settings at their
        defaults): what the package reads them from. Not to be changed."""
        return SchedulerConfig(**self.values())

    def values(self) -> dict[str, Any]:
        """Every setting of the file by its ``SchedulerConfig`` name (``overrides`` aside)."""
        return {name: getattr(self, name) for name in _FILE_SETTINGS}


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
        known = list(type(self).model_fields)
        for key in values:
            if not key.startswith("_") and key not in known:
                problem = _unknown_key(key, "ekbatan", known)
                raise ConfigurationError(
                    f"invalid ekbatan settings: EkbatanSettings({key}=...): {problem}"
                )
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
            KnownVariables(settings_cls, [env_settings, dotenv_settings]),
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
            message = _unknown_key(str(item["loc"][-1]), where, list(section.model_fields))
        lines.append(f"  - {path} (environment: {env}): {mask_url(message)}")
    return "invalid ekbatan settings:\n" + "\n".join(lines)


def _unknown_key(key: str, where: str, known: list[str], environment: str = "") -> str:
    """ "unknown key", the nearest known one and all of them."""
    nearest = closest(canonical_key(key), known)
    guess = ""
    if nearest is not None:
        guess = f"did you mean {display_key(nearest)}"
        guess += f" ({environment}{nearest.upper()})?" if environment else "?"
        guess += " "
    listed = ", ".join(display_key(name) for name in known)
    return f"unknown key; {guess}the keys of {where} are {listed}"


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


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
            shown = "<hidden>" if is_secret_name(variable) else repr(_clip(mask_url(value)))
            named.append(
                f"  {variable}={shown}: {dotted} is a section, so the variable must "
                f"hold JSON (e.g. {variable}='{{...}}'), or set one value per variable "
                f"({variable}__<key>=...)"
            )
    if not named:
        return f"invalid ekbatan settings: {mask_url(str(error))}"
    return "invalid ekbatan settings:\n" + "\n".join(named)
