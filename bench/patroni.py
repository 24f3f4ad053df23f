"""A Patroni 3 cluster on this one machine, from Debian's packages, for tests and harnesses.

    with patroni_cluster() as cluster:      # etcd, 3 PostgreSQL 15 nodes, HAProxy
        cluster.haproxy_url("postgres")     # through HAProxy (Patroni's /primary check)
        cluster.url("postgres")             # the multi-host URL (target_session_attrs)
        cluster.switchover()                # patronictl switchover to a replica
        cluster.kill_postmaster()           # SIGKILL the leader's postmaster
        cluster.freeze()/cluster.thaw()     # SIGSTOP/SIGCONT the leader's PostgreSQL

What runs (``apt-get install patroni etcd-server haproxy``; PostgreSQL 15's binaries in
/usr/lib/postgresql/15/bin):

* one ``etcd`` (3.4) on private loopback ports, its data in the cluster's directory;
* three ``patroni`` processes (run as ``postgres``: PostgreSQL refuses root), each managing a
  PostgreSQL 15 node with its own data directory, port and REST API; Patroni bootstraps the
  first leader and clones the replicas with ``pg_basebackup``; ``pg_rewind`` is on;
* one ``haproxy`` in TCP mode whose backends are the three nodes, checked with Patroni's REST
  ``OPTIONS /primary`` (200 on the leader only), with Patroni's documented settings
  (``inter 3s fall 3 rise 2 on-marked-down shutdown-sessions``) unless ``check_interval`` says
  otherwise.

Patroni's timing is tightened for a test (``loop_wait`` 1 s, ``ttl`` 20 s, ``retry_timeout``
5 s; production defaults are 10/30/10). The shared servers of the machine are never touched;
everything is stopped and deleted at the end: with ``EKBATAN_PATRONI_LOGS=<dir>`` the logs of
Patroni, PostgreSQL (which then logs each connection), etcd and HAProxy are copied there first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.servers import (
    PG15_BIN,
    _as_postgres,
    _free_port,
    _own,
    _run,
    _wait_port,
    have_pg15,
    psql,
)

__all__ = ["PatroniCluster", "PatroniNode", "have_patroni", "patroni_cluster"]

PATRONI = shutil.which("patroni") or "/usr/bin/patroni"
PATRONICTL = shutil.which("patronictl") or "/usr/bin/patronictl"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

_TTL, _LOOP_WAIT, _RETRY_TIMEOUT = 20, 1, 5

_ETCD_V2_CLIENT = "/usr/lib/python3/dist-packages/etcd/__init__.py"
"""Debian's python3-etcd: Patroni's client of etcd's v2 API (``dcs="etcd"``)."""


def have_patroni() -> bool:
    """Debian's patroni, etcd-server, haproxy and python3-etcd, and PostgreSQL 15's binaries."""
    return (
        have_pg15()
        and all(Path(p).exists() for p in (PATRONI, PATRONICTL, ETCD, HAPROXY))
        and Path(_ETCD_V2_CLIENT).exists()
    )


def _clean_env() -> dict[str, str]:
    """Patroni is Debian's Python program: none of this process's Python settings."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/var/lib/postgresql",
    }


@dataclasses.dataclass
class PatroniNode:
    name: str
    port: int
    rest_port: int
    data: Path
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def rest(self, path: str, timeout: float = 1.0) -> tuple[int, dict[str, object]]:
        """``GET`` the node's REST API: (status, JSON body); (0, {}) when it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout
            ) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = error.read()
            with contextlib.suppress(ValueError):
                return error.code, json.loads(body or b"{}")
            return error.code, {}
        except (OSError, ValueError):
            return 0, {}

    def postmaster(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return None

    def pids(self) -> list[int]:
        """The postmaster and every process it started."""
        head = self.postmaster()
        if head is None:
            return []
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(head)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [head, *map(int, children)]

    def psql(self, sql: str, database: str = "postgres") -> str:
        return psql(self.port, sql, database)


@dataclasses.dataclass
class PatroniCluster:
    base: Path
    scope: str
    etcd_port: int
    nodes: list[PatroniNode]
    haproxy_port: int
    haproxy_log: Path
    check_interval: float
    frozen: list[int] = dataclasses.field(default_factory=list)

    # -- where clients connect -------------------------------------------------------------

    def haproxy_url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.haproxy_port}/{database}"

    def url(self, database: str = "postgres") -> str:
        """The multi-host URL of the three nodes, ``target_session_attrs=read-write``."""
        hosts = "&".join(f"host=127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql+asyncpg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def leader_url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.leader().port}/{database}"

    # -- state -------------------------------------------------------------------------------

    def leader(self, timeout: float = 60.0) -> PatroniNode:
        """The node whose ``/primary`` answers 200 (waits for one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.rest("/primary")[0] == 200:
                    return node
            time.sleep(0.1)
        raise RuntimeError(f"no Patroni leader in {timeout:g}s:\n{self.list()}")

    def replicas_streaming(self, timeout: float = 90.0) -> None:
        """Until every node other than the leader is a streaming replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            others = [n for n in self.nodes if n is not leader]
            if all(n.rest("/replica")[0] == 200 for n in others):
                status, body = leader.rest("/cluster")
                members = body.get("members", []) if status == 200 else []
                members = members if isinstance(members, list) else []
                states = [m.get("state") for m in members if isinstance(m, dict)]
                if sum(s in ("running", "streaming") for s in states) > len(others):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the replicas did not stream in {timeout:g}s:\n{self.list()}")

    def list(self) -> str:
        done = subprocess.run(
            [PATRONICTL, "-c", str(self.nodes[0].config), "list"],
            capture_output=True,
            text=True,
            env=_clean_env(),
            check=False,
            timeout=30,
        )
        return done.stdout + done.stderr

    def haproxy_backend(self) -> str | None:
        """The nodes HAProxy considers up (its stats socket), joined by ``+``; None when none
        is (two at once: both answered ``/primary`` 200)."""
        with socket.socket(socket.AF_UNIX) as stats:
            stats.settimeout(2)
            stats.connect(str(self.base / "haproxy.sock"))
            stats.sendall(b"show stat\n")
            out = b""
            while chunk := stats.recv(65536):
                out += chunk
        up = [
            parts[1]
            for parts in (line.split(",") for line in out.decode().splitlines())
            if len(parts) > 17
            and parts[0] == "primary"
            and parts[1] not in ("FRONTEND", "BACKEND")
            and parts[17] == "UP"
        ]
        return "+".join(up) or None

    # -- faults -------------------------------------------------------------------------------

    def switchover(self, candidate: PatroniNode | None = None) -> tuple[str, str]:
        """``patronictl switchover --force``: the leader hands over to ``candidate`` (the
        first replica by default). Returns (old leader, new leader); returns when done."""
        leader = self.leader()
        target = candidate or next(n for n in self.nodes if n is not leader)
        _run(
            [
                *_as_postgres(),
                "env",
                *[f"{k}={v}" for k, v in _clean_env().items()],
                PATRONICTL,
                "-c",
                str(leader.config),
                "switchover",
                self.scope,
                "--leader",
                leader.name,
                "--candidate",
                target.name,
                "--force",
            ],
            timeout=90,
        )
        return leader.name, target.name

    def kill_postmaster(self) -> PatroniNode:
        """SIGKILL the leader's postmaster (Patroni, alive, notices and restarts it, or fails
        over)."""
        leader = self.leader()
        pid = leader.postmaster()
        if pid is None:
            raise RuntimeError(f"{leader.name} has no postmaster.pid")
        os.kill(pid, signal.SIGKILL)
        return leader

    def freeze(self) -> PatroniNode:
        """SIGSTOP the leader's PostgreSQL (postmaster and every backend): its connections
        stay open and silent; its Patroni, alive, cannot reach it either."""
        leader = self.leader()
        self.frozen = leader.pids()
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return leader

    def thaw(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []


_DIAGNOSIS = (
    {"log_connections": "on", "log_line_prefix": "%m [%p] "}
    if os.environ.get("EKBATAN_PATRONI_LOGS")
    else {}
)
"""With the logs kept (``EKBATAN_PATRONI_LOGS``): each node logs when a client connected to it
(which node each scheduler reached, and when)."""


def _patroni_config(
    scope: str, node: PatroniNode, etcd_port: int, sock: Path, *, synchronous: bool, dcs: str
) -> str:
    # JSON is YAML: no YAML writer needed.
    config = {
        "scope": scope,
        "namespace": "/ekbatan/",
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{node.rest_port}",
            "connect_address": f"127.0.0.1:{node.rest_port}",
        },
        dcs: {"host": f"127.0.0.1:{etcd_port}"},
        "bootstrap": {
            "dcs": {
                "ttl": _TTL,
                "loop_wait": _LOOP_WAIT,
                "retry_timeout": _RETRY_TIMEOUT,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": synchronous,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "max_connections": 100,
                        "fsync": "off",
                        "autovacuum": "off",
                        **_DIAGNOSIS,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, {"auth": "trust"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.port}",
            "connect_address": f"127.0.0.1:{node.port}",
            "data_dir": str(node.data),
            "bin_dir": str(PG15_BIN),
            "pgpass": str(node.data.parent / f"{node.name}.pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": "postgres"},
                "replication": {"username": "postgres", "password": "postgres"},
                "rewind": {"username": "postgres", "password": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": {"unix_socket_directories": str(sock)},
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }
    return json.dumps(config, indent=1)


def _haproxy_config(
    port: int, nodes: list[PatroniNode], base: Path, check_interval: float, fall: int, rise: int
) -> str:
    inter = f"{int(check_interval * 1000)}ms"
    servers = "\n".join(
        f"    server {n.name} 127.0.0.1:{n.port} maxconn 100 check port {n.rest_port}"
        for n in nodes
    )
    return f"""global
    maxconn 200
    stats socket {base}/haproxy.sock mode 600 level admin
defaults
    mode tcp
    log global
    retries 2
    timeout queue 5s
    timeout connect 4s
    timeout client 30m
    timeout server 30m
    timeout check 2s
listen primary
    bind 127.0.0.1:{port}
    option httpchk OPTIONS /primary
    http-check expect status 200
    default-server inter {inter} fall {fall} rise {rise} on-marked-down shutdown-sessions
{servers}
"""


def _stop(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@contextlib.contextmanager
def patroni_cluster(
    *,
    nodes: int = 3,
    check_interval: float = 3.0,
    fall: int = 3,
    rise: int = 2,
    synchronous: bool = False,
    dcs: str = "etcd3",
) -> Iterator[PatroniCluster]:
    """etcd, ``nodes`` Patroni-managed PostgreSQL 15 nodes (one leader, streaming replicas)
    and HAProxy in front of them; everything stopped and deleted at the end.
    ``check_interval``/``fall``/``rise``: HAProxy's health check of Patroni's ``/primary``
    (Patroni's documented template: 3 s, 3, 2). ``synchronous``: Patroni's
    ``synchronous_mode``. ``dcs``: Patroni's etcd API, ``etcd3`` or ``etcd`` (v2, served by
    etcd 3.4 with ``--enable-v2``): Patroni 3.0.2's ``etcd3`` code overwrites the leader key
    unconditionally when it renews an expired lease (fixed in 3.0.3, patroni#2689), which
    the frozen-leader scenario shows; its v2 code compares the key's value first."""
    if dcs not in ("etcd3", "etcd"):
        raise ValueError(f"dcs must be etcd3 or etcd, not {dcs!r}")
    if not have_patroni():
        raise RuntimeError(
            "needs Debian's patroni, etcd-server and haproxy (apt-get install patroni "
            f"etcd-server haproxy) and PostgreSQL 15's binaries in {PG15_BIN}"
        )
    base = Path(tempfile.mkdtemp(prefix="ekbatan-patroni-"))
    _own(base)
    sock = base / "sock"
    sock.mkdir()
    _own(sock)
    scope = f"ekbatan-{uuid.uuid4().hex[:8]}"
    etcd_port, etcd_peer = _free_port(), _free_port()
    members = [
        PatroniNode(
            f"pg{i + 1}",
            _free_port(),
            _free_port(),
            base / f"pg{i + 1}",
            base / f"pg{i + 1}.yml",
            base / f"pg{i + 1}.log",
        )
        for i in range(nodes)
    ]
    cluster = PatroniCluster(
        base, scope, etcd_port, members, _free_port(), base / "haproxy.log", check_interval
    )
    etcd: subprocess.Popen[bytes] | None = None
    haproxy: subprocess.Popen[bytes] | None = None
    logs = contextlib.ExitStack()  # the processes' log files, closed at the end
    try:
        etcd = subprocess.Popen(
            [
                ETCD,
                "--name",
                "e1",
                "--data-dir",
                str(base / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster",
                f"e1=http://127.0.0.1:{etcd_peer}",
                "--log-level",
                "warn",
                *(["--enable-v2"] if dcs == "etcd" else []),
            ],
            stdout=logs.enter_context((base / "etcd.log").open("wb")),
            stderr=subprocess.STDOUT,
            env=_clean_env(),
        )
        _wait_port(etcd_port)
        for index, node in enumerate(members):
            node.config.write_text(
                _patroni_config(scope, node, etcd_port, sock, synchronous=synchronous, dcs=dcs)
            )
            _own(node.config)
            node.process = subprocess.Popen(
                [*_as_postgres(), PATRONI, str(node.config)],
                stdout=logs.enter_context(node.log.open("wb")),
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                cwd=base,
            )
            if index == 0:
                cluster.leader(timeout=90)  # the first node bootstraps; then the replicas
        cluster.replicas_streaming()
        (base / "haproxy.cfg").write_text(
            _haproxy_config(cluster.haproxy_port, members, base, check_interval, fall, rise)
        )
        haproxy = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(base / "haproxy.cfg")],
            stdout=logs.enter_context(cluster.haproxy_log.open("wb")),
            stderr=subprocess.STDOUT,
            env=_clean_env(),
        )
        _wait_port(cluster.haproxy_port)
        # until HAProxy has marked the leader up (rise checks)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                _run(
                    [
                        str(PG15_BIN / "psql"),
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(cluster.haproxy_port),
                        "-U",
                        "postgres",
                        "-Atc",
                        "SELECT 1",
                    ],
                    timeout=10,
                )
                break
            time.sleep(0.2)
        yield cluster
    finally:
        cluster.thaw()
        _stop(haproxy)
        for node in members:
            _stop(node.process)  # Patroni stops its PostgreSQL
        for node in members:  # a PostgreSQL that Patroni left behind
            pid = node.postmaster()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)
        _stop(etcd)
        logs.close()
        keep = os.environ.get("EKBATAN_PATRONI_LOGS")
        if keep:  # the run's Patroni, PostgreSQL, etcd and HAProxy logs, for a post-mortem
            target = Path(keep) / base.name
            target.mkdir(parents=True, exist_ok=True)
            for log in base.glob("*.log"):
                shutil.copy(log, target / log.name)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":  # a smoke run: start, switch over, print the state
    with patroni_cluster() as c:
        print(c.list())
        began = time.monotonic()
        print("switchover", c.switchover(), f"{time.monotonic() - began:.2f}s")
        print(c.list())
