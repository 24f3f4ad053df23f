"""``ekbatan-jobs`` with hostile input (issue 27 items 9 and 10): terminal escape sequences in
a task's name, instance or pause reason are shown escaped, never acted on (JSON escapes them
by itself); every number on the command line is checked, with a usage error (exit code 2)
naming the value and the range instead of a traceback with SQL or a silent "(none)"."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi.cli import EXIT, parser, run
from ekbatan_fastapi.cli.output import Output

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x9b1m\r\u202e"
NAME = f"evil{ESCAPES}name"
INSTANCE = f"inst{ESCAPES}ance"
REASON = f"why{ESCAPES}not"


async def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = parser().parse_args(list(argv))
    code = await run(args, Output(json_mode=args.json, stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


def _no_control(shown: str) -> None:
    assert not any(ch in shown for ch in "\x1b\x07\x9b\r\u202e"), repr(shown)


async def test_escape_sequences_in_tasks_are_shown_escaped(
    database_url: str, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "version, consecutive_failures, priority) VALUES (:n, :i, :t, false, 1, 0, 0)"
            ),
            {"n": NAME, "i": INSTANCE, "t": datetime(2030, 1, 1, tzinfo=UTC)},
        )
    code, listed, err = await _run("--url", database_url, "list")
    assert code == EXIT.OK, err
    _no_control(listed)
    assert "evil\\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\x9b1m\\x0d\\u202ename" in listed

    code, paused, err = await _run("--url", database_url, "pause", NAME, "--reason", REASON)
    assert code == EXIT.OK, err
    _no_control(paused)
    assert "why\\x1b]0;owned" in paused

    code, out, missing = await _run("--url", database_url, "run-now", NAME, "--instance", "x")
    assert code == EXIT.UNKNOWN_TASK
    _no_control(out + missing)
    assert "task evil\\x1b]0;owned" in missing

    code, as_json, err = await _run("--url", database_url, "--json", "list")
    assert code == EXIT.OK, err
    _no_control(as_json)
    assert "\\u001b]0;owned" in as_json  # JSON's own escape
    task = json.loads(as_json)["tasks"][0]
    assert (task["name"], task["instance"]) == (NAME, INSTANCE)
    assert task["paused"]["reason"] == REASON


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["list", "--limit", "-1"], "argument --limit: must be from 1 to 100000, got -1"),
        (["list", "--limit", "0"], "argument --limit: must be from 1 to 100000, got 0"),
        (["list", "--limit", "1e9"], "argument --limit: '1e9' is not a whole number"),
        (["list", "--offset", "-1"], "argument --offset: must be from 0 to 2147483647, got -1"),
        (["list", "--offset", "2147483648"], "argument --offset: must be from 0 to"),
        (["history", "--limit", "1001"], "argument --limit: must be from 1 to 1000, got 1001"),
        (["history", "--before", "-1"], "argument --before: must be from 1 to"),
        (["history", "--before", "0"], "argument --before: must be from 1 to"),
        (["history", "--before", "9" * 30], "argument --before: must be from 1 to"),
        (["--connect-timeout", "-1", "list"], "must be above 0 and up to 3600, got -1"),
        (["--connect-timeout", "nan", "list"], "'nan' is not a number of seconds"),
        (["list", "--connect-timeout", "inf"], "'inf' is not a number of seconds"),
        (["run-now", "t", "--wait", "0"], "argument --wait: must be above 0 and up to 3600"),
        (["run-now", "t", "--wait", "1e6"], "argument --wait: must be above 0 and up to 3600"),
    ],
)
def test_every_number_is_checked_with_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--url", "postgresql+asyncpg://u@127.0.0.1:1/db", *argv])
    assert exited.value.code == EXIT.USAGE
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


async def test_numbers_in_range_reach_the_database(database_url: str, engine: AsyncEngine) -> None:
    for argv in (
        ["list", "--limit", "1", "--offset", "2147483647"],
        ["history", "--limit", "1000", "--before", "5"],
    ):
        code, out, err = await _run("--url", database_url, *argv)
        assert (code, out.strip()) == (EXIT.OK, "(none)"), err
