"""Hostile values under every SQL mode that changes how MySQL/MariaDB read a statement.

``NO_BACKSLASH_ESCAPES`` makes a backslash an ordinary character (a value escaped with
backslashes then ends early: issue 27, a task's data inserted a second row);
``ANSI_QUOTES`` makes a double quote an identifier quote. Every statement that carries a
value a user or a row can influence (task data, task names, instance ids, the scheduler's
name in ``picked_by``, pause reasons and ``paused_by``, history messages, the app version)
runs here in each mode, on the suite's MySQL kinds (the URL's dialect, and the "mysql5"
override with its own statements), with quotes, double quotes, backslashes, ``#``, ``--``,
``/*``, NUL, line breaks and 4-byte UTF-8: every value reads back exactly and no row appears
that nobody wrote. ``store/mysql/literals.py`` says how.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    ConfigurationError,
    ExecutionContext,
    OneTimeJob,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.codec import encode_data
from ekbatan_fastapi.domain.rows import Finish, FinishKind, NewTask, Owned, PollingStrategy
from ekbatan_fastapi.domain.text import storable
from ekbatan_fastapi.store.dialects import open_store
from ekbatan_fastapi.store.external import Caller
from ekbatan_fastapi.store.migrate import create_schema
from ekbatan_fastapi.store.mysql import literals
from ekbatan_fastapi.store.mysql.names import NAMES_TABLE_MIN
from ekbatan_fastapi.store.tables import Tables

from .conftest import Database, fresh_mysql_database
from .helpers import RecordingJob, RegistryFactory, db_now, examples, wait_until

MODES = {
    "no-backslash-escapes": "NO_BACKSLASH_ESCAPES",
    "ansi-quotes": "ANSI_QUOTES",
    "both": "NO_BACKSLASH_ESCAPES,ANSI_QUOTES",
    "default": "",
}
FAR = datetime(2100, 1, 1, tzinfo=UTC)


def _hex(value: str) -> str:
    return "0x" + value.encode().hex()


# A value that, escaped with backslashes and read without them, closes the literal of the
# third column of the task INSERT and adds a row of its own (issue 27's reproduction).
BREAKOUT = (
    f"', UTC_TIMESTAMP(), 0, 1, NULL), ({_hex('send-note')}, {_hex('evil')}, "
    "CONCAT(CURRENT_USER(), @@version), UTC_TIMESTAMP(), 0, 1, NULL)#"
)
PIECES = "'\"\\`#;%s%(x)s:x-- /* */\n\r\t\x1a😀ß"
NAMES = [
    "note ' \" \\ # -- /* */ 😀",
    "\\'); DELETE FROM scheduled_tasks; #",
    "' OR '1'='1",
    '" OR "1"="1',
    "trailing backslash \\",
    "\\",
    "''",
    "emoji 😀 𝄞 ß",
]
INSTANCES = [
    "i ' \" \\ # -- /* 😀",
    "\\",
    "'",
    '"',
    "x\\' OR 1=1 #",
    "line\nbreak\r\x1a",
    "%s %(x)s :x ?",
    "😀" * 30,
]
SCHEDULER = "sch'\"\\#--/*😀"
VERSION = "v1' \" \\ # -- /* 😀"
MESSAGE = f"failed: {PIECES} {BREAKOUT} \x00 nul"
REASON = f"maintenance {PIECES} {BREAKOUT}"
PAUSED_BY = "ops ' \" \\ # 😀"


def _data(tag: str) -> dict[str, Any]:
    return {"tag": tag, "note": BREAKOUT, "pieces": PIECES, "nul": "\x00", "deep": [PIECES]}


def in_mode(url: str, mode: str) -> str:
    """``url`` whose sessions run in ``mode`` too (after the suite's time zone)."""
    parsed = make_url(url)
    init = parsed.query["init_command"]
    assert isinstance(init, str)
    if mode:
        init += f", sql_mode = CONCAT(@@sql_mode, ',{mode}')"
    return parsed.update_query_dict({"init_command": init}).render_as_string(hide_password=False)


@pytest.fixture(params=["mysql", "mysql5"])
async def mysql_database(request: pytest.FixtureRequest) -> AsyncIterator[Database]:
    """The suite's MySQL kinds (``conftest.any_database``'s ``mysql`` and ``mysql5``)."""
    server = request.getfixturevalue("mysql_server_url")
    dialect = "mysql5" if request.param == "mysql5" else make_url(server).get_backend_name()
    async with fresh_mysql_database(server) as url:
        yield Database(request.param, url, dialect)


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return MODES[request.param]


@contextlib.asynccontextmanager
async def engine_in(url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(url, pool_size=5, max_overflow=5)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _sql_mode(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str(await conn.scalar(text("SELECT @@SESSION.sql_mode")))


class Note(OneTimeJob):
    """A one-time job that keeps the data of each run, or fails with ``MESSAGE``."""

    def __init__(self, name: str, *, fail: bool = False) -> None:
        self._name = name
        self.fail = fail
        self.data: dict[str, Any] = {}

    def name(self) -> str:
        return self._name

    async def execute(self, ctx: ExecutionContext) -> None:
        self.data[ctx.task_instance] = ctx.data
        if self.fail:
            raise RuntimeError(MESSAGE)


async def _rows(engine: AsyncEngine) -> dict[tuple[str, str], bytes | None]:
    t = scheduled_tasks
    async with engine.connect() as conn:
        result = await conn.execute(select(t.c.task_name, t.c.task_instance, t.c.task_data))
        return {(r[0], r[1]): r[2] for r in result}


async def test_issue_27_task_data_cannot_add_a_row_under_no_backslash_escapes(
    mysql_database: Database,
) -> None:
    """The reproduction: ``client.schedule(..., data={"note": text})`` with text an end user
    typed inserted a second row (``CURRENT_USER()``, ``@@version``) and cut the data short."""
    url = in_mode(mysql_database.url, "NO_BACKSLASH_ESCAPES")
    note = Note("send-note")
    async with engine_in(url) as engine:
        await create_schema(engine)
        factory = RegistryFactory(url, dialect=mysql_database.override)
        try:
            registry = factory.build(note)
            await registry.client.schedule("send-note", "order-1", FAR, {"note": BREAKOUT})
        finally:
            await factory.close()
        rows = await _rows(engine)
    assert list(rows) == [("send-note", "order-1")], rows
    assert rows[("send-note", "order-1")] == b'{"note":"' + BREAKOUT.encode() + b'"}'


async def test_every_statement_keeps_hostile_values_in_each_sql_mode(
    mysql_database: Database, mode: str
) -> None:
    """A scheduler named with quotes and backslashes runs jobs with such names, instances
    and data, in each mode: schedule (insert and replace), schedule_many, reschedule with
    data, the same three inside an application's transaction on an engine of its own, the
    poll, claim, heartbeat and completion, a failure's history, a pause with its reason and
    author, a forced run of a paused job, a cancel, the list and history pages, the
    instances and the job definitions. Every value reads back exactly; the table
    holds exactly the rows written."""
    url = in_mode(mysql_database.url, mode)
    note, failing = Note(NAMES[0]), Note(NAMES[1], fail=True)
    recurring = RecordingJob(NAMES[2], Schedules.fixed_delay(timedelta(milliseconds=100)))
    async with engine_in(url) as engine, engine_in(url) as foreign:
        session_mode = await _sql_mode(engine)
        assert all(part in session_mode for part in mode.split(",") if part)
        await create_schema(engine)
        factory = RegistryFactory(url, dialect=mysql_database.override)
        try:
            registry = await factory.start(
                note,
                failing,
                recurring,
                customize=lambda b: b.scheduler_name(SCHEDULER).app_version(VERSION),
            )
            client = registry.client
            expected: dict[tuple[str, str], bytes | None] = {}

            def wrote(name: str, instance: str, data: dict[str, Any]) -> None:
                expected[(name, instance)] = encode_data(data, where=name)

            # runs at once: poll, claim (picked_by), completion; the data as written
            await client.schedule(NOTE := NAMES[0], INSTANCES[0], None, _data("now"))
            await wait_until(lambda: INSTANCES[0] in note.data, what="the run")
            assert note.data[INSTANCES[0]] == _data("now")
            # insert, then the replacing statement, then reschedule with data
            await client.schedule(NOTE, INSTANCES[1], FAR, _data("first"))
            assert await client.schedule(NOTE, INSTANCES[1], FAR, _data("second"), replace=True)
            await client.reschedule(NOTE, INSTANCES[1], FAR, _data("third"))
            wrote(NOTE, INSTANCES[1], _data("third"))
            # executemany
            many = [(i, FAR, _data(i)) for i in INSTANCES[2:5]]
            assert await client.schedule_many(NOTE, many) == 3
            for instance, _, data in many:
                wrote(NOTE, instance, data)
            # inside the application's transaction, on an engine the store never saw
            async with foreign.begin() as conn:
                await client.schedule(NOTE, INSTANCES[5], FAR, _data("a"), connection=conn)
                await client.schedule(
                    NOTE, INSTANCES[5], FAR, _data("b"), replace=True, connection=conn
                )
                await client.schedule_many(NOTE, [(INSTANCES[6], FAR, _data("c"))], connection=conn)
                await client.reschedule(NOTE, INSTANCES[6], FAR, _data("d"), connection=conn)
            wrote(NOTE, INSTANCES[5], _data("b"))
            wrote(NOTE, INSTANCES[6], _data("d"))
            # a failure: its message in the history
            await client.schedule(NAMES[1], INSTANCES[7], None, _data("fail"))
            await wait_until(lambda: INSTANCES[7] in failing.data, what="the failing run")

            async def failed() -> bool:
                return any(r.outcome == "failed" for r in await client.history(NAMES[1]))

            await wait_until(failed, what="the failure's history record")
            [record] = [r for r in await client.history(NAMES[1]) if r.outcome == "failed"]
            assert record.task_instance == INSTANCES[7]
            assert record.picked_by == SCHEDULER
            assert record.error_message == storable(MESSAGE, 2000)
            row = await client.get(NAMES[1], INSTANCES[7])
            assert row is not None and row.data == _data("fail")  # retried later, data kept
            expected[(NAMES[1], INSTANCES[7])] = row.task_data
            # the recurring job ran (claims, heartbeats, reschedules under our name)
            await wait_until(lambda: len(recurring.slots) >= 2, what="the recurring job")
            history = await client.history(NAMES[2])
            assert history and {r.task_name for r in history} == {NAMES[2]}
            assert {r.picked_by for r in history} == {SCHEDULER}
            # a pause: reason and author as written
            await client.pause(NAMES[2], REASON, paused_by=PAUSED_BY)
            pause = (await client.paused())[NAMES[2]]
            assert (pause.reason, pause.paused_by) == (REASON, PAUSED_BY)
            assert await client.resume(NAMES[2])
            # a forced run of a paused job (claimed at once under our name), a cancel
            await client.pause(NOTE, REASON, paused_by=PAUSED_BY)
            assert await client.run_now(NOTE, INSTANCES[4], force=True) == SCHEDULER
            await wait_until(lambda: INSTANCES[4] in note.data, what="the forced run")
            assert note.data[INSTANCES[4]] == _data(INSTANCES[4])
            assert await client.resume(NOTE)
            await client.cancel(NOTE, INSTANCES[3])
            for gone in (INSTANCES[3], INSTANCES[4]):
                del expected[(NOTE, gone)]

            async def forced_run_done() -> bool:
                return await client.get(NOTE, INSTANCES[4]) is None

            await wait_until(forced_run_done, what="the forced run's completion")
            listed = {t.task_instance for t in await client.list(NOTE)}
            assert listed == {i for (n, i) in expected if n == NOTE}

            async def both_recorded() -> bool:
                return len(await client.history(NOTE)) >= 2

            await wait_until(both_recorded, what="the forced run's history record")
            page = await client.history(NOTE, limit=1)
            older = await client.history(NOTE, limit=10, before_id=page[0].id)
            assert {r.task_instance for r in page + older} == {INSTANCES[0], INSTANCES[4]}
            assert [i.name for i in await client.instances()] == [SCHEDULER]
            definitions = await client.job_definitions()
            assert set(definitions) == {NAMES[0], NAMES[1], NAMES[2]}
            assert {d.app_version for d in definitions.values()} == {VERSION}
            for (name, instance), data in expected.items():
                task = await client.get(name, instance)
                assert task is not None and task.task_data == data, (name, instance)
        finally:
            await factory.close()
        rows = await _rows(engine)
    expected[(NAMES[2], "recurring")] = None
    assert set(rows) == set(expected), set(rows) ^ set(expected)
    assert {k: rows[k] for k in expected} == expected


async def test_hot_statements_with_hostile_names_in_each_sql_mode(
    mysql_database: Database, mode: str
) -> None:
    """The poll (names per statement part, as a list in the text, and from the names table),
    claim, heartbeat, dead-execution check and revival, and the completions (delete,
    reschedule with a next time, release), with hostile names, instances, ``picked_by`` and
    raw bytes of data (NUL, quotes, backslashes, bytes that are not UTF-8)."""
    url = in_mode(mysql_database.url, mode)
    blob = b"\x00'\\\"#--/*\xff\xfe" + "😀".encode() + BREAKOUT.encode()
    picked_by = "me ' \\ \" #"
    async with engine_in(url) as engine:
        await create_schema(engine)
        repo = open_store(engine, mysql_database.dialect).tasks
        now = await db_now(engine)
        for count in (len(NAMES), 150, NAMES_TABLE_MIN):
            names = [*NAMES, *(f"{n} {i}" for i in range(count) for n in NAMES[:1])][:count]
            tasks = [NewTask(n, INSTANCES[0], now - timedelta(seconds=1), blob) for n in names]
            assert len(await repo.insert_missing(tasks)) == len(tasks)
            for strategy in mysql_database.strategies:
                polled = await repo.poll(names, 1000, picked_by, PollingStrategy(strategy))
                claimed = polled.claimed
                assert sorted(r.task_name for r in claimed) == sorted(names), strategy
                assert {(r.task_data, r.picked_by) for r in claimed} == {(blob, picked_by)}
                owned = [Owned(r.task_name, r.task_instance, r.version) for r in claimed]
                assert await repo.heartbeat(owned) == {o.key for o in owned}
                async with engine.begin() as conn:
                    await conn.execute(
                        update(scheduled_tasks).values(last_heartbeat=now - timedelta(hours=1))
                    )
                revival = await repo.revive_dead(names, timedelta(minutes=1))
                assert sorted(r.task_name for r in revival.revived) == sorted(names)
            claimed = (await repo.poll(names, 1000, picked_by, PollingStrategy.FETCH)).claimed
            kinds = [FinishKind.DELETED, FinishKind.SUCCEEDED, FinishKind.RELEASED]
            done = [
                Finish(
                    Owned(r.task_name, r.task_instance, r.version),
                    kinds[i % 3],
                    FAR if kinds[i % 3] is FinishKind.SUCCEEDED else None,
                )
                for i, r in enumerate(claimed)
            ]
            assert await repo.finish(done, picked_by=picked_by) == {d.owned.key for d in done}
            left = await _rows(engine)
            assert set(left) == {d.owned.key for d in done if d.kind is not FinishKind.DELETED}
            assert set(left.values()) == {blob}
            async with engine.begin() as conn:
                await conn.execute(scheduled_tasks.delete())
        async with engine.connect() as conn:
            assert await conn.scalar(select(func.count()).select_from(scheduled_tasks)) == 0


@settings(
    max_examples=examples(40),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    value=st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
        st.binary(max_size=40),
        st.lists(st.sampled_from([*PIECES, "\x00", "\\'", "''", BREAKOUT]), max_size=8).map(
            "".join
        ),
    )
)
async def test_a_literal_reads_back_as_the_value_in_each_sql_mode(
    literal_sessions: list[tuple[str, Any]], value: str | bytes
) -> None:
    """``literals.literal`` of any text or bytes, sent as the statement's text, comes back
    as the value in every mode (a property of the mechanism itself)."""
    for mode, driver in literal_sessions:
        async with driver.cursor() as cursor:
            sql = f"SELECT {literals.literal(driver, value)}, {literals.literal(driver, (value,))}"
            await cursor.execute(sql)
            got = await cursor.fetchone()
        want = value if isinstance(value, str) else bytes(value)
        assert bytes(got[0]) == want if isinstance(value, bytes) else got[0] == want, mode
        assert (bytes(got[1]) if isinstance(value, bytes) else got[1]) == want, mode


@pytest.fixture
async def literal_sessions(mysql_server_url: str) -> AsyncIterator[list[tuple[str, Any]]]:
    """One asyncmy session per mode, each protected."""
    import asyncmy

    url = make_url(mysql_server_url)
    sessions = []
    try:
        for name, mode in MODES.items():
            init = f"SET sql_mode = CONCAT(@@sql_mode, ',{mode}')" if mode else None
            driver = await asyncmy.connect(
                host=url.host,
                port=url.port or 3306,
                user=url.username,
                password=url.password or "",
                charset="utf8mb4",
                init_command=init,
            )
            literals.protect(driver)
            sessions.append((name, driver))
        yield sessions
    finally:
        for _, driver in sessions:
            driver.close()


async def test_table_names_are_quoted_for_every_sql_mode(mysql_database: Database) -> None:
    """A table name that needs quoting, on a store whose engine saw ``ANSI_QUOTES`` (the
    engine's own quoting is then double quotes), written inside the transaction of an
    application whose sessions lack it: the store's statements quote with backticks,
    which every mode reads as an identifier."""
    table = "Tasks_Mixed"
    ansi = in_mode(mysql_database.url, "ANSI_QUOTES")
    async with engine_in(ansi) as engine, engine_in(mysql_database.url) as plain:
        await create_schema(engine, table, operations=False)
        store = open_store(engine, mysql_database.dialect, table)
        assert '"' not in store.tasks.db.quoted(Tables(table).tasks)
        task = NewTask("n'", "i\\", FAR, b"'\\")
        async with plain.begin() as conn:
            caller = Caller(conn, engine, what="test", translate=store.tasks.db.translate)
            assert await store.tasks.upsert_on(caller, task, replace=True)
            replacing = NewTask("n'", "i\\", FAR, b"x")
            assert await store.tasks.upsert_on(caller, replacing, replace=True)
        row = await store.tasks.get("n'", "i\\")
        assert row is not None and row.task_data == b"x"


async def test_a_protected_connection_quotes_for_its_current_mode() -> None:
    """Without a server: the status flag the server sends decides the quoting of text, bytes
    are hex whatever it says, and a list's elements follow the same rules."""
    from asyncmy.connection import Connection

    make: Any = Connection
    driver = make(host="127.0.0.1")  # never connected (made in a running loop, as a pool's)
    literals.protect(driver)
    cursor = driver.cursor()
    values = ("a'b\\", b"\x00'\\", ["x'", b"'"])
    assert cursor.mogrify("%s, %s, %s", values) == "'a\\'b\\\\', X'00275c', ('x\\'',X'27')"
    driver.server_status |= literals.NO_BACKSLASH_ESCAPES
    assert cursor.mogrify("%s, %s, %s", values) == "'a''b\\', X'00275c', ('x''',X'27')"
    assert cursor.mogrify("%(v)s", {"v": "'"}) == "''''"


def test_an_asyncmy_that_ignores_the_connection_literal_is_refused() -> None:
    """A driver whose cursor escapes on its own (as asyncmy's ``escape_bytes_prefixed``
    did) is refused by name rather than run unsafely."""

    class Cursor:
        def mogrify(self, query: str, args: Any) -> str:
            return query % (("_binary'\\''",) if isinstance(args, tuple) else {"v": "x"})

    class Driver:
        def cursor(self) -> Cursor:
            return Cursor()

    with pytest.raises(ConfigurationError, match=r"asyncmy .* does not write parameters"):
        literals.protect(Driver())


@pytest.mark.bench_smoke
def test_the_literals_benchmark_runs() -> None:
    """Keeps ``bench/mysql_literals.py`` working (a smoke run, no figures checked)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "bench/mysql_literals.py", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "100 key pairs" in done.stdout and "bytes" in done.stdout
