"""History retention in bounded batches (issue 17, history growth): every expired record goes,
in several short DELETE statements of at most a batch each, oldest first; the fresh ones stay;
the scheduler prunes off the housekeeper's round; the history page and the batches are served
by the history table's indexes (EXPLAIN, PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, event, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.domain.rows import ExecutionRecord
from ekbatan_fastapi.engine import history as history_module
from ekbatan_fastapi.engine.history import HistoryRecorder
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.operations import OperationsStore

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, wait_until


def _record(name: str, finished: datetime, n: int) -> ExecutionRecord:
    return ExecutionRecord(
        task_name=name,
        task_instance=f"i{n}",
        execution_time=finished,
        picked_by="me",
        started_at=finished - timedelta(milliseconds=5),
        finished_at=finished,
        outcome="succeeded",
        error_class=None,
        error_message=None,
    )


def _records(expired: int, fresh: int, *, ties: int = 0) -> list[ExecutionRecord]:
    """``expired`` records finished 8-9 days ago (one second apart, the last ``ties`` of them
    at the same instant), then ``fresh`` ones finished within the last hour."""
    now = datetime.now(UTC)
    old = now - timedelta(days=9)
    out = []
    for n in range(expired):
        at = old + timedelta(seconds=min(n, expired - ties))
        out.append(_record(f"job-{n % 3}", at, n))
    for n in range(fresh):
        out.append(_record(f"job-{n % 3}", now - timedelta(minutes=n + 1), expired + n))
    return out


@pytest.fixture
def deletes(any_engine: AsyncEngine) -> Iterator[list[str]]:
    """The DELETE statements sent on ``any_engine``."""
    sent: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            sent.append(statement)

    event.listen(any_engine.sync_engine, "before_cursor_execute", seen)
    yield sent
    event.remove(any_engine.sync_engine, "before_cursor_execute", seen)


def _ops(engine: AsyncEngine, database: Database) -> OperationsStore:
    return open_store(engine, database.dialect).operations


async def _count(ops: OperationsStore) -> int:
    h = ops.tables.history
    return int((await ops.db.rows(select(func.count()).select_from(h)))[0][0])


async def test_retention_deletes_every_expired_record_in_bounded_batches(
    any_database: Database,
    any_engine: AsyncEngine,
    deletes: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(history_module, "PRUNE_PAUSE", 0.0)
    ops = _ops(any_engine, any_database)
    await ops.insert_history(_records(23, 7))
    recorder = HistoryRecorder(
        ops, "me", history=True, retention=timedelta(days=7), on_db_error=lambda e, w: None
    )
    batches: list[int] = []
    pruned = await recorder.prune(batch_size=5, on_batch=lambda n, took: batches.append(n))
    assert pruned == 23
    assert batches == [5, 5, 5, 5, 3], "four full batches, then the rest"
    assert len(deletes) == 5, "one DELETE per batch, each its own statement"
    assert await _count(ops) == 7
    left = await ops.history(None, limit=100)
    cutoff = datetime.now(UTC) - timedelta(days=7)
    assert all(r.finished_at > cutoff for r in left), "only the fresh records stay"
    assert await recorder.prune(batch_size=5) == 0, "nothing left to prune"


async def test_retention_takes_ties_at_a_batch_edge_and_ends(
    any_database: Database, any_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records finished at the same instant as a batch's edge go with that batch (no record
    is left behind an edge), and the prune ends: the last batch finds nothing past the edge."""
    monkeypatch.setattr(history_module, "PRUNE_PAUSE", 0.0)
    ops = _ops(any_engine, any_database)
    await ops.insert_history(_records(12, 2, ties=6))  # records 6-11 finished together
    recorder = HistoryRecorder(
        ops, "me", history=True, retention=timedelta(days=7), on_db_error=lambda e, w: None
    )
    batches: list[int] = []
    assert await recorder.prune(batch_size=4, on_batch=lambda n, took: batches.append(n)) == 12
    assert batches == [4, 8, 0], "the second batch's edge is the tied instant: all six go"
    assert await _count(ops) == 2


async def test_the_scheduler_prunes_the_history_off_the_housekeepers_round(
    any_database: Database, any_engine: AsyncEngine, any_registries: RegistryFactory
) -> None:
    ops = _ops(any_engine, any_database)
    await ops.insert_history(_records(30, 0))
    job = RecordingJob("kept", Schedules.fixed_delay(timedelta(hours=1)))
    registry = await any_registries.start(job)
    assert "history retention" in registry.scheduler.lifecycle.tasks

    async def only_fresh() -> bool:
        h = ops.tables.history
        old = datetime.now(UTC) - timedelta(days=7)
        rows = await ops.db.rows(select(func.count()).where(h.c.finished_at < old))
        return int(rows[0][0]) == 0

    await wait_until(only_fresh, what="the expired records pruned")
    await wait_until(lambda: len(job.slots) >= 1, what="the job's run")


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


async def _explain(engine: AsyncEngine, sql: str) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        raw = (await conn.execute(text(f"EXPLAIN (FORMAT JSON) {sql}"))).scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return list(_plan_nodes(plan))


async def _explain_generic(engine: AsyncEngine, stmt: Any) -> list[dict[str, Any]]:
    """The plan PostgreSQL keeps for the prepared statement whatever the values."""
    compiled = stmt.compile(engine.sync_engine)
    values = ", ".join(repr(compiled.params[key]) for key in compiled.positiontup).replace('"', "'")
    async with engine.connect() as conn:
        await conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        await conn.execute(text(f"PREPARE page AS {compiled}"))
        raw = (
            await conn.execute(text(f"EXPLAIN (FORMAT JSON) EXECUTE page ({values})"))
        ).scalar_one()
        await conn.execute(text("DEALLOCATE page"))
        await conn.execute(text("RESET plan_cache_mode"))
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return list(_plan_nodes(plan))


def _literal(engine: AsyncEngine, stmt: Any) -> str:
    return str(stmt.compile(engine.sync_engine, compile_kwargs={"literal_binds": True}))


async def test_history_page_and_retention_batches_use_the_history_indexes(
    engine: AsyncEngine,
) -> None:
    """PostgreSQL, 60,000 records of 30 names over 60 days and 50 of a rare name before them
    (analyzed): a page of one name reads ``ekbatan_history_task_idx`` alone (never the primary
    key filtered by name, a walk over the whole table for the rare one), in a custom plan and
    in a generic one; every name's page walks the primary key; a retention batch reads and
    deletes a range of ``ekbatan_history_finished_idx``."""
    async with engine.begin() as conn:
        for name, rows in (("'rare'", 50), ("'job-' || (i % 30)", 60_000)):
            await conn.execute(
                text(
                    "INSERT INTO ekbatan_execution_history (task_name, task_instance,"
                    " execution_time, picked_by, started_at, finished_at, outcome)"
                    f" SELECT {name}, 'recurring', t, 'me', t, t, 'succeeded'"
                    " FROM (SELECT i, now() - interval '60 days' + i * interval '86 seconds'"
                    f" AS t FROM generate_series(1, {rows}) AS i) AS s"
                )
            )
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE ekbatan_execution_history"))
    ops = open_store(engine, "postgresql").operations
    for name, before in (("job-7", None), ("job-7", 30_000), ("rare", None)):
        query = ops.history_query(name, before_id=before)
        for nodes in (
            await _explain(engine, _literal(engine, query)),
            await _explain_generic(engine, query),
        ):
            assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
            used = {n.get("Index Name") for n in nodes if "Index" in n["Node Type"]}
            assert used == {"ekbatan_history_task_idx"}, (name, before, used)
    assert len(await ops.history("rare", limit=10, before_id=20)) == 10
    nodes = await _explain(engine, _literal(engine, ops.history_query(None)))
    assert [
        (n.get("Index Name"), n.get("Scan Direction")) for n in nodes if "Index" in n["Node Type"]
    ] == [("ekbatan_execution_history_pkey", "Backward")]
    h = ops.tables.history
    cutoff = datetime.now(UTC) - timedelta(days=7)
    after = cutoff - timedelta(days=30)
    edge = (
        select(h.c.finished_at)
        .where(h.c.finished_at < cutoff, h.c.finished_at > after)
        .order_by(h.c.finished_at)
        .offset(4999)
        .limit(1)
    )
    batch = delete(h).where(h.c.finished_at > after, h.c.finished_at <= cutoff - timedelta(days=29))
    for sql in (_literal(engine, edge), _literal(engine, batch)):
        nodes = await _explain(engine, sql)
        used = [n.get("Index Name") for n in nodes if "Index" in n["Node Type"]]
        assert used == ["ekbatan_history_finished_idx"], nodes
        assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes


async def test_history_page_reads_the_task_index_on_mysql(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """MySQL/MariaDB (analyzed, 20,000 records of 10 names and 20 of a rare one): a page of
    one name, also half-way down, is read through ``ekbatan_history_task_idx``; asked with
    ``task_name = ? ORDER BY id DESC``, MariaDB 10.11 reads the page half-way down by
    primary-key range, filtering by name (189 ms at 10^6 records, docs/BENCHMARKS.md)."""
    if not any_database.is_mysql:
        pytest.skip("PostgreSQL's plans: test_history_page_and_retention_batches_use_...")
    ops = _ops(any_engine, any_database)
    now = datetime.now(UTC)
    records = [_record("rare", now - timedelta(days=2, seconds=n), n) for n in range(20)]
    records += [
        _record(f"job-{n % 10}", now - timedelta(seconds=20_000 - n), n) for n in range(20_000)
    ]
    for start in range(0, len(records), 5000):
        await ops.insert_history(records[start : start + 5000])
    async with any_engine.connect() as conn:
        await conn.execute(text("ANALYZE TABLE ekbatan_execution_history"))
    for name, before in (("job-3", None), ("job-3", 10_000), ("rare", None)):
        sql = _literal(any_engine, ops.history_query(name, before_id=before))
        async with any_engine.connect() as conn:
            plan = (await conn.execute(text(f"EXPLAIN {sql}"))).mappings().all()
        assert [row["key"] for row in plan] == ["ekbatan_history_task_idx"], (name, before, plan)
        assert len(await ops.history(name, before_id=before)) == (20 if name == "rare" else 50)


async def test_a_batch_size_below_one_is_refused_naming_it() -> None:
    recorder = HistoryRecorder(
        None,  # type: ignore[arg-type]
        "me",
        history=True,
        retention=timedelta(days=7),
        on_db_error=lambda e, w: None,
    )
    with pytest.raises(ValueError, match="batch_size must be a positive number of records, got 0"):
        await recorder.prune(batch_size=0)
