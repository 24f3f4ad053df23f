"""The key-spelling rules shared by every settings section: ``pollingInterval``,
``polling-interval`` and ``polling_interval`` are one key."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["SettingsSection", "canonical_key", "canonical_mapping", "display_key"]

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def canonical_key(key: str) -> str:
    """``pollingInterval``, ``polling-interval``, ``POLLING_INTERVAL`` -> ``polling_interval``."""
    return _CAMEL_BOUNDARY.sub("_", key).replace("-", "_").lower()


def display_key(key: str) -> str:
    """The kebab-case spelling used in messages (``polling-interval``)."""
    return key.replace("_", "-")


def canonical_mapping(data: Any, where: str) -> Any:
    """Rename every key of ``data`` (if a mapping) to snake_case; two spellings of one key
    in the same mapping are an error, since it is not clear which one is meant."""
    if not isinstance(data, dict):
        return data
    result: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ValueError(f"key {key!r}{where} must be a string")
        canonical = canonical_key(key)
        if canonical in spelled and spelled[canonical] != key:
            raise ValueError(
                f"{spelled[canonical]!r} and {key!r}{where} are the same key in different "
                "spellings; keep one"
            )
        spelled[canonical] = key
        result[canonical] = value
    return result


class SettingsSection(BaseModel):
    """A settings section whose keys may be snake_case, kebab-case or camelCase."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _canonical_keys(cls, data: Any) -> Any:
        return canonical_mapping(data, "")
