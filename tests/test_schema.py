"""The migration SQL and the exported MetaData describe the same table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema, metadata, scheduled_tasks

MIGRATION = (
    Path(__file__).resolve().parent.parent
    / "migrations/postgresql/V0001__create_scheduled_tasks.sql"
)


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


async def _describe_engine(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        return await conn.run_sync(_describe)


async def test_migration_and_metadata_agree(engine: AsyncEngine, database_url: str) -> None:
    from_metadata = await _describe_engine(engine)  # the fixture used create_schema
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA migrated"))
        await conn.execute(text("SET search_path TO migrated"))
        for statement in MIGRATION.read_text().split(";"):
            if statement.strip():
                await conn.execute(text(statement))
    migrated_engine = create_async_engine(
        database_url, connect_args={"server_settings": {"search_path": "migrated"}}
    )
    try:
        from_migration = await _describe_engine(migrated_engine)
    finally:
        await migrated_engine.dispose()
    assert from_migration == from_metadata
    assert from_metadata["pk"] == ["task_name", "task_instance"]
    assert set(from_metadata["indexes"]) == {
        "execution_time_idx",
        "last_heartbeat_idx",
        "priority_execution_time_idx",
    }
    assert from_metadata["columns"]["execution_time"] == ("TIMESTAMP", False)
    assert scheduled_tasks in metadata.tables.values()


async def test_create_schema_is_idempotent(engine: AsyncEngine) -> None:
    assert await create_schema(engine) is False
