"""Applies the SQL migrations shipped in ``ekbatan_fastapi/migrations/<dialect>/``: ``migrate``
(what ``ekbatan-jobs migrate`` runs) records each one in ``ekbatan_schema_migrations``;
``create_schema`` applies the same statements to a deployment's table names, recording nothing.

Idempotent, and at home on a database prepared another way: a migration whose tables all
exist already (made by ``create_schema``, by hand, or by Flyway from the same files) is
recorded as ``baseline`` without running anything; one whose tables exist in part gets only
the statements of its missing tables. Concurrent runs (several pods migrating at once) are
serialized by a database lock: on PostgreSQL ``pg_advisory_xact_lock``, taken by every
transaction (a lock that cannot outlive it, also behind a transaction-pooling PgBouncer), on
MySQL/MariaDB ``GET_LOCK``.

On a MariaDB Galera cluster ``GET_LOCK`` holds on one node only: runs on two nodes do not
wait for each other. Galera applies DDL in one total order on every node (TOI), so the tables
stay whole, but the later of two racing runs fails (its ``CREATE TABLE`` finds the table, or
its history row conflicts) and succeeds when run again; a warning says so. Run
``ekbatan-jobs migrate`` once per deployment there (docs/databases.md).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, insert, inspect, select
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..domain.errors import EkbatanError
from ..domain.logs import library_logger
from .dialects import dialect as dialect_named
from .locks import is_galera, lock_name, lock_scope
from .tables import DEFAULT_TABLE_NAME, Tables, timestamp

__all__ = [
    "MIGRATIONS_TABLE",
    "Migration",
    "MigrationError",
    "MigrationResult",
    "available_migrations",
    "create_schema",
    "migrate",
    "migrations_folder",
]

log = library_logger(__name__)

MIGRATIONS_TABLE = "ekbatan_schema_migrations"
_FILE = re.compile(r"V(\d{4})__(\w+)\.sql", re.ASCII)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?", re.I)
_CREATE_INDEX = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+.*?\bON\s+`?(\w+)`?", re.I | re.S)
_INDEX_NAME = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?\s+ON\s+`?(\w+)`?", re.I
)
_LOCK_NAME = "schema-migrations"
"""The MySQL/MariaDB lock of migrations, in the database migrated (``locks.lock_name``)."""
_LOCK_KEY = 0x656B6261  # "ekba": the advisory lock key of migrations on PostgreSQL

_FORMER_CHECKSUMS: dict[str, dict[int, frozenset[str]]] = {
    "mysql": {
        1: frozenset({
            "b268886b6697c8565ca6801d612ce6cdcb6ba9588739e009cb763d4f51829ceb",
            "5271d815aee3058ac03b2e365f155c1b7e82d701896f16e9bfd1195795481bd5",
        }),
        2: frozenset({
            "3c6cb16c066dedff160d24151bbc3a3584f1a9d21f73616b23a6fe5e806a4380",
            "67e9927520e08cc39d6f00103c0629d5e9f676f49f3c433a4ec95b648ca72f02",
        }),
        3: frozenset({
            "25b54bdbdae13edb71a30e2ddc283bb0b4dbfce3c0803886eb483d30e92b6c47",
            "f21be9f8b402456702ece845e36c16f05068fb7d00857f9a5e35e818f9639d39",
        }),
        4: frozenset({
            "230413230e4dcb68538dc6947411cef5183392535a782c4ade0a11e0b55c0b77",
            "a31a55e5df282f3bebcf560378d39f2e70b9ffbfab9bcc20600f3b4e50877020",
        }),
        5: frozenset({
            "0a6e94888e0c5efd54060dd60c13889ccc64c7cd854c2561a123cb6437b298f9",
            "ea7e6221e5b74bac45528bd0fec4fc37ee36099698ead85dab9260864df69814",
        }),
    },
}  # fmt: skip
"""Checksums of files shipped before whose statements are the same as today's (only their
comments differ): recorded by an earlier version, they are not a changed migration. MySQL's:
the earlier ``migrations/mysql/`` files and ``migrations/mariadb/``, their copy but for the
comments (MariaDB uses ``migrations/mysql/`` since)."""

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
    former_checksums: frozenset[str] = frozenset()
    """Checksums of earlier texts of this file with the same statements (``_FORMER_CHECKSUMS``)."""

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def changed_since(self, recorded: str) -> bool:
        """Whether the file changed since it was recorded with checksum ``recorded``."""
        return recorded != self.checksum and recorded not in self.former_checksums

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
    """The folder under ``migrations/`` of a dialect (``mariadb`` and ``mysql5`` share
    ``mysql``'s: the same DDL)."""
    return dialect_named(dialect).migrations_folder


def available_migrations(dialect: str) -> list[Migration]:
    """The migrations shipped inside the package for ``dialect``, by version."""
    name = migrations_folder(dialect)
    folder = resources.files("ekbatan_fastapi").joinpath("migrations", name)
    former = _FORMER_CHECKSUMS.get(name, {})
    found = []
    for entry in folder.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            version, description = int(match[1]), match[2].replace("_", " ")
            sql = entry.read_text(encoding="utf-8")
            found.append(Migration(version, description, sql, former.get(version, frozenset())))
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


def _existing(sync_conn: Connection, tables: Tables) -> set[str]:
    """What exists of ``tables``, by the names the migration files give it: each table, and
    ``table.index`` for each of its indexes."""
    inspector = inspect(sync_conn)
    found = set()
    original = {here: name for name, here in tables.migration_names().items()}
    for name, table in tables.by_migration_name().items():
        if inspector.has_table(table.name, table.schema):
            found.add(name)
            for index in inspector.get_indexes(table.name, table.schema):
                found.add(f"{name}.{original.get(str(index['name']), index['name'])}")
    return found


def _missing(migration: Migration, existing: set[str]) -> list[str]:
    """The statements of ``migration`` whose objects are missing from ``existing``."""
    present = {t for t in migration.objects if t in existing}
    return [s for s in migration.statements if not _targets(s) & present]


def _identifiers(tables: Tables, dialect: Dialect) -> Callable[[str], str]:
    """A migration's statement -> the same on ``tables``: db-scheduler's table and its indexes
    under their names there, every table in its schema, quoted as ``dialect`` needs."""
    quote = dialect.identifier_preparer
    tables_by_name = tables.by_migration_name()
    names = {
        name: quote.format_table(tables_by_name[name])
        if name in tables_by_name
        else quote.quote(here)
        for name, here in tables.migration_names().items()
    }
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return lambda statement: pattern.sub(lambda m: names[m[1]], statement)


async def create_schema(
    engine: AsyncEngine, table_name: str = DEFAULT_TABLE_NAME, *, operations: bool = True
) -> bool:
    """Create db-scheduler's table under ``table_name`` and (unless ``operations=False``) our
    own tables in its schema (execution history, paused tasks, scheduler instances, job
    definitions, trace contexts), each only if it is missing. True if anything was created.

    It runs the statements of the migrations ``migrate`` applies (``migrations/<dialect>/``)
    whose tables are missing, with db-scheduler's table and its indexes named as
    ``table_name`` says; on a ``scheduled_tasks`` made before V0004, our index is added. It
    records nothing in ``ekbatan_schema_migrations``: ``ekbatan-jobs migrate`` later finds the
    tables and records them as ``baseline``.
    """
    tables = Tables(table_name)
    migrations = available_migrations(engine.dialect.name)
    if not operations:  # the migrations of db-scheduler's table (V0001) and its index (V0004)
        migrations = [
            m for m in migrations if {o.split(".")[0] for o in m.objects} == {DEFAULT_TABLE_NAME}
        ]
    named = _identifiers(tables, engine.dialect)

    def create(sync_conn: Connection) -> bool:
        existing = _existing(sync_conn, tables)
        created = False
        for migration in migrations:
            for statement in _missing(migration, existing):
                sync_conn.execute(sql_text(named(statement)))
                created = True
        return created

    async with engine.begin() as conn:
        return await conn.run_sync(create)


async def migrate(
    engine: AsyncEngine, dialect: str, *, dry_run: bool = False
) -> list[MigrationResult]:
    """Apply what is missing of ``dialect``'s migrations; one result per migration."""
    migrations = available_migrations(dialect)
    async with engine.connect() as conn:
        if dialect_named(dialect).migrations_folder == "postgresql":
            return await _migrate(conn, migrations, dry_run, lock=_transaction_lock)
        if await is_galera(conn):
            log.warning(
                "migrating a MariaDB Galera cluster: the migration lock (GET_LOCK) holds on "
                "this node only; a run on another node at the same time fails and succeeds "
                "when run again (run migrations once per deployment)"
            )
        await _session_lock(conn)
        try:
            return await _migrate(conn, migrations, dry_run, lock=None)
        finally:
            await conn.rollback()
            await _session_lock(conn, unlock=True)


Lock = Callable[[AsyncConnection], Awaitable[None]]


def _existing_for_migrate(sync_conn: Connection) -> set[str]:
    """What exists of db-scheduler's table under its own name and ours, and whether
    ``ekbatan_schema_migrations`` does."""
    found = _existing(sync_conn, Tables())
    return found | ({MIGRATIONS_TABLE} if inspect(sync_conn).has_table(MIGRATIONS_TABLE) else set())


async def _state(conn: AsyncConnection, lock: Lock | None) -> tuple[set[str], dict[int, str]]:
    """Begin a transaction (under ``lock``): the tables that exist and the recorded
    migrations (version -> checksum)."""
    if lock is not None:
        await lock(conn)
    existing = await conn.run_sync(_existing_for_migrate)
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
            changed = migration.changed_since(recorded[migration.version])
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
            for statement in _missing(migration, existing):
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
