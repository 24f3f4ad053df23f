"""The ``scheduled_tasks`` table as SQLAlchemy metadata (for Alembic users and ``create_schema``).

The table is db-scheduler's, verbatim, so that it stays compatible with db-scheduler itself;
``migrations/<dialect>/`` holds the same DDL as SQL files and a test proves the two agree.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    inspect,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import TypeEngine

from .errors import ConfigurationError

__all__ = [
    "DEFAULT_TABLE_NAME",
    "UTCDateTime",
    "create_schema",
    "metadata",
    "scheduled_tasks",
    "scheduled_tasks_table",
    "validate_table_name",
]

DEFAULT_TABLE_NAME = "scheduled_tasks"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


def validate_table_name(name: str) -> str:
    """Accept ``table`` or ``schema.table`` made of letters, digits and underscores."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"table_name {name!r} is not a plain SQL identifier: use letters, digits and "
            "underscores (optionally 'schema.table'), e.g. 'scheduled_tasks'"
        )
    return name


class UTCDateTime(TypeDecorator[datetime]):
    """MySQL/MariaDB ``datetime(6)`` holding UTC: aware values are converted to naive UTC on the
    way in (the drivers would silently drop the offset) and come back aware, in UTC.

    ``datetime`` rather than ``timestamp`` (db-scheduler's choice) because ``timestamp`` is
    converted through the session time zone, stops at 2038, and MariaDB gives the first
    ``timestamp NOT NULL`` column an implicit ``ON UPDATE CURRENT_TIMESTAMP``.
    """

    impl = mysql.DATETIME(fsp=6)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def _key() -> TypeEngine[str]:
    return Text().with_variant(String(100), "mysql", "mariadb")


def _timestamp() -> TypeEngine[Any]:
    return DateTime(timezone=True).with_variant(UTCDateTime(), "mysql", "mariadb")


def scheduled_tasks_table(name: str = DEFAULT_TABLE_NAME, meta: MetaData | None = None) -> Table:
    """Describe db-scheduler's table under ``name`` (indexes are prefixed when renamed)."""
    validate_table_name(name)
    schema, _, table_name = name.rpartition(".")
    meta = meta if meta is not None else MetaData()
    table = Table(
        table_name,
        meta,
        Column("task_name", _key(), primary_key=True, nullable=False),
        Column("task_instance", _key(), primary_key=True, nullable=False),
        Column("task_data", LargeBinary().with_variant(mysql.BLOB(), "mysql", "mariadb")),
        Column("execution_time", _timestamp(), nullable=False),
        Column("picked", Boolean(), nullable=False),
        Column("picked_by", Text().with_variant(String(50), "mysql", "mariadb")),
        Column("last_success", _timestamp()),
        Column("last_failure", _timestamp()),
        Column("consecutive_failures", Integer()),
        Column("last_heartbeat", _timestamp()),
        Column("version", BigInteger(), nullable=False),
        Column("priority", SmallInteger()),
        schema=schema or None,
    )
    prefix = "" if table_name == DEFAULT_TABLE_NAME else f"{table_name}_"
    Index(f"{prefix}execution_time_idx", table.c.execution_time)
    Index(f"{prefix}last_heartbeat_idx", table.c.last_heartbeat)
    Index(
        f"{prefix}priority_execution_time_idx",
        table.c.priority.desc(),
        table.c.execution_time.asc(),
    )
    return table


metadata = MetaData()
"""MetaData holding ``scheduled_tasks``: point Alembic's ``target_metadata`` at it."""

scheduled_tasks = scheduled_tasks_table(DEFAULT_TABLE_NAME, metadata)


def _add_operations_tables() -> None:
    # Imported here: the operations tables reuse this module's column types.
    from .operations.tables import OperationsTables

    OperationsTables(metadata)


_add_operations_tables()


async def create_schema(
    engine: AsyncEngine, table_name: str = DEFAULT_TABLE_NAME, *, operations: bool = True
) -> bool:
    """Create db-scheduler's table and (unless ``operations=False``) our operations tables
    (execution history, paused tasks, scheduler instances), each only if it is missing.
    True if anything was created.

    Equivalent to applying ``migrations/<dialect>/V0001__create_scheduled_tasks.sql`` and
    ``V0002__ekbatan_operations.sql``.
    """
    from .operations.tables import OperationsTables

    meta = MetaData()
    table = scheduled_tasks_table(table_name, meta)
    if operations:
        OperationsTables(meta, table.schema)

    def create(sync_conn: Any) -> bool:
        inspector = inspect(sync_conn)
        missing = [t for t in meta.sorted_tables if not inspector.has_table(t.name, t.schema)]
        meta.create_all(sync_conn, tables=missing)
        return bool(missing)

    async with engine.begin() as conn:
        return bool(await conn.run_sync(create))
