"""``ekbatan-jobs``: operate the jobs tables from a shell (migrate, list, history, run-now,
pause, resume, instances). See docs/cli.md.

The database is ``--url`` or, as for the application, the ``jobs-config`` slot of the settings
(``EKBATAN_...`` environment variables, the YAML file of ``EKBATAN_CONFIG_FILE`` or
``--config``). It talks to the database only, through the same client as the application: no
job code is loaded and no scheduler runs here.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from ..domain.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    EkbatanError,
    ScheduleError,
    SchemaMissingError,
    TaskNotFoundError,
    TaskPausedError,
    TaskPickedError,
    UnknownJobError,
)
from .args import parser
from .commands import COMMANDS
from .context import EXIT, CliError, connect
from .output import Output

__all__ = ["EXIT", "main", "parser", "run"]


async def run(args: argparse.Namespace, out: Output) -> int:
    """Run one parsed command; returns the exit code."""
    try:
        ctx = await connect(args, out)
    except CliError as error:
        return out.fail(error.code, str(error))
    except ConfigurationError as error:
        return out.fail(EXIT.USAGE, str(error))
    try:
        await COMMANDS[args.command](ctx)
        return EXIT.OK
    except CliError as error:
        return out.fail(error.code, str(error))
    except SchemaMissingError as error:
        return out.fail(EXIT.SCHEMA_MISSING, str(error))
    except (ConfigurationError, ScheduleError) as error:
        return out.fail(EXIT.USAGE, str(error))
    except (TaskNotFoundError, UnknownJobError) as error:
        return out.fail(EXIT.UNKNOWN_TASK, str(error))
    except (TaskPickedError, TaskPausedError) as error:
        return out.fail(EXIT.CONFLICT, str(error))
    except DatabaseUnavailable as error:  # it names where already
        return out.fail(EXIT.UNREACHABLE, f"lost the database: {error}")
    except EkbatanError as error:
        return out.fail(EXIT.FAILED, str(error))
    except (OSError, TimeoutError) as error:
        return out.fail(EXIT.UNREACHABLE, f"lost the database at {ctx.safe_url()}: {error}")
    finally:
        await ctx.provider.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``ekbatan-jobs`` console script."""
    args = parser().parse_args(argv)
    out = Output(json_mode=args.json)
    try:
        return asyncio.run(run(args, out))
    except KeyboardInterrupt:
        return out.fail(130, "interrupted")
