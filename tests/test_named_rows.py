"""Rows and contexts are built by name: the statements read ``TaskRow``'s fields in its
order, and ``execution_context`` puts each value in its own attribute."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from ekbatan_fastapi import ExecutionContext, HeartbeatState
from ekbatan_fastapi.domain.context import execution_context
from ekbatan_fastapi.domain.rows import FinishKind, Outcome, Owned, TaskRow
from ekbatan_fastapi.store.mysql import statements as mysql
from ekbatan_fastapi.store.mysql import tasks as mysql_tasks
from ekbatan_fastapi.store.postgresql import statements as postgresql


def test_execution_context_puts_every_value_in_its_own_attribute() -> None:
    fields = [f.name for f in dataclasses.fields(ExecutionContext)]
    values: dict[str, Any] = {name: object() for name in fields}
    values["heartbeat_state"] = HeartbeatState(timedelta(seconds=1), timedelta(seconds=4))
    ctx = execution_context(**values)
    assert {name: getattr(ctx, name) for name in fields} == values
    assert isinstance(ctx, ExecutionContext)


def test_the_executor_passes_the_context_fields_in_the_class_order() -> None:
    """The executor calls ``ExecutionContext`` positionally (the hot path); each argument's
    comment names the field it fills: they are the class's fields, in its order."""
    import inspect

    from ekbatan_fastapi.engine.executor import Executor

    source = inspect.getsource(Executor._call_job)
    call = source[source.index("ExecutionContext(") : source.index("\n        )\n")]
    named = re.findall(r",  # (\w+)$", call, flags=re.MULTILINE)
    assert named == [f.name for f in dataclasses.fields(ExecutionContext)]


def test_the_statements_read_a_task_row_in_its_field_order() -> None:
    assert TaskRow._fields == postgresql.COLUMNS
    assert ", ".join(f"t.{f}" for f in TaskRow._fields) == postgresql.RETURNING
    assert ", ".join(TaskRow._fields) == mysql.COLUMNS
    lock_due = mysql.lock_due("t", None)
    assert f"SELECT {mysql.COLUMNS}, {mysql.NOW} AS db_now" in lock_due
    assert len(TaskRow._fields) == mysql.DB_NOW


def test_a_mysql_row_is_converted_field_by_field() -> None:
    naive = datetime(2030, 1, 2, 3, 4, 5)
    aware = naive.replace(tzinfo=UTC)
    row = mysql_tasks.task_row(
        ("n", "i", b"{}", naive, 1, "me", naive, None, 2, naive, 7, 3, naive)
    )
    assert row == TaskRow(
        task_name="n",
        task_instance="i",
        task_data=b"{}",
        execution_time=aware,
        picked=True,
        picked_by="me",
        last_success=aware,
        last_failure=None,
        consecutive_failures=2,
        last_heartbeat=aware,
        version=7,
        priority=3,
    )


def test_the_completion_names_the_values_a_null_array_stands_for() -> None:
    sql = postgresql.finish("t", "h")
    assert f"COALESCE(kind, {int(FinishKind.DELETED)})" in sql
    assert f"COALESCE(e.outcome, '{Outcome.SUCCEEDED.value}')" in sql
    assert postgresql.KIND_OF_NULL is FinishKind.DELETED
    assert postgresql.OUTCOME_OF_NULL is Outcome.SUCCEEDED
    assert not re.search(r"kind (=|<>) \D", sql)


def test_the_key_getters_read_the_named_fields() -> None:
    """``TaskRow.key`` and ``Owned.key`` are replaced at import by a C getter of the first two
    fields (domain/rows.py); their typed ``def`` is what mypy and readers see. A field moved
    ahead of ``task_name``/``task_instance`` would make the getter read the wrong ones while
    the ``def`` still read right: this pins the two to the same answer."""
    now = datetime.now(UTC)
    row = TaskRow("job", "inst", b"{}", now, True, "me", None, None, 0, now, 7, 3)
    owned = Owned("job", "inst", 7)
    for value, cls in ((row, TaskRow), (owned, Owned)):
        assert cls._fields[:2] == ("task_name", "task_instance")
        assert value.key == (value.task_name, value.task_instance) == ("job", "inst")
        assert type(cls.__dict__["key"]) is property  # the getter, not a field
