"""The fields every log record of the library carries (``task_name``, ``task_instance``,
``scheduler``), and the filter that puts them on a record.

Records about one row name it in their ``extra``; the others get the fields from the context
they were logged in: an execution's task (and the worker thread of a plain ``def`` job) knows
its row, a scheduler's loops know their scheduler. A field nothing knows is ``None``, so a
format such as ``%(task_name)s`` works for every record of ``ekbatan_fastapi``.
``TaskLogFilter`` does the same for the application's own records (docs/logging.md).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

__all__ = [
    "LOG_FIELDS",
    "TaskLogFilter",
    "bind_log_context",
    "library_logger",
    "log_context",
]

LOG_FIELDS = ("task_name", "task_instance", "scheduler")
"""The ``extra`` fields on every record of ``ekbatan_fastapi``."""

_context: ContextVar[dict[str, Any] | None] = ContextVar("ekbatan_log_context", default=None)


def log_context() -> dict[str, Any]:
    """The fields known where this is called (an execution: all three; a loop: the
    scheduler; elsewhere: none)."""
    return dict(_context.get() or {})


def bind_log_context(**fields: Any) -> None:
    """Add fields to the current context. Call it first thing in a task of its own (an
    asyncio task runs in a copy of its creator's context, so nothing leaks out of it)."""
    known = _context.get()
    _context.set({**known, **fields} if known else fields)  # ``fields`` is this call's own


class TaskLogFilter(logging.Filter):
    """Sets ``task_name``, ``task_instance`` and ``scheduler`` on a record that lacks them:
    from the execution it was logged in, else ``None``. Attach it to a handler to give a job's
    own records the fields (``handler.addFilter(TaskLogFilter())``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        known = _context.get() or {}
        for name in LOG_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, known.get(name))
        return True


_FILTER = TaskLogFilter()


def library_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the fields filter (for the library's modules)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
