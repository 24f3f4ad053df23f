"""MySQL/MariaDB: the statements that read rows by their keys are planned on the primary key
alone (``statements.BY_KEY``; MariaDB's optimizer spent 2.5-5 ms per claim or completion of 50
keys weighing ``ekbatan_task_name_priority_idx``), and the hot path goes past SQLAlchemy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi.domain.rows import Finish, FinishKind, NewTask, Owned, PollingStrategy
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.mysql import statements as mq
from ekbatan_fastapi.store.mysql.tasks import owned_params

from .conftest import Database
from .helpers import is_mysql

T = "scheduled_tasks"
KEYED = {
    "claim": mq.claim(T),
    "delete_owned": mq.delete_owned(T),
    "release": mq.release(T),
    "heartbeat": mq.heartbeat(T),
    "heartbeat_keys": mq.heartbeat_keys(T),
    "lock_owned": mq.lock_owned(T),
    "lock_keys": mq.lock_keys(T),
    "lock_beating": mq.lock_beating(T),
    "still_owned": mq.still_owned(T),
    "existing": mq.existing(T),
}


class _Sent:
    """The names of the statements a store sent to the driver (its ``on_statement``)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str, sql: str) -> None:
        self.names.append(name)


async def _rows(store: Any, n: int) -> list[tuple[str, str, int]]:
    now = await store.db_now()
    await store.insert_missing(
        [NewTask("k", f"i{i:03d}", now - timedelta(seconds=1)) for i in range(n)]
    )
    return [("k", f"i{i:03d}", 1) for i in range(n)]


@pytest.mark.parametrize("name", list(KEYED))
async def test_keyed_statements_use_only_the_primary_key(
    any_database: Database, any_engine: AsyncEngine, name: str
) -> None:
    if not is_mysql(any_engine):
        pytest.skip("MySQL/MariaDB statements")
    store: Any = open_store(any_engine, any_database.dialect).tasks
    owned = await _rows(store, 300)
    params = owned_params(owned[:50]) | {"picked_by": "me", "now": None}
    params |= {"name": "k", "instances": [i for _, i, _ in owned[:50]]}
    async with any_engine.connect() as conn:
        plan = [
            r._mapping for r in await conn.execute(store.db.sql("EXPLAIN " + KEYED[name]), params)
        ]
        await conn.rollback()
    assert [(r["key"], r["possible_keys"]) for r in plan] == [("PRIMARY", "PRIMARY")], plan


async def test_hot_statements_go_to_the_driver(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    if not is_mysql(any_engine):
        pytest.skip("MySQL/MariaDB statements")
    store: Any = open_store(any_engine, any_database.dialect).tasks
    await _rows(store, 5)
    strategy = (
        PollingStrategy.LOCK_AND_FETCH if store.supports_skip_locked else PollingStrategy.FETCH
    )
    sent = store.on_statement = _Sent()
    claimed = (await store.poll(["k"], 10, "me", strategy)).claimed
    owned = [Owned(r.task_name, r.task_instance, r.version) for r in claimed]
    assert await store.heartbeat(owned) == {o.key for o in owned}
    done = await store.finish([Finish(o, FinishKind.DELETED) for o in owned])
    assert done == {o.key for o in owned} and len(owned) == 5
    if store.supports_skip_locked:  # lock, claim, clock; lock the owned rows, beat them
        assert sent.names == ["poll", "claim", "poll", "heartbeat", "heartbeat", "finish"]
    else:  # MySQL 5: the fetch strategy's claim through SQLAlchemy; one plain heartbeat
        assert sent.names == ["heartbeat", "finish"]
