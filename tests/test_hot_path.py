"""PostgreSQL's hot path: the connections the busy loops hold, what happens when one of them
dies, and the execution history written by the completion statement itself."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    Schedule,
    Schedules,
    create_schema,
)
from ekbatan_fastapi.domain.rows import ExecutionRecord, Finish, FinishKind, Owned, TaskRow
from ekbatan_fastapi.store.database import Lease
from ekbatan_fastapi.store.dialects import open_store

from .helpers import (
    CountingJob,
    RecordingJob,
    RegistryFactory,
    fail_writes,
    revived_by_a_peer,
    wait_until,
)


def _checked_out(engine: object) -> int:
    return engine.pool.checkedout()  # type: ignore[attr-defined,no-any-return]


async def test_an_idle_scheduler_gives_its_busy_connections_back(
    registries: RegistryFactory,
) -> None:
    job = CountingJob()
    registry = await registries.start(job, customize=lambda b: b.listen(False))
    await registry.client.schedule_many("count", [(f"i{n}", None, None) for n in range(200)])
    await wait_until(lambda: sum(job.runs.values()) == 200, what="the burst")
    # Busy, the poller and the completer each held one; idle, they give them back (after 1 s).
    await wait_until(lambda: _checked_out(registry.engine) == 0, timeout=5, what="returned")


async def test_a_held_connection_that_dies_is_replaced(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restart kills the connections the loops hold: the next statement on each
    fails once, the connection is discarded and the loop goes on with a new one."""
    job = CountingJob()
    registry = await registries.start(
        job, poll=0.05, customize=lambda b: b.listen(False).batch_size(5)
    )
    await registry.client.schedule_many("count", [(f"a{n}", None, None) for n in range(20)])
    await wait_until(lambda: sum(job.runs.values()) == 20, what="the first burst")
    async with engine.connect() as conn:
        killed = (
            await conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        ).scalar_one()
    assert killed >= 1
    async with engine.begin() as conn:  # (the client's pooled connections were killed too)
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "version) SELECT 'count', 'b' || n, now(), false, 1 FROM generate_series(0, 19) n"
            )
        )
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi"):
        await wait_until(lambda: sum(job.runs.values()) == 40, what="the second burst")
    assert all(job.runs[f"b{n}"] == 1 for n in range(20))
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    assert registry.status().database_reachable is True


async def test_a_lease_discards_its_connection_after_an_error(engine: AsyncEngine) -> None:
    lease = Lease(engine)
    first = await lease.driver()
    await lease.discard()
    assert first.is_closed()
    second = await lease.driver()
    assert second is not first and not second.is_closed()
    lease.idle()
    await asyncio.sleep(1.2)  # idle for longer than a lease keeps a connection
    assert _checked_out(engine) == 0
    await lease.release()


async def test_history_of_a_stale_and_a_fresh_result_in_one_completion(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """One completion statement writes both records: the stale result's as superseded (its
    version matches nothing), the fresh one's as succeeded."""
    job = RecordingJob("twice", Schedules.fixed_delay(timedelta(hours=1)))
    registry = await registries.start(job)
    database_back = fail_writes(registry.store.tasks)
    await revived_by_a_peer(registry, "twice", lambda: len(job.slots) >= 2)
    await wait_until(
        lambda: len(registry.scheduler.completer.pending) == 2, what="both results pending"
    )
    database_back()
    await wait_until(lambda: not registry.scheduler.completer.pending, what="the results written")
    outcomes = sorted(r.outcome for r in await registry.client.history("twice"))
    assert outcomes == ["succeeded", "superseded"]


async def test_history_table_dropped_while_running(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """The history goes off with a warning; results are still recorded."""
    job = CountingJob()
    registry = await registries.start(job)
    await registry.client.schedule("count", "before")
    await wait_until(lambda: job.runs["before"] == 1, what="the first run")
    await wait_until(lambda: not registry.scheduler.running, what="recorded")
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE ekbatan_execution_history"))
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        await registry.client.schedule("count", "after")
        await wait_until(lambda: job.runs["after"] == 1, what="the run without history")
        await wait_until(lambda: not registry.scheduler.running, what="recorded anyway")
    assert await registry.client.get("count", "after") is None, "the one-time row was deleted"
    assert any("history table is gone" in r.getMessage() for r in caplog.records)
    await create_schema(engine)  # back, for the fixtures' clean-up


class Raising(DistributedJob):
    """Raises the exception it is given, every run."""

    def __init__(self, name: str, error: BaseException) -> None:
        self._name = name
        self.error = error
        self.runs = 0

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs += 1
        raise self.error


async def test_error_messages_any_database_refuses_are_stored_escaped(
    any_registries: RegistryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NUL (PostgreSQL's text refuses it) or a lone surrogate (not UTF-8: an undecodable
    file name) in an error message must not keep the result from being recorded."""
    # The failures' log records carry the surrogate: kept out of the captured log, which
    # pytest-xdist sends between processes as UTF-8 (it cannot encode a lone surrogate).
    executor_log = logging.getLogger("ekbatan_fastapi.engine.executor")
    monkeypatch.setattr(executor_log, "propagate", False)
    monkeypatch.setattr(executor_log, "handlers", [logging.NullHandler()])
    nul = Raising("nul", ValueError("bad\x00byte"))
    surrogate = Raising("surrogate", FileNotFoundError("no such file: b\udcffd"))
    registry = await any_registries.start(nul, surrogate)

    async def failed(name: str) -> bool:
        task = await registry.client.get(name, "recurring")
        return task is not None and task.consecutive_failures == 1 and not task.picked

    async def written(name: str) -> bool:  # (MySQL/MariaDB write it a moment later)
        return len(await registry.client.history(name)) == 1

    for name in ("nul", "surrogate"):
        await wait_until(lambda n=name: failed(n), what=f"the {name} failure recorded")
        await wait_until(lambda n=name: written(n), what=f"the {name} history")
    (record,) = await registry.client.history("nul")
    assert record.outcome == "failed" and record.error_message == "bad\\x00byte"
    (record,) = await registry.client.history("surrogate")
    assert record.error_message == "no such file: b\\udcffd"


async def test_a_job_raising_cancelled_error_fails_and_frees_its_row(
    any_registries: RegistryFactory,
) -> None:
    job = Raising("cancels", asyncio.CancelledError())
    registry = await any_registries.start(job)

    async def failed() -> bool:
        task = await registry.client.get("cancels", "recurring")
        return task is not None and task.consecutive_failures == 1 and not task.picked

    await wait_until(failed, what="the failure recorded and the row free")
    assert not registry.scheduler.running

    async def written() -> bool:  # (MySQL/MariaDB write it a moment later)
        return len(await registry.client.history("cancels")) == 1

    await wait_until(written, what="the history record")
    (record,) = await registry.client.history("cancels")
    assert record.outcome == "failed" and record.error_class == "CancelledError"


async def test_history_the_database_refuses_does_not_hold_up_the_results(
    registries: RegistryFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    async with engine.begin() as conn:  # a history the database will refuse (23514)
        await conn.execute(
            text(
                "ALTER TABLE ekbatan_execution_history "
                "ADD CONSTRAINT no_failures CHECK (outcome <> 'failed')"
            )
        )
    bad = Raising("refused", RuntimeError("boom"))
    later = CountingJob()
    with caplog.at_level(logging.WARNING, logger="ekbatan_fastapi"):
        registry = await registries.start(bad, later)

        async def recorded() -> bool:
            task = await registry.client.get("refused", "recurring")
            return task is not None and not task.picked and task.consecutive_failures == 1

        await wait_until(recorded, what="the failure recorded without its history")
    assert any("refused the history" in r.getMessage() for r in caplog.records)
    assert await registry.client.history("refused") == []
    await registry.client.schedule("count", "later")  # the next batch has its history again
    await wait_until(lambda: later.runs["later"] == 1, what="a later run")

    async def written() -> bool:
        return len(await registry.client.history("count")) == 1

    await wait_until(written, what="the later run's history")


async def test_a_retried_completion_does_not_write_its_history_twice(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """The first attempt committed but its answer was lost: the retry (retry=True) matches no
    row, and must not add a "superseded" record next to the real one."""
    job = CountingJob()
    registry = registries.build(job)
    repository = registry.store.tasks
    await create_schema(engine)
    await registry.client.schedule("count", "once")
    result = await repository.poll(["count"], 10, "me", "lock-and-fetch")
    (row,) = result.claimed
    finish = Finish(Owned(row.task_name, row.task_instance, row.version), FinishKind.DELETED)
    now = result.db_now
    entry = ExecutionRecord(
        row.task_name, row.task_instance, row.execution_time, "me", now, now,
        "succeeded", None, None, version=row.version,
    )  # fmt: skip
    assert await repository.finish([finish], history=[entry], picked_by="me") == {row.key}
    assert await repository.finish([finish], history=[entry], picked_by="me", retry=True) == set()
    async with engine.connect() as conn:
        outcomes = (
            (await conn.execute(text("SELECT outcome FROM ekbatan_execution_history")))
            .scalars()
            .all()
        )
    assert outcomes == ["succeeded"]
    # Without retry=True a rejected result is a superseded one (its row was revived).
    assert await repository.finish([finish], history=[entry], picked_by="me") == set()
    async with engine.connect() as conn:
        outcomes = (
            (await conn.execute(text("SELECT outcome FROM ekbatan_execution_history ORDER BY id")))
            .scalars()
            .all()
        )
    assert outcomes == ["succeeded", "superseded"]


async def test_a_completion_records_every_shape_of_batch(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    """The completion leaves out what it can (the history's keys when they are the results',
    the kinds when every row is deleted, the outcomes when all succeeded): each shape still
    writes the right rows and records, including a history in another order than the results
    and a batch of mixed kinds and outcomes."""
    registry = registries.build(CountingJob())
    repository = registry.store.tasks
    await create_schema(engine)
    for instance in ("a", "b", "c", "d"):
        await registry.client.schedule("count", instance)
    result = await repository.poll(["count"], 10, "me", "lock-and-fetch")
    rows = sorted(result.claimed, key=lambda r: r.task_instance)
    now = result.db_now

    def owned(row: TaskRow) -> Owned:
        return Owned(row.task_name, row.task_instance, row.version)

    def entry(row: TaskRow, outcome: str, error: str | None = None) -> ExecutionRecord:
        return ExecutionRecord(
            row.task_name, row.task_instance, row.execution_time, "me", now, now, outcome,
            None if error is None else "RuntimeError", error, version=row.version,
        )  # fmt: skip

    a, b, c, d = rows
    later = now + timedelta(hours=1)
    # all deleted, all succeeded, the history in the results' order: the shortest shape
    assert await repository.finish(
        [Finish(owned(a), FinishKind.DELETED)], history=[entry(a, "succeeded")], picked_by="me"
    ) == {a.key}
    # mixed kinds and outcomes, the history in the reverse order of the results
    finishes = [
        Finish(owned(b), FinishKind.FAILED, later),
        Finish(owned(c), FinishKind.DELETED),
        Finish(owned(d), FinishKind.RELEASED),
    ]
    history = [entry(d, "cancelled"), entry(c, "succeeded"), entry(b, "failed", "boom")]
    assert await repository.finish(finishes, history=history, picked_by="me") == {
        b.key,
        c.key,
        d.key,
    }
    async with engine.connect() as conn:
        records = (
            await conn.execute(
                text(
                    "SELECT task_instance, outcome, error_class, error_message "
                    "FROM ekbatan_execution_history ORDER BY task_instance"
                )
            )
        ).all()
        left = (
            await conn.execute(
                text(
                    "SELECT task_instance, picked, consecutive_failures, execution_time "
                    "FROM scheduled_tasks ORDER BY task_instance"
                )
            )
        ).all()
    assert [tuple(r) for r in records] == [
        ("a", "succeeded", None, None),
        ("b", "failed", "RuntimeError", "boom"),
        ("c", "succeeded", None, None),
        ("d", "cancelled", None, None),
    ]
    assert [(r[0], r[1], r[2]) for r in left] == [("b", False, 1), ("d", False, None)]
    assert left[0][3] == later


def test_the_postgresql_dialect_needs_asyncpg() -> None:
    engine = SimpleNamespace(dialect=SimpleNamespace(driver="psycopg"))
    with pytest.raises(ConfigurationError, match=r"postgresql\+asyncpg://"):
        open_store(engine, "postgresql")  # type: ignore[arg-type]
