"""``task_data`` encoding: JSON in UTF-8 bytes (db-scheduler itself stores Java serialization),
and the typed form: a one-time job's pydantic model (``OneTimeJob[InvoiceData]``), validated
when an instance is scheduled and again when it runs.

JSON has no NaN or Infinity. Python's ``json`` reads them (``NaN``, ``Infinity``, and ``1e400``
as an infinity) and pydantic writes them as ``null`` where a field is typed ``Any``; here both
directions refuse them, naming the task and where the number is. A row only ever becomes
JSON, plain values and the model's own types: nothing in a row names a type to build (no
pickle, no YAML tags, no class paths), so a party that can write the table cannot make a
scheduler run code through it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import ConfigurationError, EkbatanError

__all__ = [
    "DataModel",
    "TaskDataError",
    "TaskDataInvalid",
    "TaskDataTooDeep",
    "decode_data",
    "encode_data",
    "encode_task_data",
]

_MAX_ERRORS = 5
"""Field errors quoted in a message (the rest are counted)."""


class TaskDataError(EkbatanError):
    """A row's ``task_data`` is not the JSON this library writes."""


class TaskDataTooDeep(TaskDataError):
    """A row's ``task_data`` is JSON nested deeper than Python's recursion limit can decode."""


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


class _NonFinite(ValueError):
    """NaN or an infinity in JSON text (``args[0]``: the token as written)."""


def _constant(token: str) -> Any:
    raise _NonFinite(token)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400
        raise _NonFinite(text)
    return value


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)
"""``_loads``' decoder, made once (``json.loads`` makes one per call when given hooks: half
the time of decoding a schedule row's few fields)."""


def _loads(raw: bytes | str) -> Any:
    """``json.loads(raw, parse_constant=..., parse_float=...)`` that refuses NaN and
    infinities, on a decoder made once: bytes are decoded as ``json.loads`` does (UTF-8, or
    the UTF-16/32 its first bytes show)."""
    if isinstance(raw, str):
        if raw.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
        return _DECODER.decode(raw)
    if not isinstance(raw, bytes | bytearray):
        raise TypeError(
            f"the JSON object must be str, bytes or bytearray, not {type(raw).__name__}"
        )
    return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def _non_finite_path(data: Any) -> str | None:
    """Where the first NaN or infinity sits in ``data`` (dicts, lists, tuples, sets; the
    data itself: ``(the data itself)``), or None. Iterative: data may nest deeply."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path or "(the data itself)"
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, float) and not math.isfinite(key):
                    return f"{path}.{key}".lstrip(".")
                stack.append((item, f"{path}.{key}".lstrip(".")))
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((item, f"{path}.{i}".lstrip(".")) for i, item in enumerate(value))
    return None


def _refuse_non_finite(data: Any, where: str) -> None:
    path = _non_finite_path(data)
    if path is not None:
        raise ConfigurationError(
            f"data for {where} holds NaN or Infinity at {path}: JSON has no such number "
            "(Ekbatan refuses it when reading a row too); use null or a finite number"
        )


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
        # pydantic writes a NaN in an ``Any`` field as null: refused here instead
        _refuse_non_finite(self._adapter.dump_python(value), where)
        return encode_data(self._adapter.dump_python(value, mode="json"), where=where)

    def decode(self, raw: bytes | None, *, task_name: str, task_instance: str) -> Any:
        """A row's data as the model. Data that no longer fits (written by an older deploy,
        or by hand) raises TaskDataInvalid: the execution is then parked, not retried. NaN
        and Infinity (which pydantic reads) are refused so."""
        raw = raw if raw is not None else b"null"
        try:
            _loads(raw)
        except _NonFinite as error:
            token = str(error.args[0])
            text = f"{token} is NaN or an infinity: JSON cannot hold it (Ekbatan never writes it)"
            errors = [{"loc": (), "msg": text, "type": "finite_number", "input": token}]
            raise self._unfit(task_name, task_instance, text, errors) from None
        except (ValueError, RecursionError):
            pass  # malformed: pydantic's own error says where
        try:
            return self._adapter.validate_json(raw)
        except ValidationError as error:
            text, errors = _describe(error)
            raise self._unfit(task_name, task_instance, text, errors) from error

    def _unfit(
        self, task_name: str, task_instance: str, text: str, errors: list[dict[str, Any]]
    ) -> TaskDataInvalid:
        key = f"{task_name!r}, {task_instance!r}"
        return TaskDataInvalid(
            f"the stored data of {task_name}/{task_instance} does not fit {self.name} "
            f"(written by an older deploy, or by hand?): {text}; the row is parked, not "
            f"retried: fix its data with client.reschedule({key}, data=...), run it again "
            f"as it is with client.run_now({key}) once the model accepts it, or drop it "
            f"with client.cancel({key})",
            errors,
        )


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``json.dumps(data, separators=(",", ":"), allow_nan=False)`` without making an encoder per
call (``json.dumps`` makes one for any argument it is given)."""


def encode_data(data: Any, *, where: str) -> bytes | None:
    """JSON-encode ``data`` (None stays NULL; a pydantic model is stored as its JSON form);
    a clear error names the task when it cannot."""
    if data is None:
        return None
    if isinstance(data, BaseModel):
        _refuse_non_finite(data.model_dump(), where)  # mode="json" writes NaN as null
        data = data.model_dump(mode="json")
    try:
        return _ENCODER.encode(data).encode()
    except RecursionError:
        raise ConfigurationError(
            f"data for {where} is nested too deeply to encode as JSON; flatten it"
        ) from None
    except (TypeError, ValueError) as error:
        _refuse_non_finite(data, where)
        raise ConfigurationError(
            f"data for {where} is not JSON-serializable ({error}); pass dicts, lists, strings, "
            "numbers, booleans, None or a pydantic model"
        ) from error


def decode_data(raw: bytes | None, *, where: str) -> Any:
    """Decode ``task_data``; undecodable bytes (and NaN, Infinity, nesting deeper than
    Python's recursion limit) raise TaskDataError naming the row."""
    if raw is None:
        return None
    try:
        return _loads(raw)
    except _NonFinite as error:
        raise TaskDataError(
            f"task_data of {where} holds {error.args[0]}: NaN or an infinity, which JSON cannot "
            "hold (Ekbatan refuses them when writing too); reschedule it with null or a finite "
            "number, or cancel it"
        ) from None
    except RecursionError:
        raise TaskDataTooDeep(
            f"task_data of {where} nests too deeply to decode ({len(raw)} bytes); reschedule "
            "it with flatter data or cancel it"
        ) from None
    except ValueError as error:  # also UnicodeDecodeError
        raise TaskDataError(
            f"task_data of {where} is not UTF-8 JSON ({len(raw)} bytes, starts {raw[:16]!r}); "
            "was it written by another scheduler? Reschedule it with JSON data or cancel it"
        ) from error


def encode_task_data(model: DataModel | None, data: Any, *, where: str) -> bytes | None:
    """``data`` through a typed job's model (validated first), else as plain JSON."""
    return encode_data(data, where=where) if model is None else model.encode(data, where=where)
