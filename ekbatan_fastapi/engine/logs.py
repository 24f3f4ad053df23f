"""The ``extra`` every log record about one row carries (task name, instance, scheduler)."""

from __future__ import annotations

from typing import Any

from ..domain.rows import TaskRow

__all__ = ["log_extra"]


def log_extra(row: TaskRow, scheduler: str) -> dict[str, Any]:
    """The ``extra`` of every log record about one row."""
    return {"task_name": row.task_name, "task_instance": row.task_instance, "scheduler": scheduler}
