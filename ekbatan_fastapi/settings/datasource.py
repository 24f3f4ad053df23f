"""The database slots of the settings (``configs.jobs-config``).

A slot names a pool: a SQLAlchemy ``url`` (or a JVM-style ``jdbc-url``, translated), the
credentials and the pool size. The password is a secret and never appears in a ``repr``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, SecretStr, model_validator
from sqlalchemy.engine import URL, make_url

from ..domain.errors import ConfigurationError
from ..domain.text import mask_unparsed_url, mask_url
from ..store.connection import DEFAULT_POOL_SIZE, ConnectionProvider
from .keys import SettingsSection

__all__ = ["DataSourceConfig"]

_JDBC = re.compile(r"jdbc:(?P<kind>postgresql|mysql|mariadb)://(?P<rest>.*)", re.IGNORECASE)
_JDBC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "mysql": "mysql+asyncmy",
    "mariadb": "mariadb+asyncmy",
}


def _from_jdbc(jdbc_url: str) -> URL:
    """``jdbc:postgresql://host:5432/app?user=u`` -> ``postgresql+asyncpg://u@host:5432/app``."""
    match = _JDBC.fullmatch(jdbc_url.strip())
    if match is None:
        raise ConfigurationError(
            f"jdbc-url {mask_unparsed_url(jdbc_url)!r} is not a jdbc:postgresql://, "
            "jdbc:mysql:// or "
            "jdbc:mariadb:// URL with a host; write it as url: "
            "postgresql+asyncpg://user@host:5432/dbname instead"
        )
    driver = _JDBC_DRIVERS[match["kind"].lower()]
    rest = match["rest"]
    if "," in rest.split("/", 1)[0]:
        raise ConfigurationError(
            f"jdbc-url {mask_url(jdbc_url)!r} names several hosts, which the jobs pool cannot "
            "use; give one host, or write url: with a SQLAlchemy URL"
        )
    try:
        url = make_url(f"{driver}://{rest}")
    except Exception:
        raise ConfigurationError(
            f"cannot read jdbc-url {mask_unparsed_url(jdbc_url)!r}; expected "
            "jdbc:postgresql://host:5432/dbname"
        ) from None
    query = dict(url.query)
    username = query.pop("user", None)
    password = query.pop("password", None)
    translated: dict[str, str | tuple[str, ...]] = {}
    if "sslmode" in query and driver.startswith("postgresql"):
        translated["ssl"] = query.pop("sslmode")  # asyncpg takes libpq's sslmode values
    if query:
        raise ConfigurationError(
            f"jdbc-url parameters {', '.join(sorted(query))} have no asyncpg/asyncmy "
            "equivalent here; drop them, or write url: with a SQLAlchemy URL and the "
            "driver's own options"
        )
    return url.set(
        query=translated,
        username=username if isinstance(username, str) else url.username,
        password=password if isinstance(password, str) else url.password,
    )


class DataSourceConfig(SettingsSection):
    """One ``configs`` slot of a shard member: where a pool connects, and how big it is.

    ``url`` is a SQLAlchemy URL (``postgresql+asyncpg://host:5432/app``); ``jdbc-url`` is
    accepted for configuration shared with the JVM Ekbatan and translated. The password is a
    secret: it never appears in ``repr``, logs or ``/jobs``.
    """

    url: str | None = None
    """The jobs database's SQLAlchemy URL (``postgresql+asyncpg://app@db:5432/app``,
    ``mysql+asyncmy://...``); ``postgresql://`` uses asyncpg."""
    jdbc_url: str | None = None
    """Instead of ``url``: a ``jdbc:postgresql://``, ``jdbc:mysql://`` or ``jdbc:mariadb://`` URL,
    translated (configuration shared with the JVM Ekbatan)."""
    username: str | None = None
    """The user to log in as; wins over the URL's."""
    password: SecretStr | None = None
    """The password; wins over the URL's. A secret: never shown in logs, ``repr`` or ``/jobs``."""
    maximum_pool_size: int = Field(default=DEFAULT_POOL_SIZE, ge=1)
    """Connections of the jobs pool (the scheduler's own, separate from the application's)."""

    @model_validator(mode="after")
    def _one_url(self) -> DataSourceConfig:
        if self.url is not None and self.jdbc_url is not None:
            raise ValueError("give either url or jdbc-url, not both")
        return self

    def sqlalchemy_url(self) -> URL:
        """The URL to connect to, with ``username``/``password`` applied (they win)."""
        if self.jdbc_url is not None:
            url = _from_jdbc(self.jdbc_url)
        elif self.url is not None:
            try:
                url = make_url(self.url)
            except Exception:
                raise ConfigurationError(
                    f"cannot read url {mask_unparsed_url(self.url)!r}; expected e.g. "
                    "postgresql+asyncpg://user@host:5432/dbname"
                ) from None
        else:
            raise ConfigurationError("this config has neither url nor jdbc-url; set one of them")
        if self.username is not None:
            url = url.set(username=self.username)
        if self.password is not None:
            url = url.set(password=self.password.get_secret_value())
        return url

    def connection_provider(self) -> ConnectionProvider:
        """A dedicated pool of ``maximum_pool_size`` connections; connects lazily."""
        return ConnectionProvider.from_url(self.sqlalchemy_url(), pool_size=self.maximum_pool_size)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name in ("url", "jdbc_url") and isinstance(value, str):
                yield name, mask_url(value)
            else:
                yield name, value
