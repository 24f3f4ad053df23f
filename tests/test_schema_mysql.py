"""The MySQL/MariaDB migrations (one folder: the same DDL) and the exported MetaData describe
the same tables.

Runs on the server named by EKBATAN_TEST_MYSQL_URL (skipped without it), like
``test_schema.py`` does for PostgreSQL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema, metadata
from ekbatan_fastapi.store.tables import Tables

from .conftest import fresh_mysql_database

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
TABLES = (
    "scheduled_tasks",
    "ekbatan_execution_history",
    "ekbatan_paused_tasks",
    "ekbatan_scheduler_instances",
    "ekbatan_jobs",
    "ekbatan_trace_context",
    "ekbatan_cancel_requests",
    "ekbatan_missed_streaks",
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


async def _state(engine: AsyncEngine) -> tuple[dict[str, Any], dict[str, str]]:
    async with engine.connect() as conn:
        described = await conn.run_sync(_describe)
        ddl = {}
        for table in described:
            create = (await conn.execute(text(f"SHOW CREATE TABLE `{table}`"))).one()[1]
            # the server's own DDL, line by line; index order follows creation order: sorted
            lines = (line.strip().rstrip(",") for line in create.splitlines())
            ddl[table] = "\n".join(sorted(lines))
    return described, ddl


def _statements(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("--")]
    return [s for s in "\n".join(lines).split(";") if s.strip()]


async def _built(url: str, migrations: list[Path] | str) -> tuple[dict[str, Any], dict[str, str]]:
    """The tables made by ``create_schema``, by the exported ``metadata`` or by the files."""
    engine = create_async_engine(url)
    try:
        if migrations == "create_schema":
            assert await create_schema(engine) is True
            assert await create_schema(engine) is False  # idempotent
        elif migrations == "metadata":
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
        else:
            assert isinstance(migrations, list)
            async with engine.begin() as conn:
                for migration in migrations:
                    for statement in _statements(migration):
                        await conn.execute(text(statement))
        return await _state(engine)
    finally:
        await engine.dispose()


def _column(ddl: str, column: str, sql_type: str) -> None:
    line = rf"^`{column}` {re.escape(sql_type)}( DEFAULT NULL)?$"
    assert re.search(line, ddl, re.MULTILINE), (column, ddl)


async def test_migrations_and_metadata_agree(mysql_server_url: str) -> None:
    migrations = sorted((MIGRATIONS / "mysql").glob("V*.sql"))
    assert [m.name[:5] for m in migrations] == [
        "V0001",
        "V0002",
        "V0003",
        "V0004",
        "V0005",
        "V0006",
        "V0007",
    ]
    async with fresh_mysql_database(mysql_server_url) as url:
        from_metadata = await _built(url, "metadata")
    async with fresh_mysql_database(mysql_server_url) as url:
        from_create_schema = await _built(url, "create_schema")
    async with fresh_mysql_database(mysql_server_url) as url:
        from_migration = await _built(url, migrations)
    assert from_migration == from_metadata
    assert from_create_schema == from_migration
    described, ddl = from_metadata
    assert tuple(sorted(described)) == tuple(sorted(TABLES))
    tasks = described["scheduled_tasks"]
    assert tasks["pk"] == ["task_name", "task_instance"]
    assert set(tasks["indexes"]) == {
        "execution_time_idx",
        "last_heartbeat_idx",
        "priority_execution_time_idx",
        "ekbatan_task_name_priority_idx",  # ours, V0004
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
        _column(ddl["scheduled_tasks"], column, sql_type)
    assert (
        "KEY `priority_execution_time_idx` (`priority` DESC,`execution_time`)"
        in ddl["scheduled_tasks"]
    )


async def test_operations_tables_have_the_documented_types(mysql_server_url: str) -> None:
    async with fresh_mysql_database(mysql_server_url) as url:
        described, ddl = await _built(url, sorted((MIGRATIONS / "mysql").glob("V*.sql")))
    history = ddl["ekbatan_execution_history"]
    for column, sql_type in [
        ("id", "bigint(20) NOT NULL AUTO_INCREMENT"),
        ("task_name", "varchar(100) NOT NULL"),
        ("execution_time", "datetime(6) NOT NULL"),
        ("picked_by", "varchar(50)"),
        ("finished_at", "datetime(6) NOT NULL"),
        ("outcome", "varchar(20) NOT NULL"),
        ("error_class", "varchar(200)"),
        ("error_message", "varchar(2000)"),
    ]:
        _column(history, column, sql_type)
    assert "KEY `ekbatan_history_task_idx` (`task_name`,`id`)" in history
    assert "KEY `ekbatan_history_finished_idx` (`finished_at`)" in history
    _column(ddl["ekbatan_paused_tasks"], "reason", "varchar(1000)")
    _column(ddl["ekbatan_paused_tasks"], "paused_at", "datetime(6) NOT NULL")
    _column(ddl["ekbatan_scheduler_instances"], "host", "varchar(255) NOT NULL")
    _column(ddl["ekbatan_scheduler_instances"], "pid", "int(11) NOT NULL")
    assert described["ekbatan_paused_tasks"]["pk"] == ["task_name"]
    assert described["ekbatan_scheduler_instances"]["pk"] == ["name"]
    assert described["ekbatan_execution_history"]["pk"] == ["id"]


async def test_create_schema_names_a_renamed_table_as_the_metadata_does(
    mysql_server_url: str,
) -> None:
    async with fresh_mysql_database(mysql_server_url) as url:
        engine = create_async_engine(url)
        try:
            assert await create_schema(engine, "My_tasks", operations=False) is True
            assert await create_schema(engine, "My_tasks") is True  # ours, beside it
            created = await _state(engine)
        finally:
            await engine.dispose()
    async with fresh_mysql_database(mysql_server_url) as url:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Tables("My_tasks").meta.create_all)
            from_metadata = await _state(engine)
        finally:
            await engine.dispose()
    assert created == from_metadata
    assert "KEY `My_tasks_ekbatan_task_name_priority_idx`" in created[1]["My_tasks"]
