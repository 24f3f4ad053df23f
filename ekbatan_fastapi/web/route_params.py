"""Parameter aliases shared by the route modules.

They live at module level because FastAPI evaluates the routes' (string) annotations in the
namespace of the module that defines each route; every route module imports them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query

from .dependencies import get_ekbatan
from .state import EkbatanState

__all__ = ["BeforeId", "HistoryLimit", "Instance", "Limit", "Name", "Offset", "State"]

Name = Annotated[str, Path(description="the task_name (job name)", max_length=100)]
State = Annotated[EkbatanState, Depends(get_ekbatan)]
Limit = Annotated[int, Query(ge=1, le=10_000, description="at most this many rows")]
Offset = Annotated[int, Query(ge=0, description="skip this many rows (by execution_time)")]
Instance = Annotated[
    str, Query(max_length=100, description="task_instance; a recurring job's row by default")
]
HistoryLimit = Annotated[int, Query(ge=1, le=1000, description="at most this many records")]
BeforeId = Annotated[
    int | None,
    Query(ge=1, description="only records older than this id (the last id of the previous page)"),
]
