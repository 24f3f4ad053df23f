"""The migration SQL and the exported MetaData describe the same table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema, metadata, scheduled_tasks

MIGRATIONS = sorted(
    (Path(__file__).resolve().parent.parent / "migrations/postgresql").glob("V*.sql")
)


def _describe_table(inspector: Any, table: str) -> dict[str, Any]:
    columns = {c["name"]: (str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)}
    indexes = {
        i["name"]: (tuple(i["column_names"]), tuple(sorted(i.get("column_sorting", {}).items())))
        for i in inspector.get_indexes(table)
    }
    pk = inspector.get_pk_constraint(table)["constrained_columns"]
    return {"columns": columns, "indexes": indexes, "pk": pk}


def _describe(sync_conn: Any) -> dict[str, Any]:
    inspector = inspect(sync_conn)
    return {t: _describe_table(inspector, t) for t in sorted(inspector.get_table_names())}


def _statements(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("--")]
    return [s for s in "\n".join(lines).split(";") if s.strip()]


async def _describe_engine(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        return await conn.run_sync(_describe)


async def test_migration_and_metadata_agree(engine: AsyncEngine, database_url: str) -> None:
    from_metadata = await _describe_engine(engine)  # the fixture used create_schema
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA migrated"))
        await conn.execute(text("SET search_path TO migrated"))
        for migration in MIGRATIONS:
            for statement in _statements(migration):
                await conn.execute(text(statement))
    migrated_engine = create_async_engine(
        database_url, connect_args={"server_settings": {"search_path": "migrated"}}
    )
    try:
        from_migration = await _describe_engine(migrated_engine)
    finally:
        await migrated_engine.dispose()
    assert from_migration == from_metadata
    assert (
        set(from_metadata)
        == set(metadata.tables)
        == {
            "scheduled_tasks",
            "ekbatan_execution_history",
            "ekbatan_paused_tasks",
            "ekbatan_scheduler_instances",
            "ekbatan_jobs",
            "ekbatan_trace_context",
        }
    )
    tasks = from_metadata["scheduled_tasks"]
    assert tasks["pk"] == ["task_name", "task_instance"]
    assert set(tasks["indexes"]) == {
        "execution_time_idx",
        "last_heartbeat_idx",
        "priority_execution_time_idx",
        "ekbatan_task_name_priority_idx",  # ours, V0004
    }
    assert tasks["columns"]["execution_time"] == ("TIMESTAMP", False)
    async with engine.connect() as conn:
        definitions = {
            r[0]: r[1]
            for r in await conn.execute(
                text(
                    "SELECT schemaname, indexdef FROM pg_indexes "
                    "WHERE indexname = 'ekbatan_task_name_priority_idx'"
                )
            )
        }
    assert len(set(d.replace("migrated.", "public.") for d in definitions.values())) == 1
    assert (
        'task_name COLLATE "C", COALESCE((priority)::integer, 32768), execution_time'
        in (definitions["public"])
    )
    assert scheduled_tasks in metadata.tables.values()


async def test_create_schema_is_idempotent(engine: AsyncEngine) -> None:
    assert await create_schema(engine) is False
