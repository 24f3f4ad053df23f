"""What to send gunicorn (issue 33 part 3 item 6, docs/deployment.md): SIGTERM to the master
stops every worker's scheduler gracefully (the two-phase stop, in well under a second here);
SIGINT (or SIGQUIT) to the master alone is gunicorn's quick shutdown, which sends the workers
SIGQUIT, which uvicorn's worker does not act on: their schedulers keep claiming and running
slots until gunicorn's graceful timeout, then are SIGKILLed without a stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from .fastapi_helpers import SLOT_ENV
from .test_startup_errors import free_port

REPO = Path(__file__).resolve().parent.parent
WORKERS = 2


def serve(tmp_path: Path, url: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """gunicorn with two uvicorn workers and a graceful timeout of 3 s, once both workers'
    schedulers run and have run slots."""
    log_path = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EKBATAN_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            f"{SLOT_ENV}__URL": url,
            "EKBATAN_JOBS__POLLING_INTERVAL": "PT0.1S",
            "EKBATAN_JOBS__SHUTDOWN_MAX_WAIT": "PT2S",
        }
    )
    command = [sys.executable, "-m", "gunicorn", "tests.signal_app:app"]
    command += ["-k", "uvicorn.workers.UvicornWorker", "-w", str(WORKERS)]
    command += ["-b", f"127.0.0.1:{free_port()}", "--no-control-socket"]
    command += ["--graceful-timeout", "3"]
    with log_path.open("wb") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if text.count("Application startup complete") == WORKERS and "tick ran" in text:
            return process, log_path
        assert process.poll() is None, text
        time.sleep(0.1)
    process.kill()
    raise AssertionError(log_path.read_text(errors="replace"))


def stop(process: subprocess.Popen[bytes], sig: signal.Signals, log_path: Path) -> float:
    """Send ``sig`` to the master alone; seconds until it exited."""
    began = time.monotonic()
    process.send_signal(sig)
    try:
        assert process.wait(30) == 0, log_path.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
    return time.monotonic() - began


def ticks_after(text: str, marker: str) -> int:
    return text.split(marker, 1)[1].count("tick ran")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_to_the_master_stops_every_scheduler_gracefully(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    process, log_path = serve(tmp_path, database_url, "term")
    took = stop(process, signal.SIGTERM, log_path)
    text = log_path.read_text(errors="replace")
    assert len(re.findall(r"scheduler \S+ stopped", text)) == WORKERS, text
    assert "SIGKILL" not in text, text
    assert took < 3, text  # within gunicorn's graceful timeout, not at its end


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigint_to_the_master_alone_leaves_the_schedulers_running_until_sigkill(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    process, log_path = serve(tmp_path, database_url, "int")
    took = stop(process, signal.SIGINT, log_path)
    text = log_path.read_text(errors="replace")
    assert "Handling signal: int" in text, text
    assert ticks_after(text, "Handling signal: int") > 0, text  # still running slots
    assert "stopped" not in text.split("Handling signal: int", 1)[1], text
    assert text.count("was sent SIGKILL") == WORKERS, text
    assert took >= 3, text  # gunicorn's graceful timeout, then SIGKILL
