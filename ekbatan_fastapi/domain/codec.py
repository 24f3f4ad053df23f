"""``task_data`` encoding: JSON in UTF-8 bytes (db-scheduler itself stores Java serialization)."""

from __future__ import annotations

import json
from typing import Any

from .errors import ConfigurationError, EkbatanError

__all__ = ["TaskDataError", "decode_data", "encode_data"]


class TaskDataError(EkbatanError):
    """A row's ``task_data`` is not the JSON this library writes."""


def encode_data(data: Any, *, where: str) -> bytes | None:
    """JSON-encode ``data`` (None stays NULL); a clear error names the task when it cannot."""
    if data is None:
        return None
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise ConfigurationError(
            f"data for {where} is not JSON-serializable ({error}); pass dicts, lists, strings, "
            "numbers, booleans or None"
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
