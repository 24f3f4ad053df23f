"""Settings for the FastAPI integration and the CLI: environment, an optional YAML file, and
defaults (pydantic-settings). Importing them does not import FastAPI."""

from __future__ import annotations

from ..domain.text import mask_url
from .datasource import DataSourceConfig
from .keys import canonical_key
from .model import EkbatanSettings, JobsSettings, ShardGroup, ShardingSettings, ShardMember
from .reference import SettingReference, settings_reference
from .sources import CONFIG_FILE_ENV

__all__ = [
    "CONFIG_FILE_ENV",
    "DataSourceConfig",
    "EkbatanSettings",
    "JobsSettings",
    "SettingReference",
    "ShardGroup",
    "ShardMember",
    "ShardingSettings",
    "canonical_key",
    "mask_url",
    "settings_reference",
]
