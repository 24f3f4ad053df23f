"""The real components of production deployments, started privately for tests and harnesses.

* ``pgbouncer()``: Debian's ``pgbouncer`` (``apt-get install pgbouncer``) on a free loopback
  port, in front of a PostgreSQL server, in ``transaction`` or ``session`` pooling mode, with a
  small server pool so that clients really share server connections.
* ``primary_and_replica()``: a private PostgreSQL 15 primary on a loopback port and a streaming
  replica made with ``pg_basebackup -R`` (the machine's binaries in /usr/lib/postgresql/15/bin),
  with the faults of a failover: ``freeze`` (SIGSTOP of the primary's postmaster and every
  backend: TCP still accepts, nothing answers), ``fence`` (``default_transaction_read_only``
  and a reload: every write fails with SQLSTATE 25006), ``stop`` and ``promote``.

The shared servers of the machine (127.0.0.1:5432, MariaDB) are never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

__all__ = [
    "PG15_BIN",
    "Bouncer",
    "Pair",
    "have_pg15",
    "have_pgbouncer",
    "pgbouncer",
    "primary_and_replica",
]


def have_pgbouncer() -> bool:
    return Path(PGBOUNCER).exists()


def have_pg15() -> bool:
    return (PG15_BIN / "pg_ctl").exists() and shutil.which("runuser") is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _own(path: Path, user: str = "postgres") -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(cmd: list[str], timeout: float = 120.0) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g}s")


# -- PgBouncer ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Bouncer:
    """A running pgbouncer: ``url(database)`` reaches a database of the server through it."""

    port: int
    mode: str
    server_url: str
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, database_url: str) -> str:
        """``database_url`` (a database of the server behind) through the bouncer."""
        parsed = make_url(database_url)
        return (
            parsed.set(host="127.0.0.1", port=self.port)
            .difference_update_query(["host"])
            .render_as_string(hide_password=False)
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def pgbouncer(
    server_url: str,
    *,
    mode: str = "transaction",
    pool_size: int = 2,
    client_password: str | None = None,
) -> Iterator[Bouncer]:
    """pgbouncer in ``mode`` in front of the PostgreSQL server of ``server_url`` (every
    database of it, trust authentication, at most ``pool_size`` server connections per
    database: far fewer than clients, so that clients share them). ``client_password``:
    clients must log in with it (SCRAM), as the server's user; a wrong one is refused as a
    server refuses it (SQLSTATE 28P01)."""
    if not have_pgbouncer():
        raise RuntimeError("pgbouncer is not installed: apt-get install pgbouncer")
    parsed = make_url(server_url)
    socket_dir = parsed.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else (parsed.host or "127.0.0.1")
    user = parsed.username or "postgres"
    # pgbouncer refuses to run as root: as root it runs as "postgres", or, for a server on a
    # Unix socket (the embedded PostgreSQL), as the socket directory's owner, the only user
    # who may open it.
    runs_as = "postgres"
    if isinstance(socket_dir, str) and os.geteuid() == 0:
        runs_as = pwd.getpwuid(Path(socket_dir).stat().st_uid).pw_name
    base = Path(tempfile.mkdtemp(prefix="ekbatan-pgbouncer-"))
    _own(base, runs_as)
    port = _free_port()
    password = f" password={parsed.password}" if parsed.password else ""
    (base / "users.txt").write_text(f'"{user}" "{client_password or ""}"\n')
    auth_type = "scram-sha-256" if client_password else "trust"
    (base / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={parsed.port or 5432} user={user}{password}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = {auth_type}\nauth_file = {base}/users.txt\n"
        f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\n"
        "max_client_conn = 500\nserver_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {base}/pgbouncer.log\npidfile = {base}/pgbouncer.pid\n"
        "admin_users = postgres\n"
    )
    for name in ("users.txt", "pgbouncer.ini"):
        _own(base / name, runs_as)
    cmd = [PGBOUNCER, str(base / "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd = [PGBOUNCER, "-u", runs_as, str(base / "pgbouncer.ini")]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        yield Bouncer(port, mode, server_url, process, base / "pgbouncer.log")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(base, ignore_errors=True)


# -- a primary and its replica ------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    """One private PostgreSQL 15 server."""

    name: str
    data: Path
    port: int
    log: Path

    def pg_ctl(self, *args: str, timeout: float = 60.0) -> str:
        return _run(
            [*_as_postgres(), str(PG15_BIN / "pg_ctl"), "-D", str(self.data), *args],
            timeout=timeout,
        )

    def psql(self, sql: str, database: str = "postgres") -> str:
        return psql(self.port, sql, database)

    def pids(self) -> list[int]:
        """The postmaster and every process it started (backends, walsender, ...)."""
        head = (self.data / "postmaster.pid").read_text().splitlines()[0]
        postmaster = int(head)
        children = _run(["ps", "-o", "pid=", "--ppid", str(postmaster)]).split()
        return [postmaster, *map(int, children)]


@dataclasses.dataclass
class Pair:
    """A primary and its streaming replica; ``url`` names both hosts (the primary first)."""

    primary: Node
    replica: Node
    frozen: list[int] = dataclasses.field(default_factory=list)

    def url(self, database: str = "postgres", *, attrs: str = "read-write") -> str:
        """A multi-host URL: ``?host=A&host=B&target_session_attrs=read-write``."""
        return (
            f"postgresql+asyncpg://postgres@/{database}?host=127.0.0.1:{self.primary.port}"
            f"&host=127.0.0.1:{self.replica.port}&target_session_attrs={attrs}"
        )

    def primary_url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.primary.port}/{database}"

    def freeze(self) -> None:
        """SIGSTOP the primary (postmaster and backends): connections stay open and silent,
        new TCP connections are accepted by the kernel and never answered."""
        self.frozen = self.primary.pids()
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def fence(self) -> None:
        """Turn the primary read-only (as a failover manager fences the old primary)."""
        self.primary.psql("ALTER SYSTEM SET default_transaction_read_only = on")
        self.primary.psql("SELECT pg_reload_conf()")

    def promote(self) -> None:
        self.replica.pg_ctl("promote", "-w", "-t", "60")

    def wait_replicated(self, database: str, timeout: float = 30.0) -> None:
        """Until ``database`` exists on the replica."""
        deadline = time.monotonic() + timeout
        sql = f"SELECT 1 FROM pg_database WHERE datname = '{database}'"
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                if self.replica.psql(sql) == "1":
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{database} did not reach the replica in {timeout:g}s")


_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={sock} "
    "-c max_connections=100 -c fsync=off -c autovacuum=off "
    "-c wal_level=replica -c max_wal_senders=5 -c hot_standby=on -c wal_keep_size=64MB"
)


@contextlib.contextmanager
def primary_and_replica(*, synchronous: bool = False) -> Iterator[Pair]:
    """A private primary (trust authentication, loopback only) and its ``pg_basebackup -R``
    replica, both started; stopped and deleted afterwards (thawed first if frozen).
    ``synchronous``: a commit is acknowledged once the replica has it (what an HA setup that
    must not lose acknowledged commits runs, e.g. Patroni's synchronous mode)."""
    if not have_pg15():
        raise RuntimeError(f"needs PostgreSQL 15's binaries in {PG15_BIN} and runuser")
    base = Path(tempfile.mkdtemp(prefix="ekbatan-ha-"))
    _own(base)
    sock = base / "sock"
    sock.mkdir()
    _own(sock)
    primary = Node("primary", base / "primary", _free_port(), base / "primary.log")
    replica = Node("replica", base / "replica", _free_port(), base / "replica.log")
    pair = Pair(primary, replica)
    started: list[Node] = []
    try:
        _run(
            [
                *_as_postgres(),
                str(PG15_BIN / "initdb"),
                "-D",
                str(primary.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ]
        )
        with (primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        options = _OPTIONS.format(port=primary.port, sock=sock)
        primary.pg_ctl("-l", str(primary.log), "-w", "-t", "60", "-o", options, "start")
        started.append(primary)
        _run(
            [
                *_as_postgres(),
                str(PG15_BIN / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(replica.data),
                "-R",
                "-X",
                "stream",
            ]
        )
        options = _OPTIONS.format(port=replica.port, sock=sock)
        replica.pg_ctl("-l", str(replica.log), "-w", "-t", "60", "-o", options, "start")
        started.append(replica)
        if synchronous:
            primary.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.psql("SELECT pg_reload_conf()")
        yield pair
    finally:
        pair.thaw()
        for node in started:
            with contextlib.suppress(Exception):
                node.pg_ctl("-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(base, ignore_errors=True)


def psql(port: int, sql: str, database: str = "postgres") -> str:
    """``sql`` through PostgreSQL 15's psql on 127.0.0.1:``port`` as ``postgres`` (unaligned)."""
    args = ["-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database, "-Atc", sql]
    return _run([str(PG15_BIN / "psql"), *args]).strip()
