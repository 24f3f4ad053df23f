"""Rules for the text the library stores and shows: names, stored messages, masked secrets."""

from __future__ import annotations

import re

from .errors import ConfigurationError

__all__ = [
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "is_storable_text",
    "is_valid_name",
    "mask_url",
    "redact",
    "storable",
    "validate_name",
]

MAX_NAME_LENGTH = 100
"""Task names and instance ids: the key columns' limit (``varchar(100)`` on MySQL)."""

_WHITESPACE = (
    r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
NAME_PATTERN = rf"^[^\u0000]*[^\u0000{_WHITESPACE}][^\u0000]*$"
"""``is_valid_name`` as a regular expression, for OpenAPI schemas: no NUL and one character
that is not whitespace (exactly ``str.isspace``). The same in Python, JavaScript (ECMA-262)
and Rust (pydantic); the length and the lone surrogates (which no URL or JSON text carries)
are checked apart."""


def is_storable_text(value: str) -> bool:
    """True when a database can store ``value``: UTF-8 encodable (no lone surrogate, which
    Python strings may hold) and without NUL."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def is_valid_name(value: object, limit: int = MAX_NAME_LENGTH) -> bool:
    """A task name, instance id or scheduler name: 1 to ``limit`` storable characters, not
    blank."""
    return (
        isinstance(value, str)
        and bool(value.strip())
        and len(value) <= limit
        and is_storable_text(value)
    )


def validate_name(value: object, what: str) -> str:
    """Task names and instance ids: non-empty strings of at most 100 characters."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {type(value).__name__}: {value!r}")
    if not is_valid_name(value):
        shown = value if len(value) <= 120 else value[:117] + "..."
        raise ConfigurationError(
            f"{what} {shown!r} is invalid: use 1 to {MAX_NAME_LENGTH} characters (no NUL, "
            f"no lone surrogate), not blank (got {len(value)} characters)"
        )
    return value


def storable(text: str, limit: int) -> str:
    """Text any database column takes: no NUL (PostgreSQL refuses it), no lone surrogates (not
    encodable as UTF-8, e.g. from an undecodable file name), at most ``limit`` characters."""
    text = text[:limit].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def mask_url(text: str) -> str:
    """``scheme://user:secret@host`` and ``password=secret`` with the secrets replaced."""
    text = re.sub(r"(://[^/:@?#]*:)[^@/?#]*@", r"\1***@", text)
    return re.sub(r"((?:^|[?&;])password=)[^&;]*", r"\1***", text, flags=re.IGNORECASE)


def redact(text: str) -> str:
    """An error message fit to show (``/jobs``, the CLI): no SQL parameters, no passwords."""
    text = text.split("\n[SQL:", 1)[0].split("\n(Background on this error", 1)[0]
    return mask_url(text.strip())[:500]
