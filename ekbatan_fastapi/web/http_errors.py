"""How the routes answer the library's errors: one mapping from exception to status code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import HTTPException
from sqlalchemy.exc import DBAPIError

from ..domain.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from ..domain.text import is_valid_name
from .report import describe_failure

__all__ = ["check_names", "translated_errors"]


def check_names(*names: str) -> None:
    """422 unless every name fits the table's key columns."""
    if not all(is_valid_name(n) for n in names):
        raise HTTPException(422, detail="names are 1 to 100 characters")


@asynccontextmanager
async def translated_errors(timeout: float) -> AsyncIterator[None]:
    """Bound the body by ``timeout`` and turn the library's errors into HTTP answers:
    404 unknown task, 409 running or paused, 422 bad input, 503 database or schema missing
    (the message names the fix)."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except TaskNotFoundError as error:
        raise HTTPException(404, detail=str(error)) from None
    except (TaskPickedError, TaskPausedError, UnknownJobError) as error:
        raise HTTPException(409, detail=str(error)) from None
    except ConfigurationError as error:
        raise HTTPException(422, detail=str(error)) from None
    except SchemaMissingError as error:
        raise HTTPException(503, detail=str(error)) from None
    except DatabaseUnavailable as error:  # a DatabaseTimeout too: both name the host
        raise HTTPException(503, detail=describe_failure(error)) from None
    except TimeoutError:
        raise HTTPException(503, detail="database unreachable: no answer in time") from None
    except (DBAPIError, OSError) as error:
        raise HTTPException(503, detail=describe_failure(error)) from None
