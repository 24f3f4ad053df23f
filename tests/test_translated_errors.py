"""``translated_errors`` (web/http_errors.py): each library error becomes the HTTP answer that
says what happened; a ``TimeoutError`` that is no database's is not called one (review3)."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from ekbatan_fastapi import RunNotClaimedError
from ekbatan_fastapi.web.http_errors import translated_errors


async def test_a_forced_run_nobody_claimed_is_not_called_a_database_timeout() -> None:
    """``RunNotClaimedError`` is a ``TimeoutError``: it was answered "database unreachable: no
    answer in time", which sends an operator to the database; its own message names the fix."""
    message = "no instance claimed digest/recurring within 30 s (is an application running?)"
    with pytest.raises(HTTPException) as raised:
        async with translated_errors(5.0):
            raise RunNotClaimedError(message)
    assert raised.value.status_code == 503
    assert raised.value.detail == message


async def test_a_timeout_of_the_request_is_still_the_database_s() -> None:
    with pytest.raises(HTTPException) as raised:
        async with translated_errors(5.0):
            raise TimeoutError
    assert raised.value.status_code == 503
    assert "database unreachable" in str(raised.value.detail)
