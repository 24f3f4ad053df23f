"""Our own tables beside db-scheduler's (which stays verbatim): execution history, paused tasks
and live scheduler instances. ``migrations/<dialect>/V0002__ekbatan_operations.sql`` holds the
same DDL; a test proves they agree."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Table, Text
from sqlalchemy.types import TypeEngine

__all__ = ["HISTORY", "INSTANCES", "PAUSED", "OperationsTables"]

HISTORY = "ekbatan_execution_history"
PAUSED = "ekbatan_paused_tasks"
INSTANCES = "ekbatan_scheduler_instances"


def _text(length: int) -> TypeEngine[Any]:
    """TEXT on PostgreSQL; VARCHAR(length) on MySQL/MariaDB (indexable, bounded)."""
    return Text().with_variant(String(length), "mysql", "mariadb")


class OperationsTables:
    """The three tables, in the schema of the ``scheduled_tasks`` table they accompany."""

    def __init__(self, meta: MetaData, schema: str | None = None) -> None:
        # Imported here: schema.py adds these tables to its MetaData at import time.
        from ..schema import _key, _timestamp

        self.history = Table(
            HISTORY,
            meta,
            Column("id", BigInteger(), primary_key=True, autoincrement=True),
            Column("task_name", _key(), nullable=False),
            Column("task_instance", _key(), nullable=False),
            Column("execution_time", _timestamp(), nullable=False),
            Column("picked_by", _text(50)),
            Column("started_at", _timestamp(), nullable=False),
            Column("finished_at", _timestamp(), nullable=False),
            Column("outcome", _text(20), nullable=False),
            Column("error_class", _text(200)),
            Column("error_message", _text(2000)),
            schema=schema,
        )
        Index("ekbatan_history_task_idx", self.history.c.task_name, self.history.c.id)
        Index("ekbatan_history_finished_idx", self.history.c.finished_at)
        self.paused = Table(
            PAUSED,
            meta,
            Column("task_name", _key(), primary_key=True),
            Column("paused_by", _text(200)),
            Column("paused_at", _timestamp(), nullable=False),
            Column("reason", _text(1000)),
            schema=schema,
        )
        self.instances = Table(
            INSTANCES,
            meta,
            Column("name", _text(50), primary_key=True),
            Column("host", _text(255), nullable=False),
            Column("pid", Integer(), nullable=False),
            Column("started_at", _timestamp(), nullable=False),
            Column("last_seen", _timestamp(), nullable=False),
            Column("library_version", _text(50), nullable=False),
            schema=schema,
        )

    @property
    def all(self) -> tuple[Table, Table, Table]:
        return (self.history, self.paused, self.instances)
