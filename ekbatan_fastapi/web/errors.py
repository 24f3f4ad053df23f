"""How the library's errors reach people in a web application: a bad setting at startup as
one error line under the server (not a Starlette traceback), and the database being down or
unmigrated as a 503 answer with a JSON body (not a 500 with a traceback).

**Startup.** Starlette reports any exception from a lifespan as the text of its traceback
(``traceback.format_exc()``), which uvicorn then logs: 25 to 45 lines above a message that
already names the key, its environment variable and the fix. No Starlette option changes
that, so the lifespan, before it re-raises a configuration error, hands its message to a
filter on the server's error logger (``uvicorn.error``: uvicorn, ``python -m uvicorn``,
``uvicorn.run`` and gunicorn's uvicorn workers) that turns that traceback record into the
message alone, on one line. The exception still propagates unchanged, so the server still
stops with its non-zero exit code (uvicorn: 3), and a test driving the lifespan directly
still gets the exception itself.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from ..domain.errors import DatabaseUnavailable, SchemaMissingError
from ..domain.logs import library_logger
from ..domain.text import mask_url

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = [
    "STARTUP_LOGGERS",
    "database_unavailable_handler",
    "install_exception_handlers",
    "one_line",
    "shorten_startup_failure",
]

log = library_logger(__name__)

STARTUP_LOGGERS = ("uvicorn.error",)
"""The loggers a server reports a failed lifespan on (Starlette's traceback as the message)."""
_PENDING = 8
"""Startup failures remembered until their record comes (a process has one, tests a few)."""


def one_line(message: str) -> str:
    """A message of several lines (``invalid ekbatan settings:`` then one ``- key: problem``
    line per problem) as one line: the problems joined by ``; ``."""
    lines = [line.strip().removeprefix("- ") for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    return head + (" " + "; ".join(rest) if rest else "")


class _StartupFailureLine(logging.Filter):
    """Rewrites the server's record of a failed startup, whose message is the traceback text
    of an error the lifespan announced, into that error's one line."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, str] = OrderedDict()
        """The traceback's last line (``module.Error: first line``) -> the line to show."""

    def expect(self, error: BaseException) -> None:
        kind = type(error)
        name = kind.__qualname__
        if kind.__module__ not in ("builtins", "__main__"):
            name = f"{kind.__module__}.{name}"
        first = str(error).split("\n", 1)[0]
        line = mask_url(f"ekbatan: the application cannot start: {one_line(str(error))}")
        with self._lock:
            self._pending[f"{name}: {first}"] = line
            while len(self._pending) > _PENDING:
                self._pending.popitem(last=False)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if not self._pending or not isinstance(message, str):
            return True
        if not message.startswith("Traceback (most recent call last):"):
            return True
        with self._lock:
            for marker, line in self._pending.items():
                if marker in message:
                    del self._pending[marker]
                    record.msg, record.args = line, ()
                    record.exc_info = record.exc_text = None
                    break
        return True


_STARTUP_FILTER = _StartupFailureLine()
for _name in STARTUP_LOGGERS:
    logging.getLogger(_name).addFilter(_STARTUP_FILTER)


def shorten_startup_failure(error: BaseException) -> None:
    """Have the server log ``error`` (about to fail the startup) as its message on one line
    instead of Starlette's traceback of it."""
    _STARTUP_FILTER.expect(error)


# -- 503 for a database that is down or not migrated ----------------------------------------


_ANSWERS = {
    "schema-missing": "the jobs tables are missing (the operator runs ekbatan-jobs migrate)",
    "database-unavailable": "the jobs database is unavailable; try again shortly",
}


async def database_unavailable_handler(request: Request, error: Exception) -> Response:
    """``DatabaseUnavailable`` (``DatabaseTimeout`` too) or ``SchemaMissingError`` raised in a
    route: 503 with ``{"detail": ..., "error": "database-unavailable" | "schema-missing"}``
    and ``Retry-After: 5``, instead of a 500 with a traceback. The body says what, not where
    (a public route should not name the database host); the full message, which names the
    host, the database and the fix, is logged once per request as a warning."""
    from starlette.responses import JSONResponse

    kind = "schema-missing" if isinstance(error, SchemaMissingError) else "database-unavailable"
    log.warning(
        "%s %s answered 503: %s", request.method, request.url.path, mask_url(str(error))[:2000]
    )
    return JSONResponse(
        {"detail": _ANSWERS[kind], "error": kind}, status_code=503, headers={"Retry-After": "5"}
    )


def install_exception_handlers(app: Starlette) -> None:
    """Answer a route's ``DatabaseUnavailable`` / ``SchemaMissingError`` with 503 and a JSON
    body (``database_unavailable_handler``); the application's own handlers for those types,
    if any, are kept."""
    for kind in (DatabaseUnavailable, SchemaMissingError):
        if kind not in app.exception_handlers:
            app.add_exception_handler(kind, database_unavailable_handler)
