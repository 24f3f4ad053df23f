"""The YAML settings file (``EKBATAN_CONFIG_FILE``): its ``ekbatan:`` section, with
``${VAR}`` / ``${VAR:default}`` interpolation from the environment."""

from __future__ import annotations

import contextvars
import os
import re
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from ..domain.errors import ConfigurationError
from .keys import canonical_mapping, display_key

__all__ = ["CONFIG_FILE", "CONFIG_FILE_ENV", "YamlFileSource"]

CONFIG_FILE_ENV = "EKBATAN_CONFIG_FILE"
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
            raise ConfigurationError(f"{source} is not valid YAML: {error}") from None
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
        return result
