"""The MySQL and MariaDB migrations and the exported MetaData describe the same table.

Runs on the server named by EKBATAN_TEST_MYSQL_URL (skipped without it), like
``test_schema.py`` does for PostgreSQL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema

from .conftest import fresh_mysql_database

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def _describe(sync_conn: Any) -> dict[str, Any]:
    inspector = inspect(sync_conn)
    columns = {
        c["name"]: (str(c["type"]), c["nullable"]) for c in inspector.get_columns("scheduled_tasks")
    }
    indexes = {
        i["name"]: (tuple(i["column_names"]), tuple(sorted(i.get("column_sorting", {}).items())))
        for i in inspector.get_indexes("scheduled_tasks")
    }
    pk = inspector.get_pk_constraint("scheduled_tasks")["constrained_columns"]
    return {"columns": columns, "indexes": indexes, "pk": pk}


async def _state(engine: AsyncEngine) -> tuple[dict[str, Any], str]:
    async with engine.connect() as conn:
        described = await conn.run_sync(_describe)
        ddl = (await conn.execute(text("SHOW CREATE TABLE scheduled_tasks"))).one()[1]
    # the server's own DDL, line by line; index order follows creation order, so sorted
    return described, "\n".join(sorted(line.strip().rstrip(",") for line in ddl.splitlines()))


async def _built(url: str, migration: str | None) -> tuple[dict[str, Any], str]:
    engine = create_async_engine(url)
    try:
        if migration is None:
            assert await create_schema(engine) is True
            assert await create_schema(engine) is False  # idempotent
        else:
            sql = "\n".join(line for line in migration.splitlines() if not line.startswith("--"))
            async with engine.begin() as conn:
                for statement in sql.split(";"):
                    if statement.strip():
                        await conn.execute(text(statement))
        return await _state(engine)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("dialect", ["mysql", "mariadb"])
async def test_migration_and_metadata_agree(mysql_server_url: str, dialect: str) -> None:
    migration = (MIGRATIONS / dialect / "V0001__create_scheduled_tasks.sql").read_text()
    async with fresh_mysql_database(mysql_server_url) as url:
        from_metadata = await _built(url, None)
    async with fresh_mysql_database(mysql_server_url) as url:
        from_migration = await _built(url, migration)
    assert from_migration == from_metadata
    described, ddl = from_metadata
    assert described["pk"] == ["task_name", "task_instance"]
    assert set(described["indexes"]) == {
        "execution_time_idx",
        "last_heartbeat_idx",
        "priority_execution_time_idx",
    }
    # db-scheduler's MySQL types, with datetime(6) for its timestamp(6)
    for column, sql_type in [
        ("task_name", "varchar(100) NOT NULL"),
        ("task_instance", "varchar(100) NOT NULL"),
        ("task_data", "blob"),
        ("execution_time", "datetime(6) NOT NULL"),
        ("picked", "tinyint(1) NOT NULL"),
        ("picked_by", "varchar(50)"),
        ("last_heartbeat", "datetime(6)"),
        ("version", "bigint(20) NOT NULL"),
        ("priority", "smallint(6)"),
    ]:
        line = rf"^`{column}` {re.escape(sql_type)}( DEFAULT NULL)?$"
        assert re.search(line, ddl, re.MULTILINE), (column, ddl)
    assert "KEY `priority_execution_time_idx` (`priority` DESC,`execution_time`)" in ddl
