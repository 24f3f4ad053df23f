"""The fields every log record of the library carries (``task_name``, ``task_instance``,
``scheduler``), and the filter that puts them on a record.

Records about one row name it in their ``extra``; the others get the fields from the context
they were logged in: an execution's task (and the worker thread of a plain ``def`` job) knows
its row, a scheduler's loops know their scheduler. A field nothing knows is ``None``, so a
format such as ``%(task_name)s`` works for every record of ``ekbatan_fastapi``.
``TaskLogFilter`` does the same for the application's own records (docs/logging.md).
The library's own records show durations in ISO-8601 (``PT10S``), as the settings do.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from .durations import format_iso_duration

__all__ = [
    "LOG_CONTEXT",
    "LOG_FIELDS",
    "TaskLogFilter",
    "bind_log_context",
    "library_logger",
    "log_context",
]

LOG_FIELDS = ("task_name", "task_instance", "scheduler")
"""The ``extra`` fields on every record of ``ekbatan_fastapi``."""

LOG_CONTEXT: ContextVar[dict[str, Any] | None] = ContextVar("ekbatan_log_context", default=None)
"""The fields known in the current context (``bind_log_context`` adds to them; an execution's
task sets all three at once, its own dict, when it starts)."""


def log_context() -> dict[str, Any]:
    """The fields known where this is called (an execution: all three; a loop: the
    scheduler; elsewhere: none)."""
    return dict(LOG_CONTEXT.get() or {})


def bind_log_context(**fields: Any) -> None:
    """Add fields to the current context. Call it first thing in a task of its own (an
    asyncio task runs in a copy of its creator's context, so nothing leaks out of it)."""
    known = LOG_CONTEXT.get()
    LOG_CONTEXT.set({**known, **fields} if known else fields)  # ``fields`` is this call's own


class TaskLogFilter(logging.Filter):
    """Sets ``task_name``, ``task_instance`` and ``scheduler`` on a record that lacks them:
    from the execution it was logged in, else ``None``. Attach it to a handler to give a job's
    own records the fields (``handler.addFilter(TaskLogFilter())``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        known = LOG_CONTEXT.get() or {}
        for name in LOG_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, known.get(name))
        return True


class _LibraryRecords(TaskLogFilter):
    """The fields, and durations in ISO-8601 as the settings write them (``PT10S``, not
    ``0:00:10``): a record's ``timedelta`` arguments are formatted with
    ``format_iso_duration``, so no log call has to remember it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(arg, timedelta) for arg in args):
            record.args = tuple(
                format_iso_duration(arg) if isinstance(arg, timedelta) else arg for arg in args
            )
        return super().filter(record)


_FILTER = _LibraryRecords()


def library_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the fields filter (for the library's modules)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
