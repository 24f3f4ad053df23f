"""How the routes answer the library's errors: one mapping from exception to status code.

The routes' own checks of names and limits are in their parameters' schema (route_params),
so FastAPI answers a bad request itself, with the documented ``HTTPValidationError`` body;
the library's later refusals (``ConfigurationError``) are answered in that same shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError

from ..client.read_model import describe_failure
from ..domain.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    RunNotClaimedError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)

__all__ = ["ErrorMessage", "error_response", "translated_errors", "unprocessable"]


class ErrorMessage(BaseModel):
    """The body of the routes' own 4xx/5xx answers (``HTTPException``)."""

    detail: str


def error_response(description: str) -> dict[str, Any]:
    """An entry of a route's ``responses=``: ``description`` with the ``ErrorMessage`` body."""
    return {"model": ErrorMessage, "description": description}


def unprocessable(message: str, loc: Sequence[str]) -> RequestValidationError:
    """A 422 in the shape FastAPI documents for every route (``HTTPValidationError``):
    ``{"detail": [{"loc": [...], "msg": ..., "type": "value_error"}]}``."""
    return RequestValidationError([{"loc": tuple(loc), "msg": message, "type": "value_error"}])


@asynccontextmanager
async def translated_errors(timeout: float, *, loc: Sequence[str] = ()) -> AsyncIterator[None]:
    """Bound the body by ``timeout`` and turn the library's errors into HTTP answers:
    404 unknown task, 409 running or paused, 422 bad input (``loc`` names the parameter the
    library refused), 503 database or schema missing, or a forced run no instance claimed
    (the message names the fix)."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except TaskNotFoundError as error:
        raise HTTPException(404, detail=str(error)) from None
    except (TaskPickedError, TaskPausedError, UnknownJobError) as error:
        raise HTTPException(409, detail=str(error)) from None
    except ConfigurationError as error:
        raise unprocessable(str(error), loc) from None
    except SchemaMissingError as error:
        raise HTTPException(503, detail=str(error)) from None
    except DatabaseUnavailable as error:  # a DatabaseTimeout too: both name the host
        raise HTTPException(503, detail=describe_failure(error)) from None
    except RunNotClaimedError as error:  # a TimeoutError, but no instance, not the database
        raise HTTPException(503, detail=str(error)) from None
    except TimeoutError:
        raise HTTPException(503, detail="database unreachable: no answer in time") from None
    except (DBAPIError, OSError) as error:
        raise HTTPException(503, detail=describe_failure(error)) from None
