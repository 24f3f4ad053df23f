"""Every ``EKBATAN_`` variable (the environment's, a ``.env`` file's) must name a setting: a
misspelt one (``EKBATAN_JOB__POLLING_INTERVAL``) is an error naming the nearest real one, not
a setting silently left at its default."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from ..domain.errors import ConfigurationError
from ..engine.config import closest
from .keys import canonical_key, display_key
from .sources import CONFIG_FILE_ENV, DATABASE_URL_ENV

__all__ = ["PREFIX", "RESERVED", "TEST_PREFIX", "KnownVariables", "unknown_variables"]

PREFIX = "EKBATAN_"
RESERVED = (CONFIG_FILE_ENV, DATABASE_URL_ENV)
"""``EKBATAN_`` variables that are not a key of the settings tree."""
TEST_PREFIX = "EKBATAN_TEST_"
"""The library's own test suite's variables (``EKBATAN_TEST_POSTGRES_URL``): not settings."""


def _unwrapped(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            kept = [arg for arg in get_args(annotation) if arg is not NoneType]
            annotation = kept[0] if len(kept) == 1 else annotation
            if len(kept) != 1:
                return annotation
        else:
            return annotation


def _fields(annotation: Any) -> dict[str, FieldInfo] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {canonical_key(name): info for name, info in annotation.model_fields.items()}
    return None


def _problem(model: type[BaseModel], parts: list[str]) -> tuple[int, str, list[str]] | None:
    """Where ``parts`` (a variable's path) leaves the settings tree: the index of the part,
    what is wrong there and the keys known at that level; None if it names a setting."""
    node: Any = model
    for index, part in enumerate(parts):
        node = _unwrapped(node)
        origin = get_origin(node)
        if origin is dict:
            node = get_args(node)[1]  # any key: a job's name, a slot's
            continue
        if origin is list:
            if not part.isdigit():
                return index, "a list: name its items by index (__0__, __1__, ...)", []
            node = get_args(node)[0]
            continue
        fields = _fields(node)
        if fields is None:
            return index, "a value, not a section", []
        found = fields.get(part)
        if found is None:
            return index, "unknown key", list(fields)
        node = found.annotation
    return None


def _corrected(model: type[BaseModel], parts: list[str]) -> list[str] | None:
    """``parts`` with each unknown key replaced by the nearest known one, if all have one."""
    parts = list(parts)
    for _ in parts:
        found = _problem(model, parts)
        if found is None:
            return parts
        index, _, known = found
        nearest = closest(parts[index], known)
        if nearest is None:
            return None
        parts[index] = nearest
    return None


def _known_names(model: type[BaseModel], path: str = "") -> Iterator[str]:
    """The variables of every setting outside mappings, lists as their first item."""
    for name, info in model.model_fields.items():
        here = f"{path}__{name}" if path else name
        yield here
        node = _unwrapped(info.annotation)
        while get_origin(node) is list:
            here += "__0"
            node = _unwrapped(get_args(node)[0])
        if _fields(node) is not None:
            yield from _known_names(node, here)


def _path(parts: list[str]) -> str:
    """``ekbatan.sharding.groups[0].members``: the key path as the YAML file writes it."""
    path = "ekbatan"
    for part in parts:
        path += f"[{part}]" if part.isdigit() else f".{display_key(part)}"
    return path


def _suggestion(model: type[BaseModel], parts: list[str], known: list[str]) -> str:
    """The variable the user probably meant: each unknown key replaced by its nearest, or the
    nearest variable of the whole tree (``EKBATAN_JOBS_POLLING_INTERVAL``, one underscore)."""
    fixed = _corrected(model, parts) if known else None
    if fixed is None:
        candidates = [*_known_names(model), *(n[len(PREFIX) :].lower() for n in RESERVED)]
        near = closest("__".join(parts), candidates, cutoff=0.8)
        fixed = near.split("__") if near is not None else None
    return f"did you mean {PREFIX}{'__'.join(fixed).upper()}? " if fixed is not None else ""


def unknown_variables(model: type[BaseModel], names: Iterable[str]) -> list[str]:
    """A line per ``EKBATAN_`` variable of ``names`` that names no setting of ``model``."""
    lines = []
    for variable in sorted(names):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in RESERVED or upper.startswith(TEST_PREFIX):
            continue
        parts = upper[len(PREFIX) :].lower().split("__")
        found = _problem(model, parts)
        if found is None:
            continue
        index, problem, known = found
        line = f"  - {_path(parts[: index + 1])} (environment: {upper}): {problem}; "
        line += _suggestion(model, parts, known)
        if known:
            keys = ", ".join(display_key(key) for key in known)
            line += f"the keys of {_path(parts[:index])} are {keys}"
            if index == 0:
                line += f" (and {', '.join(RESERVED)})"
        lines.append(line.rstrip("; "))
    return lines


class KnownVariables(PydanticBaseSettingsSource):
    """Produces nothing; raises ConfigurationError when a variable of the environment or of
    the ``.env`` file has the ``EKBATAN_`` prefix but names no setting."""

    def __init__(
        self, settings_cls: type[BaseSettings], sources: Iterable[PydanticBaseSettingsSource]
    ) -> None:
        super().__init__(settings_cls)
        self.sources = [source for source in sources if isinstance(source, EnvSettingsSource)]

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # a check only

    def __call__(self) -> dict[str, Any]:
        names = {name for source in self.sources for name in source.env_vars}
        lines = unknown_variables(self.settings_cls, names)
        if lines:
            raise ConfigurationError(
                "invalid ekbatan settings: these variables name no setting:\n" + "\n".join(lines)
            )
        return {}
