"""The ``extra`` every log record about one row carries (task name, instance, scheduler), and
how the library's records become visible under uvicorn and gunicorn (docs/logging.md).

Under ``uvicorn`` or ``gunicorn`` nothing configures the root logger: the servers configure
their own loggers only, so an ``ekbatan_fastapi`` record reached no handler and Python's
last resort printed warnings and errors bare (no time, level or logger) and dropped the INFO
lines. ``show_library_logs`` hands our records to the server's own handlers instead, and only
while nobody else receives them: an application that configured logging (a root handler, or a
handler on ``ekbatan_fastapi``) keeps its configuration untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..domain.rows import TaskRow

__all__ = ["LIBRARY_LOGGER", "LOG_HANDLER_MODES", "log_extra", "show_library_logs"]

LIBRARY_LOGGER = "ekbatan_fastapi"
LOG_HANDLER_MODES = ("auto", "none")
"""``auto``: to the server's handlers (uvicorn, gunicorn) or stderr when nothing else receives
the library's records; ``none``: leave logging alone."""
_SERVER_LOGGERS = ("uvicorn.error", "gunicorn.error")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_extra(row: TaskRow, scheduler: str) -> dict[str, Any]:
    """The ``extra`` of every log record about one row."""
    return {"task_name": row.task_name, "task_instance": row.task_instance, "scheduler": scheduler}


def _handlers_reached(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record logged on ``logger`` reaches (its own, then its ancestors' up
    to the first that does not propagate)."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += current.handlers
        if not current.propagate:
            break
        current = current.parent
    return found


def _uses(handler: logging.Handler, field: str) -> bool:
    """The handler's format shows ``field`` (``%(name)s``, ``{name}`` or ``$name``)."""
    fmt = getattr(handler.formatter, "_fmt", None) or ""
    return any(f"{a}{field}{b}" in fmt for a, b in (("%(", ")"), ("{", "}"), ("{", ":"), ("$", "")))


class ServerRelay(logging.Handler):
    """Hands a library record to one of the server's handlers, in the server's format, with
    the time and the logger's name in front of the message where that format has none
    (uvicorn's default prints neither; a job's failure needs both)."""

    def __init__(self, target: logging.Handler) -> None:
        super().__init__()
        self.target = target
        self._time = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = []
            if not _uses(self.target, "asctime"):
                prefix.append(self._time.formatTime(record))
            if not _uses(self.target, "name"):
                prefix.append(f"{record.name}:")
            relayed = logging.makeLogRecord(record.__dict__)
            relayed.msg = " ".join([*prefix, record.getMessage()])
            relayed.args = None
            relayed.exc_text = None
            self.target.handle(relayed)
        except Exception:
            self.handleError(record)


def show_library_logs(mode: str = "auto") -> Callable[[], None] | None:
    """Make the library's records visible when nothing receives them: hand them to the
    handlers of ``uvicorn.error`` (or ``gunicorn.error``) in their format, or else to stderr,
    and log from the server's level (INFO without a server) unless a level was set on
    ``ekbatan_fastapi``. Returns what undoes
    it (None: nothing was changed: ``mode`` ``none``, or logging is configured)."""
    if mode == "none":
        return None
    ours = logging.getLogger(LIBRARY_LOGGER)
    if _handlers_reached(ours):
        return None  # the application's configuration receives them: leave it alone
    handlers: list[logging.Handler] = []
    level = logging.INFO
    for name in _SERVER_LOGGERS:
        server = logging.getLogger(name)
        if _handlers_reached(server):
            handlers = [ServerRelay(h) for h in _handlers_reached(server)]
            level = server.getEffectiveLevel()  # `--log-level warning` holds for us too
            break
    if not handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(logging.Formatter(_FORMAT))
        handlers = [stderr]
    for handler in handlers:
        ours.addHandler(handler)
    level_set = ours.level != logging.NOTSET
    if not level_set:
        ours.setLevel(level)

    def undo() -> None:
        for handler in handlers:
            ours.removeHandler(handler)
        if not level_set:
            ours.setLevel(logging.NOTSET)

    return undo
