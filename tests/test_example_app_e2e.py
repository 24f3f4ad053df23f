"""The example app as users run it: two real uvicorn processes sharing one database.

Each slot of the demo job must run on exactly one of them; ``/jobs`` on either shows the
same cluster. A second test runs both on the embedded PostgreSQL in one data directory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .fastapi_helpers import SLOT_ENV
from .helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parent.parent
DEMO_INTERVAL = timedelta(milliseconds=200)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def example_env(**extra: str) -> dict[str, str]:
    """The parent's environment without any EKBATAN_ setting, plus test-sized intervals."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EKBATAN_", "EXAMPLE_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        EXAMPLE_DEMO_INTERVAL="PT0.2S",
        EKBATAN_JOBS__POLLING_INTERVAL="PT0.1S",
        # Executions take milliseconds; a long dead window keeps a briefly stalled process
        # (a loaded test machine) from having its execution revived and run a second time.
        EKBATAN_JOBS__HEARTBEAT_INTERVAL="PT1S",
        EKBATAN_JOBS__SHUTDOWN_MAX_WAIT="PT2S",
    )
    env.update(extra)
    return env


class ExampleProcess:
    """``python -m example_app --port N`` with its output in a log file."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.log_path = tmp_path / f"example-{self.port}.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "example_app", "--port", str(self.port), *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_ready(self, http: httpx.AsyncClient, timeout: float) -> None:
        async def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"example app exited early:\n{self.log()}")
            try:
                response = await http.get(f"{self.base_url}/jobs")
            except httpx.TransportError:
                return False
            return response.status_code == 200 and response.json()["scheduler"]["ready"]

        try:
            await wait_until(ready, timeout=timeout, what=f"example app on {self.port}")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log()}") from None

    async def stop(self) -> int:
        """SIGTERM, as a process manager would send; the exit must be graceful."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.process.wait, 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"example app did not stop:\n{self.log()}") from None


@asynccontextmanager
async def cluster(
    tmp_path: Path, env: dict[str, str], *args: str, ready_timeout: float = 30
) -> AsyncIterator[tuple[httpx.AsyncClient, list[ExampleProcess]]]:
    nodes: list[ExampleProcess] = []
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(2):
                nodes.append(ExampleProcess(tmp_path, env, *args))
            for node in nodes:
                await node.wait_ready(http, ready_timeout)
            yield http, nodes
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                await asyncio.to_thread(node.process.wait, 30)
            except subprocess.TimeoutExpired:
                node.process.kill()


async def get_json(http: httpx.AsyncClient, url: str) -> Any:
    response = await http.get(url)
    assert response.status_code == 200, response.text
    return response.json()


def runs_by(summary: dict[str, Any]) -> Callable[[str], int]:
    return lambda instance: int(summary["by_instance"].get(instance, 0))


async def test_two_processes_share_one_cluster_and_each_slot_runs_once(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    env = example_env(**{f"{SLOT_ENV}__URL": database_url})
    async with cluster(tmp_path, env) as (http, nodes):
        names = [(await get_json(http, f"{n.base_url}/"))["instance"] for n in nodes]
        assert len(set(names)) == 2

        async def both_ran_slots() -> bool:
            summary = await get_json(http, f"{nodes[0].base_url}/demo/runs")
            return summary["total"] >= 15 and all(runs_by(summary)(n) > 0 for n in names)

        await wait_until(both_ran_slots, timeout=30, what="demo slots on both instances")

        reports = [await get_json(http, f"{n.base_url}/jobs") for n in nodes]
        for report, name in zip(reports, names, strict=True):
            assert report["healthy"] is True
            assert report["scheduler"]["name"] == name
            assert report["scheduler"]["database_reachable"] is True
            assert {t["name"] for t in report["tasks"]} == {
                "daily-report",
                "hourly-cleanup",
                "demo",
            }
            demo = next(t for t in report["tasks"] if t["name"] == "demo")
            assert demo["schedule"] == "FIXED_RATE|PT0.2S"
            assert demo["state"] in ("scheduled", "running")
            assert demo["consecutive_failures"] == 0
        for node in nodes:
            summary = await get_json(http, f"{node.base_url}/demo/runs")
            assert summary["slots_run_more_than_once"] == 0

        codes = [await node.stop() for node in nodes]
        assert codes == [0, 0], [n.log() for n in nodes]

    async with engine.connect() as conn:
        runs, slots, instances = (
            await conn.execute(
                text(
                    "SELECT count(*), count(DISTINCT slot), count(DISTINCT instance) FROM demo_runs"
                )
            )
        ).one()
        first, last = (await conn.execute(text("SELECT min(slot), max(slot) FROM demo_runs"))).one()
        off_grid = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM demo_runs WHERE "
                    "mod((extract(epoch FROM slot - :first) * 1000)::numeric, 200) <> 0"
                ),
                {"first": first},
            )
        ).scalar_one()
    assert runs == slots, "a slot ran more than once"
    assert instances == 2
    assert off_grid == 0, "the fixed-rate grid drifted"
    # Slots are never skipped while both instances are up (a few may be coalesced at exit).
    assert slots >= (last - first) / DEMO_INTERVAL * 0.9


async def test_two_processes_share_the_embedded_database(tmp_path: Path) -> None:
    data_dir = tmp_path / ".ekbatan"
    pgdata = data_dir / "pgdata"
    async with cluster(tmp_path, example_env(), "--data-dir", str(data_dir), ready_timeout=90) as (
        http,
        (first, second),
    ):
        assert (pgdata / "postmaster.pid").exists()
        name_first = (await get_json(http, f"{first.base_url}/"))["instance"]
        name_second = (await get_json(http, f"{second.base_url}/"))["instance"]

        async def both_ran() -> bool:
            summary = await get_json(http, f"{second.base_url}/demo/runs")
            by = runs_by(summary)
            return by(name_first) > 0 and by(name_second) > 0

        await wait_until(both_ran, timeout=30, what="both instances ran demo slots")

        assert await first.stop() == 0
        # The server outlives the instance that started it: the other one keeps running.
        before = (await get_json(http, f"{second.base_url}/demo/runs"))["total"]

        async def still_running() -> bool:
            summary = await get_json(http, f"{second.base_url}/demo/runs")
            return bool(summary["total"] >= before + 3)

        await wait_until(still_running, timeout=15, what="demo runs after the first stopped")
        assert (await http.get(f"{second.base_url}/jobs")).status_code == 200

        assert await second.stop() == 0, second.log()
    # The last instance to leave stopped the embedded server.
    assert not (pgdata / "postmaster.pid").exists(), second.log()
