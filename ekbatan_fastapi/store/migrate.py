"""Applies the SQL migrations shipped in ``ekbatan_fastapi/migrations/<dialect>/`` (what
``ekbatan-jobs migrate`` runs), recording each one in ``ekbatan_schema_migrations``.

Idempotent, and at home on a database prepared another way: a migration whose tables all
exist already (made by ``create_schema``, by hand, or by Flyway from the same files) is
recorded as ``baseline`` without running anything; one whose tables exist in part gets only
the statements of its missing tables. Concurrent runs (several pods migrating at once) are
serialized by a database lock: on PostgreSQL ``pg_advisory_xact_lock``, taken by every
transaction (a lock that cannot outlive it, also behind a transaction-pooling PgBouncer), on
MySQL/MariaDB ``GET_LOCK``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, inspect, select
from sqlalchemy import text as sql_text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..domain.errors import EkbatanError
from .dialects import dialect as dialect_named
from .locks import lock_name, lock_scope
from .tables import timestamp

__all__ = [
    "MIGRATIONS_TABLE",
    "Migration",
    "MigrationError",
    "MigrationResult",
    "available_migrations",
    "migrate",
    "migrations_folder",
]

MIGRATIONS_TABLE = "ekbatan_schema_migrations"
_FILE = re.compile(r"^V(\d{4})__(\w+)\.sql$")
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?", re.I)
_CREATE_INDEX = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+.*?\bON\s+`?(\w+)`?", re.I | re.S)
_INDEX_NAME = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?\s+ON\s+`?(\w+)`?", re.I
)
_LOCK_NAME = "schema-migrations"
"""The MySQL/MariaDB lock of migrations, in the database migrated (``locks.lock_name``)."""
_LOCK_KEY = 0x656B6261  # "ekba": the advisory lock key of migrations on PostgreSQL

_meta = MetaData()
_history = Table(
    MIGRATIONS_TABLE,
    _meta,
    Column("version", Integer(), primary_key=True, autoincrement=False),
    Column("description", String(200), nullable=False),
    Column("checksum", String(64), nullable=False),
    Column("applied_at", timestamp(), nullable=False),
    Column("kind", String(20), nullable=False),
)


class MigrationError(EkbatanError):
    """A migration could not be applied (the message names it and the statement)."""


@dataclass(frozen=True)
class Migration:
    """One ``V000N__description.sql`` file."""

    version: int
    description: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def statements(self) -> list[str]:
        lines = [line for line in self.sql.splitlines() if not line.lstrip().startswith("--")]
        return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]

    @property
    def tables(self) -> list[str]:
        """The tables this migration creates, in order."""
        return [m[1] for s in self.statements if (m := _CREATE_TABLE.match(s))]

    @property
    def objects(self) -> list[str]:
        """What it creates: its tables, and ``table.index`` for an index on a table of an
        earlier migration (V0004)."""
        tables = self.tables
        indexes = [
            f"{m[2]}.{m[1]}"
            for s in self.statements
            if (m := _INDEX_NAME.match(s)) and m[2] not in tables
        ]
        return [*tables, *indexes]


@dataclass(frozen=True)
class MigrationResult:
    version: int
    description: str
    status: str
    """``applied`` (ran now), ``baseline`` (its tables existed: recorded only), ``partial``
    (only the statements of its missing tables ran), ``up-to-date`` (recorded before), or
    ``pending`` (a dry run)."""
    checksum_changed: bool = False
    """Recorded before with another checksum: the shipped file has changed since."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrations_folder(dialect: str) -> str:
    """The folder under ``migrations/`` of a dialect (``mysql5`` shares ``mysql``'s)."""
    return dialect_named(dialect).migrations_folder


def available_migrations(dialect: str) -> list[Migration]:
    """The migrations shipped inside the package for ``dialect``, by version."""
    folder = resources.files("ekbatan_fastapi").joinpath("migrations", migrations_folder(dialect))
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            description = match[2].replace("_", " ")
            found.append(Migration(int(match[1]), description, entry.read_text(encoding="utf-8")))
    if not found:
        raise MigrationError(f"no migration files found in {folder} (a broken installation?)")
    return sorted(found, key=lambda m: m.version)


def _targets(statement: str) -> set[str]:
    """The objects a statement belongs to: its table, and the index it creates."""
    index = _INDEX_NAME.match(statement)
    match = _CREATE_TABLE.match(statement) or _CREATE_INDEX.match(statement)
    found = {match[1]} if match else set()
    return found | ({f"{index[2]}.{index[1]}"} if index else set())


async def _session_lock(conn: AsyncConnection, unlock: bool = False) -> None:
    """MySQL/MariaDB: a named session lock, so that concurrent runs on one database take
    turns (runs on other databases of the server do not wait for it)."""
    name = lock_name(_LOCK_NAME, lock_scope(conn))
    if unlock:
        await conn.execute(sql_text("SELECT RELEASE_LOCK(:name)"), {"name": name})
    else:
        got = await conn.scalar(sql_text("SELECT GET_LOCK(:name, 60)"), {"name": name})
        if got != 1:
            raise MigrationError("another migration held the lock for over 60 s; try again")
    await conn.commit()


async def _transaction_lock(conn: AsyncConnection) -> None:
    """PostgreSQL: a lock that ends with the transaction. A session lock would be taken on
    one server connection and, behind a transaction-pooling PgBouncer, released on another:
    it would stay held on a pooled connection and every later run would wait for it."""
    await conn.execute(sql_text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})


def _existing_tables(sync_conn: Any) -> set[str]:
    """The tables, and ``table.index`` for each of their indexes."""
    inspector = inspect(sync_conn)
    tables = set(inspector.get_table_names())
    indexes = {f"{t}.{i['name']}" for t in tables for i in inspector.get_indexes(t)}
    return tables | indexes


async def migrate(
    engine: AsyncEngine, dialect: str, *, dry_run: bool = False
) -> list[MigrationResult]:
    """Apply what is missing of ``dialect``'s migrations; one result per migration."""
    migrations = available_migrations(dialect)
    async with engine.connect() as conn:
        if dialect_named(dialect).migrations_folder == "postgresql":
            return await _migrate(conn, migrations, dry_run, lock=_transaction_lock)
        await _session_lock(conn)
        try:
            return await _migrate(conn, migrations, dry_run, lock=None)
        finally:
            await conn.rollback()
            await _session_lock(conn, unlock=True)


Lock = Callable[[AsyncConnection], Awaitable[None]]


async def _state(conn: AsyncConnection, lock: Lock | None) -> tuple[set[str], dict[int, str]]:
    """Begin a transaction (under ``lock``): the tables that exist and the recorded
    migrations (version -> checksum)."""
    if lock is not None:
        await lock(conn)
    existing = await conn.run_sync(_existing_tables)
    recorded: dict[int, str] = {}
    if MIGRATIONS_TABLE in existing:
        rows = await conn.execute(select(_history.c.version, _history.c.checksum))
        recorded = {int(r.version): str(r.checksum) for r in rows}
    return existing, recorded


async def _migrate(
    conn: AsyncConnection, migrations: Sequence[Migration], dry_run: bool, lock: Lock | None
) -> list[MigrationResult]:
    existing, recorded = await _state(conn, lock)
    if MIGRATIONS_TABLE not in existing and not dry_run:
        await conn.run_sync(lambda sync: _meta.create_all(sync, tables=[_history]))
    await conn.commit()
    results = []
    for migration in migrations:
        if migration.version in recorded:
            changed = recorded[migration.version] != migration.checksum
            results.append(_result(migration, "up-to-date", changed))
            continue
        if dry_run:
            status = _status(migration, existing)
            results.append(_result(migration, status if status == "baseline" else "pending"))
            continue
        # One transaction per migration: atomic on PostgreSQL, whose DDL is transactional
        # (and under its lock, the state read again: a concurrent run may have applied it).
        # MySQL/MariaDB commit each DDL statement implicitly, so a failure there leaves the
        # tables made so far, and a rerun completes the migration ("partial").
        try:
            if lock is not None:
                existing, now_recorded = await _state(conn, lock)
                if migration.version in now_recorded:
                    await conn.commit()
                    results.append(_result(migration, "up-to-date"))
                    continue
            status = _status(migration, existing)
            present = {t for t in migration.objects if t in existing}
            for statement in migration.statements:
                if not _targets(statement) & present:
                    await _execute(conn, migration, statement)
            await conn.execute(
                insert(_history).values(
                    version=migration.version,
                    description=migration.description[:200],
                    checksum=migration.checksum,
                    applied_at=datetime.now(UTC),
                    kind=status,
                )
            )
            await conn.commit()
        except BaseException:
            await conn.rollback()
            raise
        existing |= set(migration.objects)
        results.append(_result(migration, status))
    return results


def _status(migration: Migration, existing: set[str]) -> str:
    present = {t for t in migration.objects if t in existing}
    if present and len(present) == len(migration.objects):
        return "baseline"
    return "partial" if present else "applied"


async def _execute(conn: AsyncConnection, migration: Migration, statement: str) -> None:
    try:
        await conn.execute(sql_text(statement))
    except Exception as error:
        first_line = statement.splitlines()[0]
        raise MigrationError(
            f"V{migration.version:04d} ({migration.description}) failed at {first_line!r}: "
            f"{getattr(error, 'orig', None) or error}"
        ) from error


def _result(migration: Migration, status: str, changed: bool = False) -> MigrationResult:
    return MigrationResult(migration.version, migration.description, status, changed)
