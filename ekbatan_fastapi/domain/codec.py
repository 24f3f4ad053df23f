"""``task_data`` encoding: JSON in UTF-8 bytes (db-scheduler itself stores Java serialization),
and the typed form: a one-time job's pydantic model (``OneTimeJob[InvoiceData]``), validated
when an instance is scheduled and again when it runs."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import ConfigurationError, EkbatanError

__all__ = [
    "DataModel",
    "TaskDataError",
    "TaskDataInvalid",
    "decode_data",
    "encode_data",
    "encode_task_data",
]

_MAX_ERRORS = 5
"""Field errors quoted in a message (the rest are counted)."""


class TaskDataError(EkbatanError):
    """A row's ``task_data`` is not the JSON this library writes."""


class TaskDataInvalid(TaskDataError, ValueError):
    """Data that does not fit a typed one-time job's model: raised by ``schedule()``, and the
    error of an execution whose stored data no longer fits (its row is then parked).

    ``errors`` are pydantic's (``loc``, ``msg``, ``type``, ...); ``fields`` the dotted paths."""

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors
        self.fields = [_path(e) for e in errors]


def _path(error: Any) -> str:
    return ".".join(str(part) for part in error.get("loc", ())) or "(the data itself)"


def _describe(error: ValidationError) -> tuple[str, list[dict[str, Any]]]:
    errors: list[dict[str, Any]] = [dict(e) for e in error.errors(include_url=False)]
    parts = []
    for item in errors[:_MAX_ERRORS]:
        got = repr(item.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        parts.append(f"{_path(item)}: {item.get('msg')} (got {got})")
    more = len(errors) - _MAX_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else ""), errors


class DataModel:
    """The type a typed one-time job's data must fit (a pydantic model, or any type pydantic
    validates: a dataclass, a TypedDict, ``list[int]``), and how it crosses the column."""

    def __init__(self, annotation: Any, owner: str) -> None:
        self.annotation = annotation
        self.name = getattr(annotation, "__name__", None) or repr(annotation)
        try:
            self._adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        except Exception as error:
            raise ConfigurationError(
                f"{owner} declares its task data as {self.name}, which pydantic cannot "
                f"validate ({error}); use a pydantic BaseModel (or a dataclass, a TypedDict)"
            ) from error

    def validate(self, data: Any, *, where: str) -> Any:
        """``data`` (a model instance, or a dict of its fields) as the model; TaskDataInvalid
        names every field that does not fit."""
        try:
            return self._adapter.validate_python(data)
        except ValidationError as error:
            text, errors = _describe(error)
            raise TaskDataInvalid(
                f"data for {where} does not fit {self.name}: {text}", errors
            ) from error

    def encode(self, data: Any, *, where: str) -> bytes | None:
        """Validate, then store the model's JSON form (``model_dump(mode="json")``)."""
        value = self.validate(data, where=where)
        return encode_data(self._adapter.dump_python(value, mode="json"), where=where)

    def decode(self, raw: bytes | None, *, task_name: str, task_instance: str) -> Any:
        """A row's data as the model. Data that no longer fits (written by an older deploy,
        or by hand) raises TaskDataInvalid: the execution is then parked, not retried."""
        try:
            return self._adapter.validate_json(raw if raw is not None else b"null")
        except ValidationError as error:
            text, errors = _describe(error)
            key = f"{task_name!r}, {task_instance!r}"
            raise TaskDataInvalid(
                f"the stored data of {task_name}/{task_instance} does not fit {self.name} "
                f"(written by an older deploy, or by hand?): {text}; the row is parked, not "
                f"retried: fix its data with client.reschedule({key}, data=...), run it again "
                f"as it is with client.run_now({key}) once the model accepts it, or drop it "
                f"with client.cancel({key})",
                errors,
            ) from error


def encode_data(data: Any, *, where: str) -> bytes | None:
    """JSON-encode ``data`` (None stays NULL; a pydantic model is stored as its JSON form);
    a clear error names the task when it cannot."""
    if data is None:
        return None
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise ConfigurationError(
            f"data for {where} is not JSON-serializable ({error}); pass dicts, lists, strings, "
            "numbers, booleans, None or a pydantic model"
        ) from error


def decode_data(raw: bytes | None, *, where: str) -> Any:
    """Decode ``task_data``; undecodable bytes raise TaskDataError naming the row."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as error:
        raise TaskDataError(
            f"task_data of {where} is not UTF-8 JSON ({len(raw)} bytes, starts {raw[:16]!r}); "
            "was it written by another scheduler? Reschedule it with JSON data or cancel it"
        ) from error


def encode_task_data(model: DataModel | None, data: Any, *, where: str) -> bytes | None:
    """``data`` through a typed job's model (validated first), else as plain JSON."""
    return encode_data(data, where=where) if model is None else model.encode(data, where=where)
