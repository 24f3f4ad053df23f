"""The chaos harness's cluster: scheduler processes, a loopback proxy per process, faults.

Every process reaches the database through its own proxy on 127.0.0.1, so the harness can
cut one process off (a partition) or all of them (a database outage), and every fault is
written to a timetable (``Cluster.faults``) that the audit explains duplicates with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from ekbatan_fastapi.domain.durations import format_iso_duration

ROOT = Path(__file__).resolve().parents[2]  # the repository
JOBS_URL_ENV = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG__URL"

__all__ = ["Cluster", "Fault", "Knobs", "Node", "Probe", "Proxy", "free_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class _Link:
    """One proxied connection: the client's side, the database's side, the two pipes."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.frozen = False
        self.hold_answer = 0.0
        """Seconds to hold the next answer back (a statement ``delay_answer`` matched)."""
        self.armed: tuple[float, int] | None = None
        """A matched delay: its seconds, and how many more requests pass before it."""
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()
        for task in self.tasks:
            task.cancel()


class Proxy:
    """A loopback TCP proxy in front of the database that can cut or black-hole connections.

    ``cut()`` closes the listener and resets every connection (a restart: clients see the
    connection drop and new ones refused). ``blackhole()`` forwards nothing more on the open
    connections and accepts new ones that never get an answer (a partition in which packets
    vanish without a reset); ``heal(reset=False)`` then serves new connections again while the
    black-holed ones stay silent for good, as after a failover that no reset announced.
    """

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        socket_dir = url.query.get("host")
        mysql = url.get_backend_name() in ("mysql", "mariadb")
        port = url.port or (3306 if mysql else 5432)
        self._unix = f"{socket_dir}/.s.PGSQL.{port}" if isinstance(socket_dir, str) else None
        self._target = (url.host or "127.0.0.1", port)
        self.port = free_port()
        self.url = (
            url.set(host="127.0.0.1", port=self.port)
            .difference_update_query(["host"])
            .render_as_string(hide_password=False)
        )
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._every: list[_Link] = []
        """Every connection since the start, for ``close`` (its pipes may outlive a cut)."""
        self._closed = False
        self._holes = False
        self._never = asyncio.Event()
        self._delays: list[tuple[bytes, float, int]] = []
        self._freeze_after: list[bytes] = []
        self.matched: list[float] = []
        """When a ``delay_answer`` or ``blackhole_after`` pattern was seen (event-loop time)."""

    async def start(self) -> None:
        """Listen (again) and forward new connections."""
        self._holes = False
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Stop listening and reset every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await self._abort([*self._links])

    async def blackhole(self) -> None:
        """Forward nothing on open or new connections, and answer nothing."""
        self._holes = True
        for link in self._links:
            link.frozen = True

    def delay_answer(self, pattern: bytes, seconds: float, *, skip: int = 0) -> None:
        """Once: the answer to the next request containing ``pattern`` (or, with ``skip``,
        to the request that many requests after it: asyncpg sends a new statement's Parse and
        waits for its description before it sends Bind/Execute) arrives ``seconds`` late;
        the request itself goes through at once and executes: a slow network, whose client
        gives up on the statement while the server has done it."""
        self._delays.append((pattern, seconds, skip))

    def blackhole_after(self, pattern: bytes) -> None:
        """Once: the next request containing ``pattern`` goes through and executes, and from
        then on that connection forwards nothing (a partition right after the statement)."""
        self._freeze_after.append(pattern)

    def retarget(self, database_url: str) -> None:
        """New connections go to the server of ``database_url`` (a load balancer that moved a
        client to another node); open ones stay where they are."""
        url = make_url(database_url)
        self._target = (url.host or "127.0.0.1", url.port or 3306)
        self._unix = None

    async def heal(self, *, reset: bool) -> None:
        """End a black hole: new connections work; old ones are reset, or stay silent."""
        self._holes = False
        if reset:
            await self._abort([link for link in self._links if link.frozen])

    async def close(self) -> None:
        """Cut, and end every pipe still running (a connection accepted just before a cut, or
        one left frozen), so that no task or socket outlives the proxy."""
        self._closed = True
        await self.cut()
        every, self._every = self._every, []
        await self._abort(every)

    async def _abort(self, links: list[_Link]) -> None:
        tasks = [task for link in links for task in link.tasks]
        for link in links:
            link.abort()
            self._links.discard(link)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        if self._closed:
            link.abort()
            return
        self._links.add(link)
        self._every.append(link)
        if self._holes:
            link.frozen = True
            return  # held open, never answered
        try:
            if self._unix:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            link.abort()
            self._links.discard(link)
            return
        link.upstream = up_writer
        if link not in self._links:  # cut or reset while it connected: no pipes for it
            link.abort()
            return

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, requests: bool
        ) -> None:
            try:
                while data := await src.read(65536):
                    if link.frozen:
                        await self._never.wait()  # swallowed; ended by an abort
                    if requests:
                        self._match(link, data)
                    elif link.hold_answer:
                        held, link.hold_answer = link.hold_answer, 0.0
                        await asyncio.sleep(held)
                    dst.write(data)
                    await dst.drain()
                    if requests and link.frozen:
                        await self._never.wait()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                if not link.frozen:
                    dst.close()
                    self._links.discard(link)

        for coro in (
            pipe(reader, up_writer, requests=True),
            pipe(up_reader, writer, requests=False),
        ):
            link.tasks.append(asyncio.create_task(coro))

    def _match(self, link: _Link, data: bytes) -> None:
        if link.armed is not None:
            seconds, skip = link.armed
            link.armed = (seconds, skip - 1) if skip > 1 else None
            if skip == 1:
                link.hold_answer = seconds
            return
        for entry in self._delays:
            if entry[0] in data:
                self._delays.remove(entry)
                if entry[2]:
                    link.armed = (entry[1], entry[2])
                else:
                    link.hold_answer = entry[1]
                self.matched.append(asyncio.get_running_loop().time())
                return
        for pattern in self._freeze_after:
            if pattern in data:
                self._freeze_after.remove(pattern)
                link.frozen = True  # this request still goes through; nothing after it
                self.matched.append(asyncio.get_running_loop().time())
                return


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The scheduler settings every process of a run shares."""

    poll: float = 0.5
    heartbeat: float = 0.25
    missed: int = 6
    shutdown_wait: float = 1.0

    @property
    def dead_after(self) -> float:
        return self.heartbeat * self.missed


@dataclasses.dataclass
class Node:
    """One scheduler process: a plain registry process or a uvicorn process of the example."""

    label: str
    kind: str  # "plain" or "app"
    proxy: Proxy
    process: asyncio.subprocess.Process
    log: Path
    started: float
    port: int | None = None
    extras: tuple[str, ...] = ()
    clock_offset: float = 0.0
    exited: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclasses.dataclass
class Fault:
    """One injected fault: what, on which processes, from when to when (epoch seconds)."""

    kind: str
    """kill, stop, partition, blackhole, outage, restart, absent, terminate, block, lock, skew,
    failover, fence, delay"""
    targets: list[str]
    pids: list[int]
    began: float
    ended: float | None = None
    note: str = ""

    @property
    def everyone(self) -> bool:
        return self.kind in (
            "outage",
            "restart",
            "absent",
            "blackhole-all",
            "failover",
            "fence",
            "switchover",
            "leader-kill",
            "leader-frozen",
        )


@dataclasses.dataclass
class Probe:
    """One ``GET /jobs`` of an app process."""

    t: float
    label: str
    pid: int
    status: int | None
    seconds: float
    error: str | None = None
    lag_events: int | None = None
    max_lag: float | None = None
    read_at: float | None = None
    """When the answer's rows were read (its ``database_time``; the same machine's clock)."""

    def shown(self, fault_began: float) -> str:
        """The status, the transport error, or ``cached`` for a 200 whose rows were read
        before ``fault_began``: a page served again from the read budget's cache."""
        if self.status == 200 and self.read_at is not None and self.read_at < fault_began:
            return "cached"
        return str(self.status) if self.status else self.error or "?"


class Cluster:
    """Starts processes on one database, injects faults and records them."""

    def __init__(
        self,
        database_url: str,
        run_dir: Path,
        knobs: Knobs,
        *,
        recurring: int,
        deadline: float,
        dialect: str | None = None,
        direct: bool = False,
        pooler: str | None = None,
        statement_timeout: float | None = None,
        urls: dict[str, str] | None = None,
        polling_strategy: str | None = None,
    ) -> None:
        self.database_url = database_url
        self.urls = urls or {}
        """A process's own database URL by label (its proxy's target), ``database_url``
        otherwise (a multi-primary cluster: each process on its own node)."""
        self.polling_strategy = polling_strategy
        self.direct = direct
        """Processes connect to ``database_url`` itself (a multi-host URL), not to a proxy."""
        self.pooler = pooler
        self.statement_timeout = statement_timeout
        """Of the plain processes (None: the library's default)."""
        self.run_dir = run_dir
        self.knobs = knobs
        self.recurring = recurring
        self.deadline = deadline
        self.dialect = dialect
        self.ledger_dir = run_dir / "ledger"
        self.log_dir = run_dir / "logs"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.nodes: dict[str, Node] = {}
        self.history: list[Node] = []
        self.proxies: dict[str, Proxy] = {}
        self.faults: list[Fault] = []
        self.probes: list[Probe] = []
        self.marks: list[tuple[float, str]] = []
        self._probing: asyncio.Task[None] | None = None

    # -- processes -------------------------------------------------------------------------

    def _env(self, label: str, extras: tuple[str, ...]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EKBATAN_", "CHAOS_"))}
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            CHAOS_LEDGER_DIR=str(self.ledger_dir),
            CHAOS_RECURRING=str(self.recurring),
            CHAOS_EXTRA=",".join(extras),
            CHAOS_LABEL=label,
            CHAOS_DEADLINE=repr(self.deadline),
        )
        return env

    def _proxy(self, label: str) -> Proxy:
        if label not in self.proxies:
            # a direct cluster's proxies are never started (a multi-host URL has no one target)
            self.proxies[label] = Proxy(
                "postgresql://127.0.0.1/x"
                if self.direct
                else self.urls.get(label, self.database_url)
            )
        return self.proxies[label]

    def _url(self, proxy: Proxy) -> str:
        return self.database_url if self.direct else proxy.url

    async def start_plain(
        self,
        label: str,
        *,
        extras: tuple[str, ...] = (),
        clock_offset: float = 0.0,
        wait: str = "READY",
        timeout: float = 60.0,
    ) -> Node:
        """``python -m tests.chaos.worker``; waits for its ``STARTED`` or ``READY`` line."""
        proxy = self._proxy(label)
        if not self.faulted_everyone() and not self.direct:
            await proxy.start()
        k = self.knobs
        args = [
            sys.executable,
            "-m",
            "tests.chaos.worker",
            self._url(proxy),
            "--name",
            label,
            "--poll",
            repr(k.poll),
            "--heartbeat",
            repr(k.heartbeat),
            "--missed",
            str(k.missed),
            "--shutdown-wait",
            repr(k.shutdown_wait),
            "--clock-offset",
            repr(clock_offset),
        ]
        if self.dialect:
            args += ["--dialect", self.dialect]
        if self.pooler:
            args += ["--pooler", self.pooler]
        if self.statement_timeout is not None:
            args += ["--statement-timeout", repr(self.statement_timeout)]
        if self.polling_strategy:
            args += ["--strategy", self.polling_strategy]
        log = self.log_dir / f"{label}-{len(self.history)}.log"
        with log.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                *args,
                cwd=ROOT,
                env=self._env(label, extras),
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                stdin=asyncio.subprocess.DEVNULL,
            )
        node = Node(label, "plain", proxy, process, log, time.time(), None, extras, clock_offset)
        self._add(node)
        assert process.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = (await process.stdout.readline()).decode().strip()
                    if not line:
                        raise RuntimeError(f"{label} exited early:\n{_tail(log)}")
                    if line == wait or line == "READY":
                        break
        except TimeoutError:
            raise RuntimeError(f"{label} did not say {wait} in {timeout}s:\n{_tail(log)}") from None
        return node

    async def start_app(
        self,
        label: str,
        *,
        extras: tuple[str, ...] = (),
        wait_ready: bool = True,
        timeout: float = 60.0,
    ) -> Node:
        """``python -m tests.chaos.app --port N``: the example app with the chaos jobs added
        by discovery and the ledger's observer."""
        proxy = self._proxy(label)
        if not self.faulted_everyone() and not self.direct:
            await proxy.start()
        k = self.knobs
        port = free_port()
        env = self._env(label, extras)
        if self.pooler:
            env["EKBATAN_JOBS__POOLER"] = self.pooler
        env.update(
            {
                JOBS_URL_ENV: self._url(proxy),
                "EKBATAN_JOBS__MODULES": "tests.chaos.jobs",
                "EKBATAN_JOBS__POLLING_INTERVAL": _iso(k.poll),
                "EKBATAN_JOBS__HEARTBEAT_INTERVAL": _iso(k.heartbeat),
                "EKBATAN_JOBS__MISSED_HEARTBEATS_LIMIT": str(k.missed),
                "EKBATAN_JOBS__SHUTDOWN_MAX_WAIT": _iso(k.shutdown_wait),
                "EXAMPLE_DEMO_INTERVAL": "PT1S",
            }
        )
        args = [sys.executable, "-m", "tests.chaos.app", "--port", str(port)]
        args += ["--log-level", "warning"]
        log = self.log_dir / f"{label}-{len(self.history)}.log"
        with log.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                *args,
                cwd=ROOT,
                env=env,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
        node = Node(label, "app", proxy, process, log, time.time(), port, extras)
        self._add(node)
        await self._wait_http(node, ready=wait_ready, timeout=timeout)
        return node

    def _add(self, node: Node) -> None:
        self.nodes[node.label] = node
        self.history.append(node)

    async def _wait_http(self, node: Node, *, ready: bool, timeout: float) -> None:
        began = time.monotonic()
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() - began < timeout:
                if not node.alive:
                    raise RuntimeError(f"{node.label} exited early:\n{_tail(node.log)}")
                try:
                    response = await http.get(f"{node.base_url}/jobs")
                    if not ready or response.json()["scheduler"]["ready"]:
                        return
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{node.label} not ready in {timeout}s:\n{_tail(node.log)}")

    async def restart(self, node: Node) -> Node:
        """A new process in the place of a dead one (same label, proxy and jobs)."""
        if node.kind == "app":
            return await self.start_app(node.label, extras=node.extras)
        return await self.start_plain(
            node.label, extras=node.extras, clock_offset=node.clock_offset
        )

    # -- faults ----------------------------------------------------------------------------

    def fault(self, kind: str, nodes: list[Node], note: str = "") -> Fault:
        record = Fault(
            kind, [n.label for n in nodes], [n.pid for n in nodes], time.time(), None, note
        )
        self.faults.append(record)
        return record

    def faulted_everyone(self) -> bool:
        return any(f.everyone and f.ended is None for f in self.faults)

    def mark(self, what: str) -> None:
        self.marks.append((time.time(), what))

    async def kill(self, node: Node) -> Fault:
        fault = self.fault("kill", [node])
        node.process.send_signal(signal.SIGKILL)
        await node.process.wait()
        node.exited = fault.ended = time.time()
        return fault

    async def terminate(self, node: Node, timeout: float = 60.0) -> tuple[Fault, int | None]:
        """SIGTERM, then wait for the exit (SIGKILL after ``timeout``); the fault ends at exit."""
        fault = self.fault("terminate", [node])
        node.process.send_signal(signal.SIGTERM)
        code: int | None
        try:
            code = await asyncio.wait_for(node.process.wait(), timeout)
        except TimeoutError:
            node.process.kill()
            await node.process.wait()
            code = None
            fault.note = f"still running {timeout:g}s after SIGTERM: killed"
        node.exited = fault.ended = time.time()
        return fault, code

    async def stop(self, node: Node, seconds: float) -> Fault:
        """SIGSTOP for ``seconds``, then SIGCONT (a stalled process)."""
        fault = self.fault("stop", [node], "SIGSTOP, then SIGCONT")
        node.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            node.process.send_signal(signal.SIGCONT)
            fault.ended = time.time()
        return fault

    async def partition(self, nodes: list[Node], seconds: float, *, mode: str = "reset") -> Fault:
        """Cut these processes off the database for ``seconds``.

        ``reset``: connections reset and refused (a restart, or a partition with resets);
        ``blackhole``: nothing answers, and the silent connections are reset at the end;
        ``blackhole-forever``: nothing answers, and the silent connections stay silent.
        """
        everyone = {n.label for n in nodes} >= {n.label for n in self.live()}
        kind = ("outage" if everyone else "partition") if mode == "reset" else "blackhole"
        if kind == "blackhole" and everyone:
            kind = "blackhole-all"
        fault = self.fault(kind, nodes, mode)
        for node in nodes:
            await (node.proxy.cut() if mode == "reset" else node.proxy.blackhole())
        try:
            await asyncio.sleep(seconds)
        finally:
            for node in nodes:
                if mode == "reset":
                    await node.proxy.start()
                else:
                    await node.proxy.heal(reset=mode == "blackhole")
            fault.ended = time.time()
        return fault

    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.alive]

    # -- /jobs probes ----------------------------------------------------------------------

    def start_probing(self, interval: float = 0.25, timeout: float = 2.0) -> None:
        self._probing = asyncio.create_task(self._probe_loop(interval, timeout))

    async def stop_probing(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
            self._probing = None

    async def _probe_loop(self, interval: float, timeout: float) -> None:
        async with httpx.AsyncClient(timeout=timeout) as http:
            while time.time() < self.deadline:
                apps = [n for n in self.nodes.values() if n.kind == "app" and n.alive]
                await asyncio.gather(*(self._probe(http, n) for n in apps))
                await asyncio.sleep(interval)

    async def _probe(self, http: httpx.AsyncClient, node: Node) -> None:
        began = time.time()
        try:
            response = await http.get(f"{node.base_url}/jobs", params={"limit": 1})
        except httpx.HTTPError as error:
            self.probes.append(
                Probe(began, node.label, node.pid, None, time.time() - began, type(error).__name__)
            )
            return
        body: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            body = response.json()
        scheduler = body.get("scheduler", {}) if isinstance(body, dict) else {}
        self.probes.append(
            Probe(
                began,
                node.label,
                node.pid,
                response.status_code,
                time.time() - began,
                None,
                scheduler.get("loop_lag_events"),
                scheduler.get("max_loop_lag_seconds"),
                _read_at(body),
            )
        )

    # -- shutdown --------------------------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGCONT and SIGTERM every live process; SIGKILL what is left after ``timeout``."""
        await self.stop_probing()
        for proxy in self.proxies.values():  # the database is back for the final records
            with contextlib.suppress(OSError):
                await proxy.start()
        codes: dict[str, int | None] = {}
        live = [n for n in self.history if n.alive]
        for node in live:
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(signal.SIGCONT)
                node.process.send_signal(signal.SIGTERM)
        for node in live:
            try:
                codes[f"{node.label}:{node.pid}"] = await asyncio.wait_for(
                    node.process.wait(), timeout
                )
            except TimeoutError:
                node.process.kill()
                await node.process.wait()
                codes[f"{node.label}:{node.pid}"] = None
            node.exited = time.time()
        for proxy in self.proxies.values():
            await proxy.close()
        return codes

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Cluster]:
        try:
            yield self
        finally:
            await self.close()


def _iso(seconds: float) -> str:
    return format_iso_duration(timedelta(seconds=seconds))


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _read_at(body: Any) -> float | None:
    """The POSIX time of a ``/jobs`` answer's ``database_time`` (None without one)."""
    stamp = body.get("database_time") if isinstance(body, dict) else None
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None
