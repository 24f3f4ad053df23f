"""What every ``ekbatan-jobs`` command works with: the settings, a one-connection pool, the
store and the client over it (no scheduler runs in the CLI), and the output."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client import SchedulerClient
from ..client.read_model import ReadModel
from ..domain.tasks import dead_after, overdue_after
from ..domain.text import mask_url
from ..store.connection import ConnectionProvider, dialect_of
from ..store.dialects import Store, open_store
from ..store.tables import DEFAULT_TABLE_NAME
from .output import Output

if TYPE_CHECKING:
    from ..settings import EkbatanSettings

__all__ = ["EXIT", "CliError", "Context", "connect"]


class EXIT:
    """The exit codes (documented in docs/cli.md)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    """A bad argument or setting (argparse uses 2 as well)."""
    UNKNOWN_TASK = 3
    UNREACHABLE = 4
    SCHEMA_MISSING = 5
    CONFLICT = 6
    """The task is running right now, or paused (run-now without --force)."""


class CliError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Context:
    args: argparse.Namespace
    provider: ConnectionProvider
    store: Store
    client: SchedulerClient
    out: Output
    overdue_after: Any
    dead_after: Any
    settings: Any = None
    """The application's settings as read (EkbatanSettings)."""

    @property
    def reads(self) -> ReadModel:
        """The operator read model, as ``/jobs`` reads it (one set of names)."""
        return ReadModel(self.client, dead_after=self.dead_after, overdue_after=self.overdue_after)

    @property
    def dialect(self) -> str:
        return self.store.dialect.name

    def safe_url(self) -> str:
        return mask_url(self.provider.engine.url)


def _settings(args: argparse.Namespace) -> EkbatanSettings:
    from ..settings import EkbatanSettings

    return EkbatanSettings(_config_file=args.config) if args.config else EkbatanSettings()


async def connect(args: argparse.Namespace, out: Output) -> Context:
    """Read the settings, build a one-connection pool and check that the database answers
    within ``--connect-timeout``."""
    settings = _settings(args)
    url: Any = args.url or settings.jobs_datasource().sqlalchemy_url()
    # the dialect decides the driver's name of the connect timeout; no connection yet
    url_dialect = dialect_of(url)
    timeout_key = "timeout" if url_dialect.name == "postgresql" else "connect_timeout"
    pooler = args.pooler or (
        settings.jobs.config.pooler if url_dialect.name == "postgresql" else None
    )
    provider = ConnectionProvider.from_url(
        url, pool_size=1, pooler=pooler, connect_args={timeout_key: args.connect_timeout}
    )
    store = open_store(provider.engine, args.dialect or provider.dialect, DEFAULT_TABLE_NAME)
    knobs = settings.jobs.config
    window = dead_after(knobs.heartbeat_interval, knobs.missed_heartbeats_limit)
    ctx = Context(
        args=args,
        provider=provider,
        store=store,
        client=SchedulerClient(store, {}, dead_after=window),
        out=out,
        overdue_after=overdue_after(knobs.polling_interval),
        dead_after=window,
        settings=settings,
    )
    try:
        async with asyncio.timeout(args.connect_timeout + 2):
            async with provider.engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
    except Exception as error:
        await provider.dispose()
        diagnosis = store.db.diagnose(error)
        if diagnosis.condition == "login-refused":  # a setting to fix; it names where
            raise CliError(EXIT.USAGE, diagnosis.message) from None
        if diagnosis.reachable:
            raise CliError(
                EXIT.FAILED, f"the database at {ctx.safe_url()} answered: {diagnosis.message}"
            ) from None
        raise CliError(
            EXIT.UNREACHABLE,
            f"cannot reach the database at {ctx.safe_url()} within {args.connect_timeout:g} s: "
            f"{diagnosis.message}",
        ) from None
    return ctx
