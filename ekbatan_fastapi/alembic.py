"""Alembic helpers (docs/migrations.md): ``render_item`` makes ``alembic revision
--autogenerate`` write Ekbatan's tables as a revision that runs, and ``include_object`` hides
them from Alembic when ``ekbatan-jobs migrate`` owns them.

Alembic is the application's tool: this module does not import it.

.. code-block:: python

    # env.py, Alembic creates Ekbatan's tables:
    from ekbatan_fastapi import metadata as ekbatan_metadata
    from ekbatan_fastapi.alembic import render_item
    context.configure(..., target_metadata=[Base.metadata, ekbatan_metadata],
                      render_item=render_item)

    # env.py, ekbatan-jobs migrate creates them, Alembic the application's own:
    from ekbatan_fastapi.alembic import include_object
    context.configure(..., target_metadata=Base.metadata, include_object=include_object)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from .store.migrate import MIGRATIONS_TABLE
from .store.tables import (
    CANCEL_REQUESTS,
    DEFAULT_TABLE_NAME,
    HISTORY,
    INSTANCES,
    JOBS,
    MISSED_STREAKS,
    PAUSED,
    TRACE_CONTEXT,
    UTCDateTime,
    validate_table_name,
)

__all__ = [
    "IncludeObject",
    "ekbatan_table_names",
    "excluding_ekbatan",
    "include_object",
    "render_item",
]

IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]
"""Alembic's ``include_object(object, name, type_, reflected, compare_to)``."""


class _AutogenContext(Protocol):
    """What ``render_item`` uses of Alembic's ``AutogenContext``."""

    @property
    def imports(self) -> set[str]: ...


def render_item(type_: str, obj: Any, autogen_context: _AutogenContext) -> str | Literal[False]:
    """Alembic's ``render_item`` hook: Ekbatan's MySQL/MariaDB timestamp type
    (``UTCDateTime``, a ``TypeDecorator``) is written as the column type it creates,
    ``mysql.DATETIME(fsp=6)``, with its import. Without it, autogenerate writes
    ``ekbatan_fastapi.store.tables.UTCDateTime(...)`` and the revision fails with a
    ``NameError``. Everything else is left to Alembic (``False``); to combine it with a hook
    of your own, call this one first and yours when it returns ``False``."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        autogen_context.imports.add("from sqlalchemy.dialects import mysql")
        return "mysql.DATETIME(fsp=6)"
    return False


def ekbatan_table_names(table_name: str = DEFAULT_TABLE_NAME) -> frozenset[str]:
    """The tables ``ekbatan-jobs migrate`` creates and owns: db-scheduler's (under
    ``table_name``, without its schema), Ekbatan's own, and its record of the migrations."""
    name = validate_table_name(table_name).rpartition(".")[2]
    ours = {
        HISTORY,
        PAUSED,
        INSTANCES,
        JOBS,
        TRACE_CONTEXT,
        CANCEL_REQUESTS,
        MISSED_STREAKS,
        MIGRATIONS_TABLE,
    }
    return frozenset({name, *ours})


def excluding_ekbatan(
    table_name: str = DEFAULT_TABLE_NAME, include_object: IncludeObject | None = None
) -> IncludeObject:
    """An ``include_object`` hook that leaves Ekbatan's tables (and their columns, indexes
    and constraints) out of Alembic's comparison, so that ``alembic check`` and autogenerate
    see only the application's tables. ``table_name``: db-scheduler's table when renamed
    (``schema.table`` limits the match to that schema); ``include_object``: your own hook,
    asked about everything else."""
    names = ekbatan_table_names(table_name)
    schema = validate_table_name(table_name).rpartition(".")[0] or None

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        table = obj if type_ == "table" else getattr(obj, "table", None)
        table_name_here = name if type_ == "table" else getattr(table, "name", None)
        ours = table_name_here in names and (
            schema is None or getattr(table, "schema", None) == schema
        )
        if ours:
            return False
        return include_object is None or include_object(obj, name, type_, reflected, compare_to)

    return include


include_object: IncludeObject = excluding_ekbatan()
"""``excluding_ekbatan()`` for the default ``scheduled_tasks``: pass it as Alembic's
``include_object`` when ``ekbatan-jobs migrate`` creates Ekbatan's tables."""
