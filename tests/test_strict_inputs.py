"""Inputs accepted only whole and only as JSON holds them (issue 27, item 13).

A table name is checked as a whole (``$`` also matched before a final newline, so
``"scheduled_tasks\\n"`` passed); task data refuses NaN and Infinity when it is read as when
it is written (Python's ``json`` reads ``NaN``, ``Infinity`` and ``1e400``, pydantic reads them
too, and pydantic wrote a NaN in an ``Any`` field as ``null``, silently).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from ekbatan_fastapi.domain.codec import (
    DataModel,
    TaskDataError,
    TaskDataInvalid,
    decode_data,
    encode_data,
    encode_task_data,
)
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.store.tables import Tables, validate_table_name


@pytest.mark.parametrize(
    "name",
    [
        "scheduled_tasks\n",
        "jobs.scheduled_tasks\n",
        "scheduled_tasks\r\n",
        "scheduled_tasks\n; DROP TABLE x",
        "\nscheduled_tasks",
        "scheduled_tasks ",
        "٣tasks",  # a digit in another script (``\\d``-style classes would accept it)
        "tasks\u0130",
    ],
)
def test_table_names_with_anything_around_them_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_table_name(name)
    assert repr(name) in str(caught.value)
    with pytest.raises(ConfigurationError):
        Tables(name)


@pytest.mark.parametrize("name", ["scheduled_tasks", "jobs.scheduled_tasks", "_t" + "x" * 61])
def test_plain_table_names_still_pass(name: str) -> None:
    assert validate_table_name(name) == name


@pytest.mark.parametrize(
    "raw", [b"NaN", b'{"a": NaN}', b"[Infinity]", b'{"a": [-Infinity]}', b"1e400", b"[-1E999]"]
)
def test_reading_nan_or_infinity_is_refused_naming_the_task(raw: bytes) -> None:
    with pytest.raises(TaskDataError) as caught:
        decode_data(raw, where="send-note/order-1")
    message = str(caught.value)
    assert "send-note/order-1" in message and "NaN or an infinity" in message


class Reading(BaseModel):
    value: float
    extra: Any = None


@pytest.mark.parametrize("raw", [b'{"value": NaN}', b'{"value": 1, "extra": Infinity}'])
def test_a_typed_job_parks_data_holding_nan(raw: bytes) -> None:
    """pydantic reads NaN into a float or an ``Any`` field; the stored row is refused as data
    that does not fit (parked, not retried), naming the task."""
    model = DataModel(Reading, "a job")
    with pytest.raises(TaskDataInvalid) as caught:
        model.decode(raw, task_name="meter", task_instance="m-1")
    assert "meter/m-1" in str(caught.value) and caught.value.errors


@pytest.mark.parametrize(
    "data",
    [
        {"value": 1.0, "extra": float("nan")},
        {"value": 1.0, "extra": {"deep": [float("inf")]}},
        Reading(value=1.0, extra=float("-inf")),
    ],
)
def test_writing_nan_through_a_model_is_refused_not_turned_into_null(data: Any) -> None:
    """pydantic's JSON form of ``Any`` holding NaN is ``null``: the stored data would have
    changed silently."""
    with pytest.raises(ConfigurationError) as caught:
        encode_task_data(DataModel(Reading, "a job"), data, where="meter/m-1")
    assert "meter/m-1" in str(caught.value) and "extra" in str(caught.value)
    if isinstance(data, Reading):
        with pytest.raises(ConfigurationError):
            encode_data(data, where="meter/m-1")


def test_plain_nan_names_where_it_is() -> None:
    with pytest.raises(ConfigurationError) as caught:
        encode_data({"a": [1, float("nan")]}, where="j/i")
    assert "a.1" in str(caught.value)


def test_deep_nesting_is_a_task_data_error_both_ways() -> None:
    with pytest.raises(TaskDataError) as caught:
        decode_data(b"[" * 100_000 + b"]" * 100_000, where="j/i")
    assert "j/i" in str(caught.value)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ConfigurationError):
        encode_data(deep, where="j/i")


def test_finite_data_round_trips() -> None:
    data = {"a": 1.5, "b": [1e308, -1e-308, 0.0], "c": None}
    assert decode_data(encode_data(data, where="j/i"), where="j/i") == data
