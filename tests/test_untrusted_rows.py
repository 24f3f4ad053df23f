"""A party that can INSERT into ``scheduled_tasks`` cannot make a scheduler run code.

Rows are written straight into the table with ``task_data`` that would run code if some path
deserialized it into arbitrary types: a pickle whose ``__reduce__`` calls a function, YAML
tags (``!!python/object/apply:os.system``), and JSON naming classes and functions in the
forms serialization libraries honour (``py/object``, ``py/reduce``, ``__class__``, ``$type``,
``@class``). Task names that look like code paths are tried too. One-time rows of a plain
job, of a typed job (``OneTimeJob[Model]``) and of unknown names, a recurring row of a known
job: nothing is executed (no call of the probe function, no file made by a shell), each row is
handled by its documented rule (docs/robustness.md: a plain job's read of the data fails and
the row is kept for a retry, a typed job's row is parked, an unknown name is never claimed),
the data reads back as plain JSON values or a ``TaskDataError``, and the scheduler keeps
running its other work. (``domain/codec.py``: a row only ever becomes JSON, plain values and
the model's own types.)
"""

from __future__ import annotations

import json
import pickle
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    OneTimeJob,
    RetryLater,
    Schedule,
    Schedules,
    TaskDataError,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.failure import FailureHandler
from ekbatan_fastapi.domain.rows import PARKED_TIME

from .conftest import Database
from .helpers import CountingJob, RegistryFactory, db_now, wait_until

CALLS: list[str] = []
"""Every call of ``_probe``: a payload that ran code."""


def _probe(source: str) -> str:
    CALLS.append(source)
    return source


class _Exploit:
    """Unpickling this calls ``_probe``."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_probe, ("pickle",))


def _payloads(marker: Path) -> dict[str, bytes]:
    here = f"{__name__}._probe"
    shell = f"touch {marker}"
    return {
        "pickle": pickle.dumps(_Exploit()),
        "pickle-system": _system_pickle(shell),
        "yaml-apply": f"!!python/object/apply:{here} ['yaml']".encode(),
        "yaml-system": f"!!python/object/apply:os.system ['{shell}']".encode(),
        "yaml-new": f"!!python/object/new:{__name__}._Exploit []".encode(),
        "jsonpickle": json.dumps(
            {"py/reduce": [{"py/function": here}, {"py/tuple": ["jsonpickle"]}]}
        ).encode(),
        "class-names": json.dumps(
            {
                "py/object": f"{__name__}._Exploit",
                "__class__": f"{__name__}._Exploit",
                "__module__": "os",
                "$type": "System.Diagnostics.Process, System",
                "@class": "java.lang.ProcessBuilder",
                "note": "plain",
                "extra": {"py/object": f"{__name__}._Exploit", "py/state": {"x": 1}},
            }
        ).encode(),
        "java": b"\xac\xed\x00\x05sr\x00\x11java.lang.Runtime",
    }


def _system_pickle(command: str) -> bytes:
    """A pickle that calls ``os.system(command)`` when loaded (protocol 0, by hand)."""
    return f"cos\nsystem\n(V{command}\ntR.".encode()


class Plain(OneTimeJob):
    """Reads its data: a TaskDataError (retried an hour later), or plain JSON values."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}

    def name(self) -> str:
        return "plain-reader"

    def failure_handler(self) -> FailureHandler:
        return RetryLater(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        try:
            self.seen[ctx.task_instance] = ctx.data
        except TaskDataError as error:
            self.errors[ctx.task_instance] = error
            raise


class Note(BaseModel):
    note: str
    extra: Any = None


class Typed(OneTimeJob[Note]):
    def __init__(self) -> None:
        self.seen: dict[str, Note] = {}

    def name(self) -> str:
        return "typed-reader"

    async def execute(self, ctx: ExecutionContext[Note]) -> None:
        self.seen[ctx.task_instance] = ctx.data


class Recurring(DistributedJob):
    """A recurring job whose row was given data; it reads it."""

    def __init__(self) -> None:
        self.runs = 0
        self.errors: list[BaseException] = []

    def name(self) -> str:
        return "recurring-reader"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.runs += 1
        try:
            ctx.data  # noqa: B018 - the read is the test
        except TaskDataError as error:
            self.errors.append(error)
            raise


JSON_KINDS = {"jsonpickle", "class-names"}
"""The payloads that are valid JSON (they decode, to plain values)."""
UNKNOWN_NAMES = [
    f"{__name__}._probe",
    "os.system",
    "__import__('os').system('id')",
    "subprocess.Popen",
]


def test_the_payloads_are_live(tmp_path: Path) -> None:
    """Each payload runs code when loaded the unsafe way (so the test below can see it)."""
    marker = tmp_path / "pwned"
    payloads = _payloads(marker)
    CALLS.clear()
    pickle.loads(payloads["pickle"])
    yaml.unsafe_load(payloads["yaml-apply"])
    assert CALLS == ["pickle", "yaml"]
    for kind in ("pickle-system", "yaml-system"):
        loader = pickle.loads if kind.startswith("pickle") else yaml.unsafe_load
        loader(payloads[kind])
        assert marker.exists(), kind
        marker.unlink()
    CALLS.clear()


def _plain_json(value: Any) -> bool:
    """Only what JSON holds: dicts of str keys, lists, str, int, float, bool, None."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


async def _insert(engine: AsyncEngine, rows: list[dict[str, Any]]) -> None:
    base = {"picked": False, "version": 1, "priority": 0}
    async with engine.begin() as conn:
        await conn.execute(insert(scheduled_tasks), [base | r for r in rows])


async def _row(engine: AsyncEngine, name: str, instance: str) -> Any:
    t = scheduled_tasks
    async with engine.connect() as conn:
        result = await conn.execute(
            select(t).where(t.c.task_name == name, t.c.task_instance == instance)
        )
        return result.one_or_none()


async def test_rows_written_by_a_party_with_insert_run_no_code(
    any_database: Database,
    any_engine: AsyncEngine,
    any_registries: RegistryFactory,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    payloads = _payloads(marker)
    now = await db_now(any_engine)
    due = now - timedelta(seconds=1)
    rows = [
        {"task_name": job, "task_instance": kind, "task_data": data, "execution_time": due}
        for job in ("plain-reader", "typed-reader")
        for kind, data in payloads.items()
    ]
    rows += [
        {"task_name": name, "task_instance": kind, "task_data": data, "execution_time": due}
        for name in UNKNOWN_NAMES
        for kind, data in list(payloads.items())[:2]
    ]
    rows.append(
        {
            "task_name": "recurring-reader",
            "task_instance": "recurring",
            "task_data": payloads["yaml-system"],
            "execution_time": due,
        }
    )
    await _insert(any_engine, rows)
    CALLS.clear()
    plain, typed, recurring, healthy = Plain(), Typed(), Recurring(), CountingJob()
    registry = await any_registries.start(plain, typed, recurring, healthy)
    client = registry.client

    async def handled() -> bool:
        for kind in payloads:
            got = await _row(any_engine, "plain-reader", kind)
            if kind not in JSON_KINDS and (got is None or got.consecutive_failures != 1):
                return False
            parked = await _row(any_engine, "typed-reader", kind)
            if kind != "class-names" and (
                parked is None or parked.execution_time.replace(tzinfo=UTC) != PARKED_TIME
            ):
                return False
        return recurring.runs >= 1

    await wait_until(handled, timeout=20, what="every hostile row handled by its rule")
    await client.schedule("count", "after-the-payloads")
    await wait_until(lambda: healthy.runs["after-the-payloads"] == 1, what="the healthy task")

    assert CALLS == [], f"a payload ran code: {CALLS}"
    assert not marker.exists(), "a payload ran a shell command"
    # the plain job: only the JSON naming classes decoded, to plain values; the rest failed
    assert set(plain.seen) == JSON_KINDS
    assert all(_plain_json(value) for value in plain.seen.values())
    assert set(plain.errors) == set(payloads) - JSON_KINDS
    for kind in JSON_KINDS:
        assert await _row(any_engine, "plain-reader", kind) is None  # ran, deleted
    for kind, data in payloads.items():
        if kind not in JSON_KINDS:  # kept as written, for a retry an hour later
            kept = await _row(any_engine, "plain-reader", kind)
            assert bytes(kept.task_data) == data and not kept.picked
    # the typed job ran only the row that fits its model, with plain values in ``Any``;
    # each other row is parked
    assert set(typed.seen) == {"class-names"}
    model = typed.seen["class-names"]
    assert type(model) is Note and model.note == "plain" and _plain_json(model.extra)
    # the recurring job ran, failed on reading its data, and moved to its next slot
    assert recurring.errors and recurring.runs == len(recurring.errors)
    # unknown names: never claimed, nothing run
    for name in UNKNOWN_NAMES:
        for kind in list(payloads)[:2]:
            left = await _row(any_engine, name, kind)
            assert left is not None and not left.picked and left.version == 1
    # reading the rows back (what /jobs and the CLI show) gives plain values or TaskDataError
    for task in await client.list(limit=1000):
        try:
            value = task.data
        except TaskDataError:
            continue
        assert _plain_json(value), (task.task_name, task.task_instance, value)
    status = registry.status()
    assert status.loop_restarts == 0 and status.database_reachable is True
    assert CALLS == [] and not marker.exists()
