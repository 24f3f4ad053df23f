"""Rules for the text the library stores and shows: names, stored messages, masked secrets."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

from .errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = [
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "is_secret_name",
    "is_storable_text",
    "is_valid_name",
    "mask_unparsed_url",
    "mask_url",
    "printable",
    "redact",
    "storable",
    "validate_name",
]

MAX_NAME_LENGTH = 100
"""Task names and instance ids: the key columns' limit (``varchar(100)`` on MySQL)."""

_WHITESPACE = (
    r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ANY = r"[^\u0000]*"
DOT_NAMES = frozenset({".", ".."})
"""Names refused although not blank: as a URL path segment they mean "this folder" and "the
parent folder" (also written ``%2e``), so ``/jobs/../run`` would be another route."""
NAME_PATTERN = (
    rf"^(?:{_ANY}[^\u0000{_WHITESPACE}.]{_ANY}"  # a character that is no space and no dot
    rf"|{_ANY}(?:\.{_ANY}[{_WHITESPACE}]|[{_WHITESPACE}]{_ANY}\.){_ANY}"  # a dot and a space
    rf"|{_ANY}\.{_ANY}\.{_ANY}\.{_ANY})$"  # three dots
)
"""``is_valid_name`` as a regular expression, for OpenAPI schemas: no NUL, one character that
is not whitespace (exactly ``str.isspace``), and not ``.`` or ``..`` (written without a
look-ahead, which pydantic's regular expressions lack). The same in Python, JavaScript
(ECMA-262) and Rust (pydantic); the length and the lone surrogates (which no URL or JSON text
carries) are checked apart."""


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
    blank, not ``.`` or ``..``."""
    return (
        isinstance(value, str)
        and bool(value.strip())
        and value not in DOT_NAMES
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
            f"no lone surrogate), not blank, not '.' or '..' (got {len(value)} characters)"
        )
    return value


def storable(text: str, limit: int) -> str:
    """Text any database column takes: no NUL (PostgreSQL refuses it), no lone surrogates (not
    encodable as UTF-8, e.g. from an undecodable file name), at most ``limit`` characters."""
    text = text[:limit].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


_SECRET_NAME = re.compile(r"pass(?!file)|pwd|secret|token|credential|api_?key|private_?key", re.I)
"""A name whose value is a secret (``password``, ``sslpassword``, ``passwd``, ``admin_token``,
``client_secret``); ``passfile`` names a file (its contents are never read by Ekbatan)."""
_USERINFO = re.compile(
    r"(?P<head>(?<![\w+.-])(?:[A-Za-z][\w+.-]*:/{0,3}|://)[^\s:/@?#]*:)[^\s]{0,2000}@"
)
"""``scheme://user:secret@`` (also with a slash or the scheme missing): the secret runs up
to the last ``@`` of the URL (an unescaped ``@`` in a password, and every host of a
multi-host URL written ``u:p@h1,u:p@h2``)."""
_PARAMETER = re.compile(
    r"""(?P<key>(?<![\w%.-])[\w%.-]+)(?P<eq>\s*=\s*)
        (?P<value>'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&;]*)""",
    re.X,
)
"""``key=value`` in a URL's query string or a libpq keyword/value string (``password='x'``)."""
_JSON_MEMBER = re.compile(r'(?P<key>"[^"\\]*"\s*:\s*)(?P<value>"(?:[^"\\]|\\.)*"?)')
_CLOSING = "'\"),]}>"


def is_secret_name(name: str) -> bool:
    """Whether a setting, URL parameter or keyword named ``name`` holds a secret (judged by
    the name: ``password``, ``sslpassword``, ``api_key``, ``admin-token``, ...)."""
    return _SECRET_NAME.search(unquote(name)) is not None


def _masked_parameter(match: re.Match[str]) -> str:
    if not is_secret_name(match["key"]):
        return match[0]
    value = match["value"]
    if value[:1] in "'\"":
        return f"{match['key']}{match['eq']}***"
    # A closing quote or bracket after the value belongs to the text around the URL
    # (``'...?password=x'``), not to the secret: kept, so the message still reads well.
    kept = len(value) - len(value.rstrip(_CLOSING))
    return f"{match['key']}{match['eq']}***{value[len(value) - kept :] if kept else ''}"


def _masked_member(match: re.Match[str]) -> str:
    if not is_secret_name(match["key"].split('"')[1]):
        return match[0]
    return f'{match["key"]}"***"'


def mask_url(value: str | URL) -> str:
    """The one masking of secrets wherever a URL or an error message is shown (logs, errors,
    ``/jobs``, the CLI, settings): ``scheme://user:secret@host`` (every host of a multi-host
    URL), ``?password=secret``, ``&sslpassword=``, any parameter whose name suggests a secret
    (``is_secret_name``, percent-encoded names included), libpq's ``password='secret'`` and
    JSON's ``"password": "secret"``, each replaced by ``***``. A URL object is rendered
    first (its password hidden). Over-masking is preferred to a leak."""
    text = value if isinstance(value, str) else value.render_as_string(hide_password=True)
    text = _USERINFO.sub(r"\g<head>***@", text)
    text = _PARAMETER.sub(_masked_parameter, text)
    return _JSON_MEMBER.sub(_masked_member, text)


def mask_unparsed_url(text: str) -> str:
    """A URL that did not parse, fit to show: only its scheme and what follows its last ``@``
    (the host and database) when it has one, since where its user info ends is not known;
    else ``mask_url``'s reading."""
    scheme, colon, rest = text.partition(":")
    if "@" not in rest:
        return mask_url(text)
    shown_scheme = scheme if colon and re.fullmatch(r"[\w+.-]{1,40}", scheme) else "?"
    return f"{shown_scheme}:***@{mask_url(rest.rpartition('@')[2])}"


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What a terminal acts on or a reader is fooled by: C0 and C1 controls (ESC starts colour,
title and cursor sequences; 0x9b is a one-byte CSI), DEL, the bidirectional overrides and
isolates (text that reads other than it is), and lone surrogates (not printable at all)."""


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = True) -> str:
    """``text`` safe to write to a terminal: every control character escaped as Python writes
    it (``\\x1b``, ``\\u202e``). ``lines``: newlines and tabs are kept (a message of several
    lines); otherwise they are escaped too (a table cell)."""
    text = _CONTROL.sub(_escaped, text)
    if not lines:
        text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text


_REDACT_INPUT = 4000
"""Characters of an error message masked by ``redact`` (500 of them are shown)."""


def redact(text: str) -> str:
    """An error message fit to show (``/jobs``, the CLI): no SQL parameters, no passwords."""
    text = text[:_REDACT_INPUT].split("\n[SQL:", 1)[0].split("\n(Background on this error", 1)[0]
    return mask_url(text.strip())[:500]
