"""A 3-node MariaDB Galera cluster on this one machine, from Debian's packages, for tests and
harnesses.

    with galera_cluster() as cluster:
        cluster.url(0, "test")        # node 1 (each node takes writes: multi-primary)
        cluster.kill(2)               # SIGKILL node 3's mariadbd

What runs (``apt-get install galera-4 rsync``; MariaDB's server, /usr/sbin/mariadbd): three
``mariadbd`` processes with ``wsrep_on``, the provider ``libgalera_smm.so`` of galera-4, each
with its own data directory, client port, group-communication port and IST/SST ports on the
loopback; the first node bootstraps the cluster (``--wsrep-new-cluster``), the others join it
and receive a state snapshot with ``rsync``. Every node takes writes (multi-primary), as a
round-robin load balancer in front of the cluster gives. ``root@127.0.0.1`` logs in without
a password. The machine's own MariaDB (3306) is never touched; everything is stopped and
deleted at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.servers import _free_port, _run

__all__ = ["GaleraCluster", "GaleraNode", "galera_cluster", "galera_provider", "have_galera"]

MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
CLIENT = shutil.which("mariadb") or shutil.which("mysql") or "/usr/bin/mariadb"
_PROVIDERS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so")


def galera_provider() -> str | None:
    """The galera-4 provider library (Debian installs it in /usr/lib/galera)."""
    return next((p for p in _PROVIDERS if Path(p).exists()), None)


def have_galera() -> bool:
    return (
        galera_provider() is not None
        and Path(MARIADBD).exists()
        and Path(INSTALL_DB).exists()
        and shutil.which("rsync") is not None
    )


@dataclasses.dataclass
class GaleraNode:
    index: int
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    data: Path
    config: Path
    log: Path
    socket: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"g{self.index + 1}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def sql(self, statement: str, timeout: float = 30.0) -> str:
        """One statement over the node's Unix socket, as root; its tab-separated answer."""
        return _run(
            [CLIENT, f"--socket={self.socket}", "-uroot", "-N", "-B", "-e", statement],
            timeout=timeout,
        ).strip()

    def status(self, variable: str) -> str | None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            line = self.sql(f"SHOW GLOBAL STATUS LIKE '{variable}'", timeout=5)
            return line.split("\t")[1] if "\t" in line else None
        return None


@dataclasses.dataclass
class GaleraCluster:
    base: Path
    nodes: list[GaleraNode]

    def url(self, index: int, database: str = "test") -> str:
        return f"mysql+asyncmy://root@127.0.0.1:{self.nodes[index].port}/{database}"

    def kill(self, index: int) -> GaleraNode:
        """SIGKILL one node's mariadbd (the others evict it after ``evs.suspect_timeout``)."""
        node = self.nodes[index]
        assert node.process is not None
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        return node

    def size(self, index: int) -> int:
        value = self.nodes[index].status("wsrep_cluster_size")
        return int(value) if value else 0

    def wait_size(self, size: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        live = [n.index for n in self.nodes if n.alive]
        while time.monotonic() < deadline:
            if all(self.size(i) == size for i in live):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Galera cluster did not reach {size} nodes in {timeout:g}s")


def _config(node: GaleraNode, peers: list[GaleraNode], provider: str, options: str) -> str:
    provider_options = (
        f"base_port={node.gcomm_port};ist.recv_addr=127.0.0.1:{node.ist_port};gcache.size=32M"
        + (f";{options}" if options else "")
    )
    addresses = ",".join(f"127.0.0.1:{p.gcomm_port}" for p in peers)
    return f"""[mysqld]
user = mysql
datadir = {node.data}
socket = {node.socket}
port = {node.port}
bind-address = 127.0.0.1
pid-file = {node.data.parent}/{node.name}.pid
log-error = {node.log}
skip-name-resolve
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
innodb_flush_log_at_trx_commit = 0
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
max_connections = 300
wsrep_on = ON
wsrep_provider = {provider}
wsrep_cluster_name = ekbatan
wsrep_cluster_address = gcomm://{addresses}
wsrep_node_name = {node.name}
wsrep_node_address = 127.0.0.1:{node.gcomm_port}
wsrep_provider_options = "{provider_options}"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:{node.sst_port}
[client]
socket = {node.socket}
"""


def _chown_mysql(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("mysql")
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, d) for d in dirs)]:
                os.chown(name, entry.pw_uid, entry.pw_gid)
            for name in files:
                os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def _start(node: GaleraNode, *, bootstrap: bool) -> None:
    args = [MARIADBD, f"--defaults-file={node.config}"]
    if bootstrap:
        args.append("--wsrep-new-cluster")
    node.process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=node.data.parent
    )


def _wait_synced(node: GaleraNode, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not node.alive:
            log = node.log.read_text(errors="replace")[-3000:] if node.log.exists() else ""
            raise RuntimeError(f"Galera node {node.name} exited:\n{log}")
        if node.status("wsrep_local_state_comment") == "Synced":
            return
        time.sleep(0.2)
    raise RuntimeError(f"Galera node {node.name} not synced in {timeout:g}s")


@contextlib.contextmanager
def galera_cluster(*, nodes: int = 3, provider_options: str = "") -> Iterator[GaleraCluster]:
    """``nodes`` MariaDB Galera nodes, bootstrapped and synced; a database ``test`` exists.
    ``provider_options``: more ``wsrep_provider_options`` (e.g. ``evs.suspect_timeout=PT2S``);
    Galera's defaults otherwise."""
    provider = galera_provider()
    if provider is None or not have_galera():
        raise RuntimeError(
            "needs Debian's galera-4, rsync and MariaDB's server (apt-get install galera-4 "
            "rsync mariadb-server)"
        )
    base = Path(tempfile.mkdtemp(prefix="ekbatan-galera-"))
    members = [
        GaleraNode(
            i,
            _free_port(),
            _free_port(),
            _free_port(),
            _free_port(),
            base / f"g{i + 1}",
            base / f"g{i + 1}.cnf",
            base / f"g{i + 1}.err",
            base / f"g{i + 1}.sock",
        )
        for i in range(nodes)
    ]
    cluster = GaleraCluster(base, members)
    try:
        for node in members:
            node.data.mkdir()
            node.config.write_text(_config(node, members, provider, provider_options))
        _chown_mysql(base)
        _run(
            [
                INSTALL_DB,
                f"--defaults-file={members[0].config}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            timeout=120,
        )
        _chown_mysql(base)
        _start(members[0], bootstrap=True)
        _wait_synced(members[0])
        first = members[0]
        first.sql(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
            "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; "
            "CREATE DATABASE IF NOT EXISTS test"
        )
        for node in members[1:]:  # one by one: each receives its snapshot from a synced node
            _start(node, bootstrap=False)
            _wait_synced(node)
        cluster.wait_size(nodes)
        yield cluster
    finally:
        for node in members:
            if node.alive and node.process is not None:
                node.process.terminate()
        for node in members:
            if node.process is not None:
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":  # a smoke run: start, write on one node, read on another
    with galera_cluster() as c:
        c.nodes[0].sql("CREATE TABLE test.t (id int primary key); INSERT INTO test.t VALUES (1)")
        print("on g3:", c.nodes[2].sql("SELECT * FROM test.t"))
        print("wsrep_on:", c.nodes[1].sql("SELECT @@wsrep_on"))
        began = time.monotonic()
        c.kill(2)
        c.wait_size(2)
        print(f"g3 killed; cluster size 2 after {time.monotonic() - began:.2f}s")
