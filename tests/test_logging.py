"""The library's log records as a user sees them (docs/logging.md): under a real ``uvicorn``
process in uvicorn's format with time, level and logger; a warning when no job is registered
and when rows of a task no live instance knows wait; task name, instance and scheduler on
every record."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    DistributedJob,
    ExecutionContext,
    Schedule,
    Schedules,
    scheduled_tasks,
)
from ekbatan_fastapi.domain.logs import LOG_FIELDS, TaskLogFilter
from ekbatan_fastapi.engine.logs import show_library_logs
from ekbatan_fastapi.settings import EkbatanSettings

from .fastapi_helpers import SLOT_ENV
from .helpers import RegistryFactory, wait_until
from .test_example_app_e2e import free_port

REPO = Path(__file__).resolve().parent.parent
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


class Uvicorn:
    """``python -m uvicorn tests.log_app:<app>`` (or another server), its stdout and stderr
    in one file."""

    def __init__(
        self, tmp_path: Path, app: str, url: str, server: str = "uvicorn", **settings: str
    ) -> None:
        self.log_path = tmp_path / f"{server}-{app}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EKBATAN_")}
        env.update(
            {
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
                f"{SLOT_ENV}__URL": url,
                "EKBATAN_JOBS__POLLING_INTERVAL": "PT0.1S",
                "EKBATAN_JOBS__HEARTBEAT_INTERVAL": "PT1S",
                "EKBATAN_JOBS__SHUTDOWN_MAX_WAIT": "PT2S",
                **settings,
            }
        )
        port = str(free_port())
        command = [sys.executable, "-m", "uvicorn", f"tests.log_app:{app}", "--port", port]
        if server == "gunicorn":
            worker = "uvicorn.workers.UvicornWorker"
            command = [sys.executable, "-m", "gunicorn", f"tests.log_app:{app}", "-k", worker]
            command += ["-w", "1", "-b", f"127.0.0.1:{port}", "--no-control-socket"]
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"uvicorn exited early:\n{self.output()}")
            match = re.search(pattern, self.output(), re.M)
            if match is not None:
                found.append(match)
            return match is not None

        try:
            await wait_until(seen, timeout=timeout, what=pattern)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.output()}") from None
        return found[0]

    async def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.process.wait, 20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"uvicorn did not stop:\n{self.output()}") from None


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_under_uvicorn_the_library_logs_in_uvicorns_format_with_time_and_logger(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    server = Uvicorn(tmp_path, "app", database_url)
    try:
        await server.wait_for(r"Application startup complete")
        failure = await server.wait_for(
            rf"^ERROR: +({TIME}) ekbatan_fastapi\.engine\.executor: "
            r"greet/recurring \(slot \S+\) failed\n"
            r"Traceback[\s\S]*?RuntimeError: greeting failed$"
        )
    finally:
        await server.stop()
    out = server.output()
    # uvicorn's own lines and ours share its level prefix; ours add the time and the logger
    assert re.search(r"^INFO: +Application startup complete\.$", out, re.M), out
    assert re.search(
        rf"^INFO: +{TIME} ekbatan_fastapi\.web\.lifespan: ekbatan: starting 1 jobs \(greet\)",
        out,
        re.M,
    ), out
    when = datetime.strptime(failure.group(1), "%Y-%m-%d %H:%M:%S,%f")
    assert abs(when - datetime.now()) < timedelta(minutes=5)
    assert "Logging error" not in out and "--- Logging" not in out
    assert re.search(
        rf"^INFO: +{TIME} ekbatan_fastapi\.engine\.scheduler: scheduler \S+ stopped", out, re.M
    ), out


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_under_gunicorn_with_uvicorn_workers_the_library_logs_in_gunicorns_format(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    server = Uvicorn(tmp_path, "app", database_url, server="gunicorn")
    try:
        await server.wait_for(r"Application startup complete")
        await server.wait_for(
            r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[\d+\] \[ERROR\] "
            r"ekbatan_fastapi\.engine\.executor: greet/recurring \(slot \S+\) failed\n"
            r"Traceback[\s\S]*?RuntimeError: greeting failed$"
        )
    finally:
        await server.stop()
    assert re.search(
        r"^\[[^]]+\] \[\d+\] \[INFO\] ekbatan_fastapi\.web\.lifespan: ekbatan: starting 1 jobs",
        server.output(),
        re.M,
    ), server.output()


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_under_uvicorn_an_app_without_jobs_warns_at_startup(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    server = Uvicorn(tmp_path, "empty", database_url)
    try:
        await server.wait_for(r"Application startup complete")
        warning = await server.wait_for(r"^WARNING: .*no job is registered.*$")
    finally:
        await server.stop()
    assert "EKBATAN_JOBS__MODULES=myapp.jobs" in warning.group(0)
    assert "starting 0 jobs (none)" in server.output()


@pytest.mark.slow
@pytest.mark.multiprocess
async def test_log_handler_none_leaves_logging_alone_under_uvicorn(
    tmp_path: Path, database_url: str, engine: AsyncEngine
) -> None:
    server = Uvicorn(tmp_path, "empty", database_url, EKBATAN_JOBS__LOG_HANDLER="none")
    try:
        await server.wait_for(r"Application startup complete")
        # Python's last resort still prints the warning, bare: nothing of ours was attached
        await server.wait_for(r"^ekbatan: no job is registered")
    finally:
        await server.stop()
    assert "starting 0 jobs" not in server.output()


# -- show_library_logs, in this process -------------------------------------------------


@contextmanager
def unconfigured_logging() -> Iterator[None]:
    """The root logger as under uvicorn: no handler (pytest's own are put back after); and no
    server's loggers configured yet (an earlier test that served an app with uvicorn in this
    process left ``uvicorn.error``'s handlers in place)."""
    loggers = [logging.getLogger(name) for name in ("", "uvicorn.error", "uvicorn")]
    saved = [(lg, lg.handlers[:]) for lg in loggers]
    for lg in loggers:
        lg.handlers.clear()
    try:
        yield
    finally:
        for lg, handlers in saved:
            lg.handlers[:] = handlers


def test_nothing_is_attached_when_the_application_configured_logging() -> None:
    ours = logging.getLogger("ekbatan_fastapi")
    assert logging.getLogger().handlers  # pytest's capture handler stands for the app's
    assert show_library_logs("auto") is None
    with unconfigured_logging():
        assert show_library_logs("none") is None
        own = logging.NullHandler()
        ours.addHandler(own)
        try:
            assert show_library_logs("auto") is None
        finally:
            ours.removeHandler(own)
    assert ours.handlers == [] and ours.level == logging.NOTSET


def test_under_gunicorn_records_go_to_its_error_handler_with_the_logger_name() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # what gunicorn's glogging sets up
    handler.setFormatter(
        logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    )
    gunicorn = logging.getLogger("gunicorn.error")
    gunicorn.addHandler(handler)
    gunicorn.propagate = False
    gunicorn.setLevel(logging.WARNING)  # --log-level warning
    try:
        with unconfigured_logging():
            undo = show_library_logs("auto")
            assert undo is not None
            try:
                log = logging.getLogger("ekbatan_fastapi.engine.executor")
                log.info("hidden at the server's level")
                try:
                    raise RuntimeError("greeting failed")
                except RuntimeError:
                    log.exception("greet (slot x) failed")
            finally:
                undo()
    finally:
        gunicorn.removeHandler(handler)
        gunicorn.propagate = True
        gunicorn.setLevel(logging.NOTSET)
    text = stream.getvalue()
    assert "hidden" not in text
    assert re.match(
        r"\[\S+ \S+\] \[\d+\] \[ERROR\] ekbatan_fastapi\.engine\.executor: greet \(slot x\) "
        r"failed\nTraceback",
        text,
    ), text
    assert text.rstrip().endswith("RuntimeError: greeting failed")
    assert logging.getLogger("ekbatan_fastapi").handlers == []


def test_without_a_server_records_go_to_stderr_at_info(capsys: pytest.CaptureFixture[str]) -> None:
    with unconfigured_logging():
        undo = show_library_logs("auto")
        assert undo is not None
        try:
            logging.getLogger("ekbatan_fastapi.registry").info("visible")
        finally:
            undo()
    assert re.fullmatch(
        rf"{TIME} INFO ekbatan_fastapi\.registry: visible\n", capsys.readouterr().err
    )


def test_log_handler_setting_names_its_values() -> None:
    assert EkbatanSettings(jobs={"log-handler": "none"}).jobs.log_handler == "none"
    with pytest.raises((ConfigurationError, ValueError), match="'stdout'; use auto"):
        EkbatanSettings(jobs={"log-handler": "stdout"})


# -- the warnings and the fields, on a real database ---------------------------------------


class Noisy(DistributedJob):
    """Logs on its own logger and fails: both records must name its row."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=100))

    def _run(self) -> None:
        logging.getLogger("myapp.jobs").info("working on it")
        raise RuntimeError(f"{self._name} broke")

    async def execute(self, ctx: ExecutionContext) -> None:
        self._run()


class PlainNoisy(Noisy):
    """The same as a plain ``def`` job (it runs in a worker thread)."""

    def execute(self, ctx: ExecutionContext) -> None:  # type: ignore[override]
        self._run()


async def test_every_record_carries_task_name_instance_and_scheduler(
    registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(TaskLogFilter())  # what docs/logging.md tells for the app's own
    registry = await registries.start(Noisy("async-noisy"), PlainNoisy("plain-noisy"))
    name = registry.scheduler.name

    def failed(job: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(f"{job}/recurring (slot")]

    await wait_until(lambda: bool(failed("async-noisy") and failed("plain-noisy")), timeout=10)
    await registry.stop()
    library = [r for r in caplog.records if r.name.startswith("ekbatan_fastapi")]
    assert library
    for record in library:
        for field in LOG_FIELDS:
            assert hasattr(record, field), (field, record.getMessage())
    for job in ("async-noisy", "plain-noisy"):
        record = failed(job)[0]
        assert (record.task_name, record.task_instance, record.scheduler) == (
            job,
            "recurring",
            name,
        )
        own = [r for r in caplog.records if r.name == "myapp.jobs" and r.task_name == job]
        assert own and own[0].task_instance == "recurring" and own[0].scheduler == name
    stopped = [r for r in library if r.getMessage() == f"scheduler {name} stopped"]
    assert stopped[0].scheduler == name and stopped[0].task_name is None


async def test_rows_of_a_task_no_live_instance_knows_are_warned_about_once(
    any_registries: RegistryFactory, any_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    registries = any_registries
    due = datetime.now(UTC) - timedelta(hours=1)
    async with any_engine.begin() as conn:
        for instance in ("a", "b"):
            await conn.execute(
                insert(scheduled_tasks).values(
                    task_name="retired-report",
                    task_instance=instance,
                    execution_time=due,
                    picked=False,
                    version=1,
                )
            )
    caplog.set_level(logging.WARNING, logger="ekbatan_fastapi")
    registry = await registries.start(PlainNoisy("plain-noisy"))

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "no live instance runs them" in r.getMessage()]

    await wait_until(lambda: bool(warnings()), timeout=10)
    found = warnings()[0]
    assert found.levelno == logging.WARNING
    assert found.getMessage().startswith("2 rows of task 'retired-report' have been due since ")
    assert "EKBATAN_JOBS__MODULES" in found.getMessage()
    assert found.task_name == "retired-report" and found.scheduler == registry.scheduler.name
    await registry.scheduler.maintenance.warn_unknown()  # a later round says nothing new
    await registry.stop()
    assert len(warnings()) == 1
    assert not [r for r in warnings() if "plain-noisy" in r.getMessage()]
