"""The tables as SQLAlchemy metadata (for Alembic users and the statements).

``scheduled_tasks`` is db-scheduler's table, verbatim, so that it stays compatible with
db-scheduler itself. Beside it live our own tables (execution history, paused tasks, live
scheduler instances), in the same schema. ``migrations/<dialect>/`` holds the DDL as SQL files
(what ``migrate`` and ``create_schema`` apply) and a test proves the two agree.
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
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import operators
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement, UnaryExpression
from sqlalchemy.types import TypeEngine

from ..domain.errors import ConfigurationError

__all__ = [
    "DEFAULT_TABLE_NAME",
    "HISTORY",
    "INSTANCES",
    "JOBS",
    "PAUSED",
    "TASK_NAME_INDEX",
    "TRACE_CONTEXT",
    "Tables",
    "UTCDateTime",
    "metadata",
    "quote_table",
    "scheduled_tasks",
    "scheduled_tasks_table",
    "validate_table_name",
]

DEFAULT_TABLE_NAME = "scheduled_tasks"
HISTORY = "ekbatan_execution_history"
PAUSED = "ekbatan_paused_tasks"
INSTANCES = "ekbatan_scheduler_instances"
JOBS = "ekbatan_jobs"
TASK_NAME_INDEX = "ekbatan_task_name_priority_idx"
"""Our index on ``scheduled_tasks`` (migration V0004)."""
TRACE_CONTEXT = "ekbatan_trace_context"
"""The trace context a one-time task was scheduled in (migration V0005, OpenTelemetry)."""
CANCEL_REQUESTS = "ekbatan_cancel_requests"
"""Requests to stop a running execution (migration V0006, ``client.cancel_running``)."""
MISSED_STREAKS = "ekbatan_missed_streaks"
"""Consecutive missed slots per recurring task instance (migration V0007)."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")


def validate_table_name(name: str) -> str:
    """Accept ``table`` or ``schema.table`` made of letters, digits and underscores (the
    whole name: ``fullmatch``, as ``$`` would also match before a final newline)."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"table_name {name!r} is not a plain SQL identifier: use letters, digits and "
            "underscores (optionally 'schema.table'), e.g. 'scheduled_tasks'"
        )
    return name


def quote_table(table: Table, dialect: Dialect) -> str:
    """``table``'s name (with its schema) as the dialect writes it in SQL text."""
    return dialect.identifier_preparer.format_table(table)


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


def _text(length: int) -> TypeEngine[str]:
    """TEXT on PostgreSQL; VARCHAR(length) on MySQL/MariaDB (indexable, bounded)."""
    return Text().with_variant(String(length), "mysql", "mariadb")


def timestamp() -> TypeEngine[Any]:
    """``timestamptz`` on PostgreSQL, ``datetime(6)`` in UTC on MySQL/MariaDB."""
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
        Column("execution_time", timestamp(), nullable=False),
        Column("picked", Boolean(), nullable=False),
        Column("picked_by", _text(50)),
        Column("last_success", timestamp()),
        Column("last_failure", timestamp()),
        Column("consecutive_failures", Integer()),
        Column("last_heartbeat", timestamp()),
        Column("version", BigInteger(), nullable=False),
        Column("priority", SmallInteger()),
        schema=schema or None,
    )
    prefix = _index_prefix(table_name)
    Index(f"{prefix}execution_time_idx", table.c.execution_time)
    Index(f"{prefix}last_heartbeat_idx", table.c.last_heartbeat)
    Index(
        f"{prefix}priority_execution_time_idx",
        table.c.priority.desc(),
        table.c.execution_time.asc(),
    )
    _task_name_index(table, f"{prefix}{TASK_NAME_INDEX}")
    return table


def _index_prefix(table_name: str) -> str:
    """What the names of db-scheduler's indexes start with on a table named ``table_name``
    (without its schema): nothing under db-scheduler's name, else the table's name and ``_``."""
    return "" if table_name == DEFAULT_TABLE_NAME else f"{table_name}_"


class _PriorityKey(UnaryExpression[Any]):
    """The second key of our index: ``priority DESC`` on MySQL/MariaDB, and
    ``coalesce(CAST(priority AS INTEGER), 32768)`` on PostgreSQL (NULL as 32768, above every
    smallint, where ``ORDER BY priority DESC`` puts it). A sort of the column (as
    ``priority.desc()`` is) everywhere but PostgreSQL, so that Alembic compares MySQL's by its
    columns."""

    inherit_cache = True

    def __init__(self, priority: ColumnElement[Any]) -> None:
        super().__init__(priority, modifier=operators.desc_op)


@compiles(_PriorityKey, "postgresql")
def _priority_key(element: _PriorityKey, compiler: SQLCompiler, **kw: Any) -> str:
    return f"coalesce(CAST({compiler.process(element.element, **kw)} AS INTEGER), 32768)"


def _task_name_index(table: Table, name: str) -> None:
    """Ours (migration V0004): the polls reach the rows of the task names they know through it,
    never reading rows of other names. PostgreSQL's is made for the row comparisons of
    ``store/postgresql/statements.py`` (the ``C`` collation and NULL priority as 32768, which
    no other index shares); MySQL/MariaDB's is plain.

    One ``Index`` for every dialect (its second key compiles per dialect), not one per dialect
    under ``ddl_if``: Alembic's autogenerate ignores ``ddl_if`` and would compare the database's
    index with either. The collation is the column's ``postgresql_ops`` (the DDL is the same,
    ``task_name COLLATE "C"``): SQLAlchemy's reflection does not report an index column's
    collation, so written as an expression it would look changed to ``alembic check``."""
    c = table.c
    Index(
        name,
        c.task_name,
        _PriorityKey(c.priority),
        c.execution_time,
        postgresql_ops={"task_name": 'COLLATE "C"'},
    )


class Tables:
    """The tables of one deployment: db-scheduler's under its configured name, and ours
    (history, paused tasks, instances, job definitions) in the same schema."""

    def __init__(self, table_name: str = DEFAULT_TABLE_NAME, meta: MetaData | None = None) -> None:
        self.meta = meta if meta is not None else MetaData()
        self.tasks = scheduled_tasks_table(table_name, self.meta)
        self.table_name = table_name
        schema = self.tasks.schema
        self.history = Table(
            HISTORY,
            self.meta,
            Column("id", BigInteger(), primary_key=True, autoincrement=True),
            Column("task_name", _key(), nullable=False),
            Column("task_instance", _key(), nullable=False),
            Column("execution_time", timestamp(), nullable=False),
            Column("picked_by", _text(50)),
            Column("started_at", timestamp(), nullable=False),
            Column("finished_at", timestamp(), nullable=False),
            Column("outcome", _text(20), nullable=False),
            Column("error_class", _text(200)),
            Column("error_message", _text(2000)),
            schema=schema,
        )
        Index("ekbatan_history_task_idx", self.history.c.task_name, self.history.c.id)
        Index("ekbatan_history_finished_idx", self.history.c.finished_at)
        self.paused = Table(
            PAUSED,
            self.meta,
            Column("task_name", _key(), primary_key=True),
            Column("paused_by", _text(200)),
            Column("paused_at", timestamp(), nullable=False),
            Column("reason", _text(1000)),
            schema=schema,
        )
        self.instances = Table(
            INSTANCES,
            self.meta,
            Column("name", _text(50), primary_key=True),
            Column("host", _text(255), nullable=False),
            Column("pid", Integer(), nullable=False),
            Column("started_at", timestamp(), nullable=False),
            Column("last_seen", timestamp(), nullable=False),
            Column("library_version", _text(50), nullable=False),
            schema=schema,
        )

        self.jobs = Table(
            JOBS,
            self.meta,
            Column("task_name", _key(), primary_key=True),
            Column("kind", _text(20), nullable=False),
            Column("schedule", _text(1000)),
            Column("fingerprint", _text(64)),
            Column("app_version", _text(100)),
            Column("timeout_ms", BigInteger()),
            Column("max_concurrency", Integer()),
            Column("keyed", Boolean(), nullable=False),
            Column("written_by", _text(50), nullable=False),
            Column("written_at", timestamp(), nullable=False),
            Column("catch_up", _text(100)),
            Column("missed_slots", BigInteger(), nullable=False, server_default=text("0")),
            Column("caught_up_slots", BigInteger(), nullable=False, server_default=text("0")),
            Column("skipped_slots", BigInteger(), nullable=False, server_default=text("0")),
            Index("ekbatan_jobs_written_at_idx", "written_at"),
            schema=schema,
        )
        self.traces = Table(
            TRACE_CONTEXT,
            self.meta,
            Column("task_name", _key(), primary_key=True),
            Column("task_instance", _key(), primary_key=True),
            Column("traceparent", _text(55), nullable=False),
            Column("tracestate", _text(512)),
            Column("created_at", timestamp(), nullable=False),
            schema=schema,
        )
        self.cancels = Table(
            CANCEL_REQUESTS,
            self.meta,
            Column("task_name", _key(), primary_key=True),
            Column("task_instance", _key(), primary_key=True),
            Column("version", BigInteger(), nullable=False),
            Column("requested_by", _text(200)),
            Column("requested_at", timestamp(), nullable=False),
            Column("reason", _text(1000)),
            schema=schema,
        )
        self.streaks = Table(
            MISSED_STREAKS,
            self.meta,
            Column("task_name", _key(), primary_key=True),
            Column("task_instance", _key(), primary_key=True),
            Column("missed", BigInteger(), nullable=False),
            Column("next_time", timestamp(), nullable=False),
            Column("updated_at", timestamp(), nullable=False),
            schema=schema,
        )

    def migration_names(self) -> dict[str, str]:
        """The name of each table and index in the migration files -> its name here (without
        the schema). Only db-scheduler's table and its indexes are renamed
        (``scheduled_tasks``, ``execution_time_idx``, ...); ours keep their names."""
        prefix = _index_prefix(self.tasks.name)
        names = {DEFAULT_TABLE_NAME: self.tasks.name}
        names |= {str(i.name).removeprefix(prefix): str(i.name) for i in self.tasks.indexes}
        for table in self.ours:
            names[table.name] = table.name
            names |= {str(i.name): str(i.name) for i in table.indexes}
        return names

    def by_migration_name(self) -> dict[str, Table]:
        """Each table under the name the migration files give it."""
        return {DEFAULT_TABLE_NAME: self.tasks} | {t.name: t for t in self.ours}

    @property
    def operations(self) -> tuple[Table, Table, Table]:
        """Our own tables of migration V0002."""
        return (self.history, self.paused, self.instances)

    @property
    def ours(self) -> tuple[Table, ...]:
        """Every table of ours (V0002, V0003, V0005, V0006, V0007)."""
        return (*self.operations, self.jobs, self.traces, self.cancels, self.streaks)

    def migration_of(self, table_name: str) -> str:
        """The shipped migration that creates ``table_name`` (for error messages)."""
        if table_name in (t.name for t in self.operations):
            return "V0002__ekbatan_operations"
        if table_name == JOBS:
            return "V0003__ekbatan_jobs"
        if table_name == TRACE_CONTEXT:
            return "V0005__ekbatan_trace_context"
        if table_name == CANCEL_REQUESTS:
            return "V0006__ekbatan_cancel_requests"
        if table_name == MISSED_STREAKS:
            return "V0007__ekbatan_missed_streaks"
        return "V0001__create_scheduled_tasks"


metadata = MetaData()
"""MetaData holding ``scheduled_tasks`` and our tables: point Alembic's ``target_metadata`` at
it."""

scheduled_tasks = Tables(DEFAULT_TABLE_NAME, metadata).tasks
