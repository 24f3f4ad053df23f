"""The migration SQL, ``create_schema`` (the same SQL, on a deployment's table names) and the
exported MetaData (for Alembic) describe the same tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import create_schema, metadata, scheduled_tasks
from ekbatan_fastapi.store.tables import Tables

MIGRATIONS = sorted(
    (Path(__file__).resolve().parent.parent / "migrations/postgresql").glob("V*.sql")
)
TABLES = {
    "scheduled_tasks",
    "ekbatan_execution_history",
    "ekbatan_paused_tasks",
    "ekbatan_scheduler_instances",
    "ekbatan_jobs",
    "ekbatan_trace_context",
    "ekbatan_cancel_requests",
    "ekbatan_missed_streaks",
}


def _describe_table(inspector: Any, table: str, schema: str) -> dict[str, Any]:
    columns = {
        c["name"]: (str(c["type"]), c["nullable"], c["default"])
        for c in inspector.get_columns(table, schema)
    }
    indexes = {
        i["name"]: (tuple(i["column_names"]), tuple(sorted(i.get("column_sorting", {}).items())))
        for i in inspector.get_indexes(table, schema)
    }
    pk = inspector.get_pk_constraint(table, schema)["constrained_columns"]
    return {"columns": columns, "indexes": indexes, "pk": pk}


async def _describe(engine: AsyncEngine, schema: str) -> dict[str, Any]:
    def describe(sync_conn: Any) -> dict[str, Any]:
        inspector = inspect(sync_conn)
        tables = sorted(inspector.get_table_names(schema))
        described = {t: _describe_table(inspector, t, schema) for t in tables}
        for table in described.values():  # a serial's sequence is named after its schema
            for name, (sql_type, nullable, default) in table["columns"].items():
                if default and "nextval" in default:
                    table["columns"][name] = (sql_type, nullable, "nextval")
        return described

    async with engine.connect() as conn:
        return await conn.run_sync(describe)


def _statements(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("--")]
    return [s for s in "\n".join(lines).split(";") if s.strip()]


async def test_migration_create_schema_and_metadata_agree(engine: AsyncEngine) -> None:
    from_create_schema = await _describe(engine, "public")  # the fixture used create_schema
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA migrated"))
        await conn.execute(text("SET LOCAL search_path TO migrated"))
        for migration in MIGRATIONS:
            for statement in _statements(migration):
                await conn.execute(text(statement))
        await conn.execute(text("CREATE SCHEMA from_metadata"))
        meta = Tables("from_metadata.scheduled_tasks").meta
        await conn.run_sync(meta.create_all)
    from_migration = await _describe(engine, "migrated")
    from_metadata = await _describe(engine, "from_metadata")
    assert from_migration == from_create_schema
    assert from_metadata == from_create_schema
    assert set(from_create_schema) == set(metadata.tables) == TABLES
    tasks = from_create_schema["scheduled_tasks"]
    assert tasks["pk"] == ["task_name", "task_instance"]
    assert set(tasks["indexes"]) == {
        "execution_time_idx",
        "last_heartbeat_idx",
        "priority_execution_time_idx",
        "ekbatan_task_name_priority_idx",  # ours, V0004
    }
    assert tasks["columns"]["execution_time"] == ("TIMESTAMP", False, None)
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
    assert set(definitions) == {"public", "migrated", "from_metadata"}
    assert len({d.split(" ON ")[1].split(".", 1)[1] for d in definitions.values()}) == 1
    assert (
        'task_name COLLATE "C", COALESCE((priority)::integer, 32768), execution_time'
        in (definitions["public"])
    )
    assert scheduled_tasks in metadata.tables.values()


async def test_create_schema_names_a_renamed_table_and_its_indexes_as_the_metadata_does(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        await conn.execute(text('CREATE SCHEMA "Jobs"'))
        await conn.execute(text("CREATE SCHEMA from_metadata"))
        await conn.run_sync(Tables("from_metadata.My_tasks").meta.create_all)
    assert await create_schema(engine, "Jobs.My_tasks") is True
    assert await create_schema(engine, "Jobs.My_tasks") is False
    created = await _describe(engine, "Jobs")
    assert created == await _describe(engine, "from_metadata")
    assert set(created) == (TABLES - {"scheduled_tasks"}) | {"My_tasks"}
    assert set(created["My_tasks"]["indexes"]) == {
        "My_tasks_execution_time_idx",
        "My_tasks_last_heartbeat_idx",
        "My_tasks_priority_execution_time_idx",
        "My_tasks_ekbatan_task_name_priority_idx",
    }


async def test_create_schema_adds_only_what_is_missing(engine: AsyncEngine) -> None:
    assert await create_schema(engine) is False
    async with engine.begin() as conn:  # a table from before V0004, and no tables of ours
        await conn.execute(text("DROP INDEX ekbatan_task_name_priority_idx"))
        await conn.execute(text("DROP TABLE ekbatan_jobs"))
    assert await create_schema(engine, operations=False) is True
    before = await _describe(engine, "public")
    assert "ekbatan_task_name_priority_idx" in before["scheduled_tasks"]["indexes"]
    assert "ekbatan_jobs" not in before
    assert await create_schema(engine) is True
    assert set(await _describe(engine, "public")) == TABLES
