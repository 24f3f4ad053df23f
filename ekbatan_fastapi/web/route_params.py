"""Parameter aliases shared by the route modules.

They live at module level because FastAPI evaluates the routes' (string) annotations in the
namespace of the module that defines each route; every route module imports them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query

from ..domain.text import MAX_NAME_LENGTH, NAME_PATTERN
from .dependencies import get_ekbatan
from .state import EkbatanState

__all__ = [
    "ADMIN_CHECK_PATH",
    "DASHBOARD_PATH",
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "PATH_NAME_PATTERN",
    "BeforeId",
    "HistoryLimit",
    "Instance",
    "Limit",
    "Name",
    "Offset",
    "State",
]

DASHBOARD_PATH = "/-/ui"
"""The dashboard, under the router's prefix. Two segments whose second is no job route's
(``/{name}/history``, ``/run``, ...), so no job name reaches it; ``/jobs/ui`` is the job
``ui``."""
ADMIN_CHECK_PATH = DASHBOARD_PATH + "/admin"
"""Under the router's prefix: answers 204 when the dependency accepts the request. The
dashboard asks it, in-process, whether to show its action buttons."""

_NAME_RULE = "1 to 100 characters, not blank, no NUL"
PATH_NAME_PATTERN = NAME_PATTERN.replace(r"[^\u0000", r"[^\u0000/")
"""A name in the path has no ``/`` as well: the router decodes ``%2F`` before matching, so
``/jobs/a%2Fhistory`` is the history of ``a`` (a task whose name holds ``/`` is read with the
client or the CLI)."""
Name = Annotated[
    str,
    Path(
        description=f"the task_name (job name): {_NAME_RULE}, no '/'",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=PATH_NAME_PATTERN,
    ),
]
State = Annotated[EkbatanState, Depends(get_ekbatan)]
MAX_PAGE = 1000
"""The most rows one ``/jobs`` page may ask for: an unauthenticated request is bounded."""
DEFAULT_PAGE = 100
Limit = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_PAGE,
        description=f"at most this many rows (1 to {MAX_PAGE}; the next page: offset=next_offset)",
    ),
]
Offset = Annotated[
    int, Query(ge=0, le=2**31 - 1, description="skip this many rows (by execution_time)")
]
Instance = Annotated[
    str,
    Query(
        description=f"task_instance, {_NAME_RULE}; a recurring job's row by default",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=NAME_PATTERN,
    ),
]
HistoryLimit = Annotated[int, Query(ge=1, le=1000, description="at most this many records")]
BeforeId = Annotated[
    int | None,
    Query(
        ge=1,
        le=2**63 - 1,  # the id column is a BIGINT
        description="only records older than this id (the last id of the previous page)",
    ),
]
