"""Values in MySQL/MariaDB statements, written so that no SQL mode reads them differently.

asyncmy writes a statement's parameters into its text (there is no server-side binding on
its text protocol). Its quoting of a ``str`` follows the session's ``NO_BACKSLASH_ESCAPES``
(the server reports the mode in every answer's status flags), but ``bytes`` (``task_data``),
and the elements of a tuple, a list or a set, are escaped with backslashes whatever the mode.
Under ``NO_BACKSLASH_ESCAPES`` a backslash is an ordinary character, so a quote in such a
value closed the literal and the rest of the value was read as SQL: a task's data inserted a
second row (issue 27). So every connection that runs our statements writes values through
``literal``:

* bytes as a hexadecimal literal, ``X'7b22...'``: hex digits only, read the same in every
  mode (a binary string, as the driver's ``_binary'...'`` is);
* text in single quotes, escaped as the session's current mode reads it (quotes doubled under
  ``NO_BACKSLASH_ESCAPES``, backslash escapes otherwise, as ``mysql_real_escape_string``
  does). Text with a lone surrogate is refused: the driver encodes statements with
  ``surrogateescape``, which would turn it into raw bytes that a multi-byte character set
  (GBK, SJIS, Big5) can read together with the escaping backslash;
* tuples, lists and sets element by element, by the same rules;
* numbers, times and NULL as the driver writes them (digits and fixed formats);
* anything else as its ``str()``, quoted as text (the driver's own fallback, made
  mode-aware).

``ANSI_QUOTES`` changes only what a double quote means: values are always in single quotes,
and our statements write table names with backticks (``MySQLDatabase.quoted``), which every
mode reads as identifiers.

``protect`` installs it on one asyncmy connection: the cursor looks ``literal`` (and
``escape``) up on the connection object, so the instance's own functions win; it then proves
that with the driver's own ``mogrify`` and refuses an asyncmy whose cursor does not, naming
its version. ``guard`` protects every connection an engine's pool hands out; ``protect_on``
an application's connection or session before our statements run on it (it may come from
an engine of its own).
"""

from __future__ import annotations

import datetime
import decimal
import re
import time
import weakref
from importlib import metadata
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from ...domain.errors import ConfigurationError

__all__ = ["guard", "literal", "protect", "protect_on", "quote_text"]

NO_BACKSLASH_ESCAPES = 0x200
"""``SERVER_STATUS_NO_BACKSLASH_ESCAPES``: set in the status flags of every answer while the
session's ``sql_mode`` holds ``NO_BACKSLASH_ESCAPES`` (the MySQL protocol's constant)."""

_PLAIN = frozenset(
    {
        type(None),
        bool,
        int,
        float,
        decimal.Decimal,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        time.struct_time,
    }
)
"""Types the driver writes as digits or a fixed format: nothing in them depends on a mode."""

_SPECIAL = re.compile("[\x00\n\r\x1a\"'\\\\\ud800-\udfff]")
_ESCAPES = {
    "\x00": "\\0",
    "\n": "\\n",
    "\r": "\\r",
    "\x1a": "\\Z",
    '"': '\\"',
    "'": "\\'",
    "\\": "\\\\",
}
_SURROGATE = re.compile("[\ud800-\udfff]")


def quote_text(value: str, no_backslash_escapes: bool) -> str:
    """``value`` as a single-quoted string literal of a session in that mode."""
    if _SPECIAL.search(value) is None:
        return f"'{value}'"
    if _SURROGATE.search(value) is not None:
        raise ValueError(
            f"text with a lone surrogate cannot be sent to MySQL/MariaDB: {value[:60]!r}"
        )
    if no_backslash_escapes:
        return "'" + value.replace("'", "''") + "'"
    return "'" + _SPECIAL.sub(lambda m: _ESCAPES[m.group()], value) + "'"


def literal(driver: Any, value: Any) -> str:
    """``value`` as SQL text for the session of ``driver`` (an asyncmy connection), in the
    SQL mode it is in now."""
    kind = type(value)
    if kind is str:
        return quote_text(value, bool(driver.server_status & NO_BACKSLASH_ESCAPES))
    if kind is int:
        return str(value)
    if value is None:
        return "NULL"
    if kind is bytes:
        return f"X'{value.hex()}'"
    if kind in _PLAIN:
        return str(type(driver).escape(driver, value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"X'{bytes(value).hex()}'"
    if isinstance(value, (tuple, list, set, frozenset)):
        return "(" + ",".join(literal(driver, v) for v in value) + ")"
    return quote_text(str(value), bool(driver.server_status & NO_BACKSLASH_ESCAPES))


class _Writer:
    """A connection's ``literal`` and ``escape``: ``literal`` of that connection (held
    weakly: the connection holds this)."""

    __slots__ = ("_driver",)

    def __init__(self, driver: Any) -> None:
        self._driver = weakref.ref(driver)

    def __call__(self, value: Any, mapping: Any = None) -> str:
        if type(value) is str and _SPECIAL.search(value) is None:  # most names: no mode matters
            return f"'{value}'"
        return literal(self._driver(), value)


def protect(driver: Any) -> None:
    """Make the asyncmy connection ``driver`` write every value through ``literal``, and
    check that its cursor does (``_check``)."""
    state = getattr(driver, "__dict__", None)
    if state is None or isinstance(state.get("literal"), _Writer):
        return
    writer = _Writer(driver)
    state["literal"] = writer
    state["escape"] = writer
    _check(driver)


def _check(driver: Any) -> None:
    """The driver's cursor writes positional, named and listed values through the
    connection's ``literal`` (no I/O: ``mogrify`` only builds the text); an asyncmy whose
    cursor escapes on its own is refused, naming its version, rather than run unsafely."""
    cursor = driver.cursor()
    quoted = "X'27'"
    positional = cursor.mogrify("%s", (b"'",))
    named = cursor.mogrify("%(v)s", {"v": b"'"})
    listed = cursor.mogrify("%s", ((b"'",),))
    if (positional, named, listed) != (quoted, quoted, f"({quoted})"):
        try:
            version = metadata.version("asyncmy")
        except metadata.PackageNotFoundError:  # pragma: no cover
            version = "unknown"
        raise ConfigurationError(
            f"asyncmy {version} does not write parameters through the connection's literal() "
            "(Ekbatan's quoting that no SQL mode can change, docs/databases.md): install an "
            "asyncmy version Ekbatan supports (pip install 'ekbatan-fastapi[mysql]')"
        )


def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    driver = getattr(dbapi_connection, "driver_connection", None)
    if driver is not None:
        protect(driver)


def guard(engine: AsyncEngine) -> None:
    """Protect every connection ``engine``'s pool hands out (also those it opened before)."""
    target = engine.sync_engine
    if not event.contains(target, "checkout", _on_checkout):
        event.listen(target, "checkout", _on_checkout)


async def protect_on(target: AsyncConnection | AsyncSession) -> None:
    """Protect the connection of an application's ``target`` (and its engine's pool)."""
    conn = target if isinstance(target, AsyncConnection) else await target.connection()
    guard(conn.engine)
    protect((await conn.get_raw_connection()).driver_connection)
