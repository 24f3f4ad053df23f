"""A bad setting at startup, as the user sees it (issue 27 item 11): under a real ``uvicorn``
process, under ``python -m example_app``, and under gunicorn's uvicorn workers, the message
alone on one error line (no 25-45 line Starlette traceback above it), and a non-zero exit
code. Durations are bounded, with an error naming the key, the value and the bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.settings.model import DURATION_BOUNDS

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_LINE = (
    "ekbatan: the application cannot start: invalid ekbatan settings: "
    "ekbatan.jobs.polling-interval (environment: EKBATAN_JOBS__POLLING_INTERVAL): "
    "'10s' is not an ISO-8601 duration; write PT10S"
)


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def serve(command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Run a server that must fail its startup; its output (stdout and stderr together)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EKBATAN_")}
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**environment, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.multiprocess
def test_a_bad_setting_under_uvicorn_is_one_error_line_and_exit_code_3() -> None:
    result = serve(
        [sys.executable, "-m", "uvicorn", "tests.log_app:app", "--port", free_port()],
        EKBATAN_DATABASE_URL="postgresql+asyncpg://app@127.0.0.1:1/app",
        EKBATAN_JOBS__POLLING_INTERVAL="10s",
    )
    assert result.returncode == 3, result.stdout
    assert result.stdout.splitlines() == [
        f"INFO:     Started server process [{_pid(result.stdout)}]",
        "INFO:     Waiting for application startup.",
        f"ERROR:    {SETTINGS_LINE}",
        "ERROR:    Application startup failed. Exiting.",
    ]


def _pid(output: str) -> str:
    return output.split("Started server process [", 1)[1].split("]", 1)[0]


@pytest.mark.multiprocess
def test_a_bad_job_setting_under_python_m_example_app_is_one_error_line(
    database_url: str,
) -> None:
    """The example checks the settings itself before it serves; a setting only the lifespan
    can judge (an override naming no job) fails in the lifespan, under uvicorn.run."""
    result = serve(
        [sys.executable, "-m", "example_app", "--port", free_port()],
        EKBATAN_DATABASE_URL=database_url,
        EKBATAN_JOBS__OVERRIDES__NO_SUCH_JOB__TIMEOUT="PT1M",
    )
    assert result.returncode == 3, result.stdout
    errors = [line for line in result.stdout.splitlines() if "ERROR" in line]
    assert errors == [
        "ERROR:    ekbatan: the application cannot start: ekbatan.jobs.overrides names "
        "'no_such_job', which no registered job is called; registered jobs: daily-report, "
        "demo, demo-note, hourly-cleanup",
        "ERROR:    Application startup failed. Exiting.",
    ], result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.multiprocess
def test_a_bad_setting_under_gunicorn_workers_is_one_error_line_per_worker() -> None:
    result = serve(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-k",
            "uvicorn.workers.UvicornWorker",
            "-w",
            "1",
            "-b",
            f"127.0.0.1:{free_port()}",
            "tests.log_app:app",
        ],
        EKBATAN_DATABASE_URL="postgresql+asyncpg://app@127.0.0.1:1/app",
        EKBATAN_JOBS__POLLING_INTERVAL="10s",
    )
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stdout, result.stdout
    assert f"[ERROR] {SETTINGS_LINE}" in result.stdout
    assert "Worker failed to boot" in result.stdout


# -- the bounds of durations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "polling-interval",
            "P99999999D",
            "ekbatan.jobs.polling-interval (environment: EKBATAN_JOBS__POLLING_INTERVAL): "
            "P99999999D is longer than the longest allowed, PT1H (allowed: PT0.01S to PT1H), "
            "e.g. PT10S",
        ),
        ("polling-interval", "PT0.001S", "PT0.001S is shorter than the shortest allowed, PT0.01S"),
        ("polling-interval", "PT0S", "must be longer than zero, got PT0S"),
        ("heartbeat-interval", "PT2H", "PT2H is longer than the longest allowed, PT1H"),
        ("shutdown-max-wait", "P2D", "P2D is longer than the longest allowed, P1D"),
        ("shutdown-results-wait", "PT61M", "PT1H1M is longer than the longest allowed, PT1H"),
        ("delete-unresolved-after", "P3651D", "P3651D is longer than the longest allowed"),
        ("delete-unresolved-after", "PT30S", "PT30S is shorter than the shortest allowed, PT1M"),
        ("idle-transaction-timeout", "P2D", "P2D is longer than the longest allowed, P1D"),
        ("claim-ahead", "PT11S", "PT11S is longer than the longest allowed, PT10S"),
        ("timeout-grace", "P1DT1S", "P1DT1S is longer than the longest allowed, P1D"),
    ],
)
def test_durations_are_bounded_with_the_key_value_and_bound(
    key: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        EkbatanSettings(jobs={key: value})
    assert message in str(raised.value)
    assert f"ekbatan.jobs.{key} (environment: EKBATAN_JOBS__" in str(raised.value)


def test_an_override_timeout_is_bounded() -> None:
    with pytest.raises(ConfigurationError, match=r"overrides\.x\.timeout .*P31D is longer"):
        EkbatanSettings(jobs={"overrides": {"x": {"timeout": "P31D"}}})


def test_every_duration_setting_has_bounds_and_its_default_is_within() -> None:
    from ekbatan_fastapi.settings import JobsSettings

    durations = {
        name
        for name, field in JobsSettings.model_fields.items()
        if "timedelta" in str(field.annotation)
    }
    assert durations == set(DURATION_BOUNDS)
    defaults = JobsSettings()
    for name, (low, high, _) in DURATION_BOUNDS.items():
        value = getattr(defaults, name)
        assert value is None or low <= value <= high, name
        assert timedelta(0) <= low < high
