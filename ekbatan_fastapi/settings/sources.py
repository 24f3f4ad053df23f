"""The YAML settings file (``EKBATAN_CONFIG_FILE``): its ``ekbatan:`` section, with
``${VAR}`` / ``${VAR:default}`` interpolation from the environment; and ``EKBATAN_DATABASE_URL``,
the short name of the jobs database's URL."""

from __future__ import annotations

import contextvars
import os
import re
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from ..domain.errors import ConfigurationError
from ..domain.text import mask_url
from ..engine.config import closest
from .keys import canonical_key, canonical_mapping, display_key

__all__ = [
    "CONFIG_FILE",
    "CONFIG_FILE_ENV",
    "DATABASE_URL_ENV",
    "JOBS_SLOT_ENV",
    "DatabaseUrlAlias",
    "YamlFileSource",
]

CONFIG_FILE_ENV = "EKBATAN_CONFIG_FILE"
DATABASE_URL_ENV = "EKBATAN_DATABASE_URL"
JOBS_SLOT_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG"
"""The jobs database's slot in the environment (``..._URL``, ``..._PASSWORD``, ...)."""
_JOBS_SLOT = ("sharding", "groups", "0", "members", "0", "configs", "jobs_config")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")
CONFIG_FILE: contextvars.ContextVar[str | Path | None] = contextvars.ContextVar(
    "ekbatan_config_file", default=None
)
"""The file given to ``EkbatanSettings(_config_file=...)``, while it is being built."""


def _interpolate(value: Any, path: str, source: Path) -> Any:
    """Replace ``${VAR}`` / ``${VAR:default}`` in string values; lists become index maps so
    that environment variables (``...__GROUPS__0__...``) merge into them item by item."""
    if isinstance(value, dict):
        mapped = canonical_mapping(value, f" at {path} in {source}")
        return {k: _interpolate(v, f"{path}.{display_key(k)}", source) for k, v in mapped.items()}
    if isinstance(value, list):
        return {str(i): _interpolate(v, f"{path}[{i}]", source) for i, v in enumerate(value)}
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match[1], match[2]
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigurationError(
                f"{path} in {source} refers to ${{{name}}}, which is not set; set the "
                f"environment variable {name} or write ${{{name}:default}}"
            )

        return _INTERPOLATION.sub(substitute, value)
    return value


def _yaml_problem(error: Exception) -> str:
    """PyYAML's complaint and where, without the snippet of the file it quotes: that line
    (or, for an unclosed quote, the lines after it) may hold a password."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if problem is None or mark is None:
        return f"{type(error).__name__} (the file's text is not shown: it may hold secrets)"
    context = getattr(error, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return mask_url(f"{context + ': ' if context else ''}{problem} at {where}")


class YamlFileSource(PydanticBaseSettingsSource):
    """The ``ekbatan:`` section of the YAML file named by ``EKBATAN_CONFIG_FILE``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything is produced by __call__

    def __call__(self) -> dict[str, Any]:
        path = CONFIG_FILE.get() or os.environ.get(CONFIG_FILE_ENV)
        if not path:
            return {}
        source = Path(path)
        try:
            import yaml
        except ImportError:
            raise ConfigurationError(
                f"{CONFIG_FILE_ENV}={source} needs PyYAML: pip install 'ekbatan-fastapi[yaml]'"
            ) from None
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigurationError(
                f"cannot read the settings file {source} ({CONFIG_FILE_ENV}): "
                f"{error.strerror or error}"
            ) from None
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as error:
            problem = _yaml_problem(error)
            raise ConfigurationError(f"{source} is not valid YAML: {problem}") from None
        if not isinstance(document, dict) or not isinstance(document.get("ekbatan"), dict):
            raise ConfigurationError(
                f"{source} has no 'ekbatan:' mapping at the top level; the settings live "
                "under it (ekbatan: / jobs: / polling-interval: PT10S)"
            )
        try:
            result = _interpolate(document["ekbatan"], "ekbatan", source)
        except ValueError as error:  # a non-string key, or one key in two spellings
            raise ConfigurationError(f"invalid ekbatan settings: {error}") from None
        assert isinstance(result, dict)
        _near_misses(result, list(self.settings_cls.model_fields), source)
        return result


def _near_misses(section: dict[str, Any], known: list[str], source: Path) -> None:
    """A key of the file's ``ekbatan:`` section that is not Ekbatan's is left alone (the file
    may hold the JVM Ekbatan's settings too), unless it is a misspelling of one of ours."""
    for key in section:
        nearest = closest(key, known, cutoff=0.8) if key not in known else None
        if nearest is not None:
            raise ConfigurationError(
                f"invalid ekbatan settings: ekbatan.{display_key(key)} in {source} is not a "
                f"key of Ekbatan's; did you mean ekbatan.{display_key(nearest)}?"
            )


def _environment_value(name: str) -> str | None:
    """``name`` in the environment, its case ignored as the settings ignore it."""
    for variable, value in os.environ.items():
        if variable.upper() == name:
            return value
    return None


def _child(node: Any, key: str) -> Any:
    """One step down the environment's settings tree: index maps (``{"0": ...}``), lists
    (from a JSON value) and keys in any spelling."""
    if isinstance(node, list):
        return node[int(key)] if key.isdigit() and int(key) < len(node) else None
    if isinstance(node, dict):
        for name, value in node.items():
            if isinstance(name, str) and canonical_key(name) == key:
                return value
    return None


class DatabaseUrlAlias(PydanticBaseSettingsSource):
    """``EKBATAN_DATABASE_URL``: the ``url`` of the jobs-config slot
    (``EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL``), below the
    environment's own spelling of the slot and above the YAML file. Both set to different
    URLs, or the alias beside the slot's ``jdbc-url``, is an error: which one is meant is not
    clear."""

    def __init__(
        self, settings_cls: type[BaseSettings], environment: PydanticBaseSettingsSource
    ) -> None:
        super().__init__(settings_cls)
        self.environment = environment

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything is produced by __call__

    def __call__(self) -> dict[str, Any]:
        url = _environment_value(DATABASE_URL_ENV)
        if url is None:
            return {}
        slot: Any = self.environment()
        for key in _JOBS_SLOT:
            slot = _child(slot, key)
        long_url, jdbc_url = _child(slot, "url"), _child(slot, "jdbc_url")
        if long_url is not None and long_url != url:
            raise ConfigurationError(
                f"{DATABASE_URL_ENV} and {JOBS_SLOT_ENV}__URL are both set, to different "
                f"URLs; keep one ({DATABASE_URL_ENV} is the short name of the other)"
            )
        if jdbc_url is not None:
            raise ConfigurationError(
                f"{DATABASE_URL_ENV} sets the jobs database's url and {JOBS_SLOT_ENV}__JDBC_URL "
                "its jdbc-url; keep one"
            )
        result: dict[str, Any] = {"url": url}
        for key in reversed(_JOBS_SLOT):
            result = {key: result}
        return result
