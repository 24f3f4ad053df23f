"""TablesPresence (store/presence.py): lookers that arrive while the first look reads the
catalog get its answer, not "missing" (found by the README's example in the docs suite: a
fresh app's client.history() raised SchemaMissingError on a database with every table)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import create_schema
from ekbatan_fastapi.store.presence import TablesPresence
from ekbatan_fastapi.store.tables import metadata


class _Pool:
    """What TablesPresence uses of a Database: ``connect()`` (here on a plain engine)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def connect(self) -> Any:
        return self.engine.connect()


async def test_lookers_during_the_first_look_get_its_answer(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        await create_schema(engine)
        tables = [metadata.tables[name] for name in ("ekbatan_execution_history",)]
        presence = TablesPresence(_Pool(engine), tables, recheck=30.0)  # type: ignore[arg-type]
        answers = await asyncio.gather(*(presence.look() for _ in range(5)))
        assert answers == [True] * 5
        assert presence.present
    finally:
        await engine.dispose()


async def test_missing_tables_are_looked_for_again_only_after_the_recheck(
    database_url: str,
) -> None:
    engine = create_async_engine(database_url)
    try:
        tables = [metadata.tables["ekbatan_execution_history"]]
        presence = TablesPresence(_Pool(engine), tables, recheck=30.0)  # type: ignore[arg-type]
        assert await asyncio.gather(presence.look(), presence.look()) == [False, False]
        await create_schema(engine)
        assert not await presence.look()  # within the recheck: not read again
        assert await presence.look(force=True)
    finally:
        await engine.dispose()
