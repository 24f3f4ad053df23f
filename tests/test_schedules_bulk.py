"""``create_schedules`` in bulk: its rows are ``create_schedule``'s byte for byte, a bad row
anywhere writes nothing, and the statements' batching boundaries (rows per PostgreSQL
statement; text per MySQL/MariaDB ``INSERT``, instance ids per existence read) lose and
double nothing, on every database of the suite, in the caller's transaction too."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    ScheduleError,
    Schedules,
    TaskDataInvalid,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.codec import _constant, _finite, _loads
from ekbatan_fastapi.domain.persistent import PLAIN_TAIL, ScheduleSpec
from ekbatan_fastapi.domain.rows import NewTask
from ekbatan_fastapi.domain.schedules import parse_schedule
from ekbatan_fastapi.store.mysql import statements as mq
from ekbatan_fastapi.store.mysql import tasks as mysql_tasks
from ekbatan_fastapi.store.postgresql import tasks as pg_tasks

from .helpers import RegistryFactory, is_mysql
from .test_persistent_schedules import Digest, DigestData, Untyped

T = scheduled_tasks


class Note(BaseModel):
    text: str
    weight: float = 1.5


def _far_daily() -> Any:
    """Daily, 6 hours from now: one first slot for every row made within the test."""
    at = (datetime.now(UTC) + timedelta(hours=6)).time().replace(microsecond=0)
    return Schedules.daily(time(at.hour, at.minute, at.second))


async def _rows(engine: AsyncEngine, name: str) -> dict[str, tuple[bytes, datetime]]:
    async with engine.connect() as conn:
        found = await conn.execute(
            select(T.c.task_instance, T.c.task_data, T.c.execution_time).where(
                T.c.task_name == name
            )
        )
        return {r[0]: (bytes(r[1]), r[2]) for r in found}


async def _count(engine: AsyncEngine, name: str) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(T).where(T.c.task_name == name)
        return int((await conn.execute(query)).scalar_one())


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statements of a few rows each: 7 rows per PostgreSQL statement, about 600 characters
    per MySQL/MariaDB ``INSERT`` (3-4 rows), 7 instance ids per existence read."""
    monkeypatch.setattr(pg_tasks, "_INSERT_ROWS", 7)
    monkeypatch.setattr(mysql_tasks, "_INSERT_TEXT", 600)
    monkeypatch.setattr(mq, "EXISTING_MAX", 7)


async def test_bulk_rows_are_create_schedules_byte_for_byte(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """Each schedule's first row is made the whole way, the next ones from its cached head
    and first slot: every row equals the one ``create_schedule`` writes (data of every JSON
    kind, a model for an untyped job, None, a shared ``Schedule``, strings, jitter)."""
    registry = any_registries.build(Digest(), Untyped())
    c = registry.client
    daily, yearly = _far_daily(), "CRON|0 0 1 1 *|Europe/Berlin"
    jittered = daily.with_jitter(timedelta(minutes=5))
    datas: list[Any] = [
        {"user_id": 1},
        None,
        [1, 2.5, "ü", {"a": None}],
        'text \u2603 "quoted" \\ back',
        Note(text="n"),
        {"nested": {"deep": [True, False, 10**20]}},
    ]
    items = [
        (f"{kind}-{i}", schedule, data)
        for kind, schedule in (("daily", daily), ("yearly", yearly), ("jitter", jittered))
        for i, data in enumerate(datas)
    ]
    assert await c.create_schedules("untyped", [(f"bulk-{i}", s, d) for i, s, d in items]) == 18
    for i, s, d in items:
        assert await c.create_schedule("untyped", f"one-{i}", s, d)
    per_row = [(f"per-row-{i}", _far_daily(), {"i": i}) for i in range(3)]  # equal, not one
    assert await c.create_schedules("untyped", [(f"bulk-{i}", s, d) for i, s, d in per_row]) == 3
    for i, s, d in per_row:
        assert await c.create_schedule("untyped", f"one-{i}", s, d)
    items += per_row
    typed = [(f"t{i}", daily, {"user_id": i, "lang": "de"}) for i in range(3)]
    typed.append(("t-model", yearly, DigestData(user_id=9)))
    assert await c.create_schedules("digest", [(f"bulk-{i}", s, d) for i, s, d in typed]) == 4
    for i, s, d in typed:
        await c.create_schedule("digest", f"one-{i}", s, d)
    for name, keys in (("untyped", [i for i, _, _ in items]), ("digest", [i for i, _, _ in typed])):
        rows = await _rows(any_engine, name)
        for key in keys:
            bulk, one = rows[f"bulk-{key}"], rows[f"one-{key}"]
            assert bulk[0] == one[0], key
            if not key.startswith("jitter"):  # jitter: each row's own offset
                assert bulk[1] == one[1], key


async def test_a_bad_row_anywhere_writes_nothing(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """A bad value in the 1,700th of 3,000 rows, or the last: the error names the field and
    the row (as ``create_schedule``'s does), and no row is written."""
    registry = any_registries.build(Digest(), Untyped())
    c = registry.client
    daily = _far_daily()
    good = [(f"u{i}", daily, {"user_id": i}) for i in range(3000)]

    def spoiled(at: int, value: tuple[str, Any, Any]) -> list[tuple[str, Any, Any]]:
        return [*good[:at], value, *good[at + 1 :]]

    with pytest.raises(TaskDataInvalid, match=r"digest/u1700.*user_id"):
        await c.create_schedules("digest", spoiled(1700, ("u1700", daily, {"user_id": "x"})))
    with pytest.raises(ScheduleError, match=r"digest/u2999.*CRON"):
        await c.create_schedules("digest", spoiled(2999, ("u2999", "CRON|61 * * * *", {})))
    with pytest.raises(ConfigurationError, match="instance id"):
        await c.create_schedules("digest", spoiled(1200, (" ", daily, {"user_id": 1})))
    nan = spoiled(5, ("u5", daily, {"x": [float("nan")]}))
    with pytest.raises(ConfigurationError) as bulk_error:
        await c.create_schedules("untyped", nan)
    with pytest.raises(ConfigurationError) as one_error:
        await c.create_schedule("untyped", "u5", daily, {"x": [float("nan")]})
    assert str(bulk_error.value) == str(one_error.value)  # worded alike: "at data.x.0"
    assert await _count(any_engine, "digest") == 0
    assert await _count(any_engine, "untyped") == 0


@pytest.mark.usefixtures("small_batches")
async def test_batching_boundaries_lose_and_double_nothing(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    """50 rows in statements of a few rows, 10 of them existing already (left alone, not
    counted), a key given twice (the first wins); then in the caller's transaction: rolled
    back it leaves nothing, committed it counts exactly what it added."""
    registry = any_registries.build(Untyped())
    c = registry.client
    daily = _far_daily()
    existing = [(f"u{i:02}", daily, {"old": i}) for i in range(0, 50, 5)]
    assert await c.create_schedules("untyped", existing) == 10
    items = [(f"u{i:02}", daily, {"new": i}) for i in range(50)]
    items.append(("u01", daily, {"second": True}))
    assert await c.create_schedules("untyped", items) == 40
    rows = await _rows(any_engine, "untyped")
    assert len(rows) == 50
    for i in range(50):
        data = json.loads(rows[f"u{i:02}"][0])["data"]
        assert data == ({"old": i} if i % 5 == 0 else {"new": i})

    more = [(f"v{i:02}", daily, {"i": i}) for i in range(30)] + items[:5]
    async with registry.engine.connect() as conn:
        trans = await conn.begin()
        assert await c.create_schedules("untyped", more, connection=conn) == 30
        await trans.rollback()
    assert await _count(any_engine, "untyped") == 50
    async with registry.engine.begin() as conn:
        assert await c.create_schedules("untyped", more, connection=conn) == 30
    assert await _count(any_engine, "untyped") == 80


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("in_transaction", [False, True])
async def test_a_key_that_collides_under_the_collation_in_a_later_statement(
    any_registries: RegistryFactory, any_engine: AsyncEngine, in_transaction: bool
) -> None:
    """MySQL/MariaDB compare keys under the column's collation: ``U-A`` is ``u-a``, which
    the existence read does not report as ``U-A``. Its multi-row INSERT fails on the
    duplicate key; the rows before it stand (in the caller's transaction) or the whole is
    tried again, and its rows go one by one: every other row is written and counted once.
    (PostgreSQL compares bytes: ``U-A`` is a row of its own.)"""
    registry = any_registries.build(Untyped())
    c = registry.client
    daily = _far_daily()
    assert await c.create_schedule("untyped", "u-a", daily, {"old": True})
    items = [(f"u{i:02}", daily, {"i": i}) for i in range(40)]
    items.insert(25, ("U-A", daily, {"new": True}))
    expected = 40 if is_mysql(any_engine) else 41
    if in_transaction:
        async with registry.engine.begin() as conn:
            assert await c.create_schedules("untyped", items, connection=conn) == expected
    else:
        assert await c.create_schedules("untyped", items) == expected
    rows = await _rows(any_engine, "untyped")
    assert len(rows) == expected + 1
    assert all(f"u{i:02}" in rows for i in range(40))
    stored = rows["u-a"] if "u-a" in rows else rows["U-A"]
    assert json.loads(stored[0])["data"] == {"old": True} or not is_mysql(any_engine)


async def test_insert_texts_split_under_their_size_in_order() -> None:
    """The MySQL/MariaDB ``INSERT`` texts: at most ``_INSERT_TEXT`` characters (a longer row
    alone), every row once and in order, a row without a time due at ``now``, each name and
    time written once."""
    from asyncmy.connection import Connection

    driver: Any = Connection(host="127.0.0.1")  # never connected: it only escapes
    at = datetime(2027, 1, 1, 7, 30, tzinfo=UTC)
    now = datetime(2026, 12, 5, 12, 0, 0, 123456)
    tasks = [NewTask("job", f"i{i:03}", at, b'{"i":%d}' % i, 0) for i in range(100)]
    tasks[40] = NewTask("job", "big", at, b"x" * 5000, None)
    tasks[41] = NewTask("job", "o'clock", None, None, 3)
    limit = 1000
    texts = list(_texts(driver, tasks, now, limit))
    assert sum(count for _, count in texts) == 100
    for text, count in texts:
        assert text.startswith("INSERT INTO `t` (" + mq.INSERT_COLUMNS + ") VALUES (")
        assert len(text) <= limit or count == 1
        assert text.count("),(") + 1 == count
    joined = "".join(text for text, _ in texts)
    order = [joined.index(f"'{t.task_instance}'" if "'" not in t.task_instance else "'o\\'clock'")
             for t in tasks]  # fmt: skip
    assert order == sorted(order)
    assert "'2026-12-05 12:00:00.123456'" in joined and "NULL" in joined
    assert "X'" + (b"x" * 5000).hex() + "'" in joined


def _texts(driver: Any, tasks: list[NewTask], now: datetime, limit: int) -> Any:
    original = mysql_tasks._INSERT_TEXT
    mysql_tasks._INSERT_TEXT = limit
    try:
        return list(mysql_tasks.insert_texts("`t`", driver, tasks, now))
    finally:
        mysql_tasks._INSERT_TEXT = original


@pytest.mark.parametrize(
    "data",
    [None, {"user_id": 1}, [], "ü \u2603", 1.25, 10**30, {"a": {"b": [None, True, "\\"]}}],
)
@pytest.mark.parametrize(
    "schedule",
    ["DAILY|07:30|Europe/Berlin", "CRON|0 8 * * 1-5|America/Sao_Paulo", "FIXED_RATE|PT1H"],
)
def test_plain_head_and_tail_are_encode(schedule: str, data: Any) -> None:
    encoded = json.dumps(data, separators=(",", ":")).encode()
    assert ScheduleSpec.plain_head(schedule) + encoded + PLAIN_TAIL == ScheduleSpec(
        schedule, data
    ).encode(where="x")


def test_a_parsed_schedule_is_kept_and_an_error_is_not() -> None:
    assert parse_schedule("DAILY|07:30|Europe/Berlin") is parse_schedule(
        "DAILY|07:30|Europe/Berlin"
    )
    for _ in range(2):
        with pytest.raises(ScheduleError, match="WEEKLY"):
            parse_schedule("WEEKLY|mon")
    with pytest.raises(ScheduleError, match="must be a string"):
        parse_schedule(["DAILY|07:30"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw",
    [b'{"a":1.5}', b'\xef\xbb\xbf{"a":1}', '{"a":[1,2]}', "\ufeff{}", b"NaN", b"1e400",
     b"\xff\xfe{\x00}\x00", b'{"a":', b"\xff", bytearray(b"[1]"), memoryview(b"[1]"), 5],
)  # fmt: skip
def test_task_data_decodes_as_json_loads_with_the_hooks(raw: Any) -> None:
    """``_loads`` keeps one decoder: it answers (or fails) as ``json.loads`` given the hooks."""

    def outcome(decode: Any) -> tuple[str, Any]:
        try:
            return "ok", decode(raw)
        except Exception as error:
            return type(error).__name__, str(error)

    expected = outcome(lambda r: json.loads(r, parse_constant=_constant, parse_float=_finite))
    assert outcome(_loads) == expected
