"""What ``ekbatan-jobs`` prints: aligned tables for people, one JSON document with ``--json``,
messages on stderr, and the derived state of each row (as ``/jobs`` derives it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

from ..operations.models import PauseInfo
from ..repository.model import TaskRow

__all__ = ["Output", "row_view"]

_CELL = 60


def _state(row: TaskRow, now: datetime, paused: bool, dead: timedelta, overdue: timedelta) -> str:
    """``dead`` > ``running`` > ``paused`` > ``overdue`` > ``failing`` > ``scheduled``."""
    if row.picked:
        if row.last_heartbeat is None or now - row.last_heartbeat > dead:
            return "dead"
        return "running"
    if paused:
        return "paused"
    if now - row.execution_time > overdue:
        return "overdue"
    if row.consecutive_failures:
        return "failing"
    return "scheduled"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def row_view(
    row: TaskRow,
    now: datetime,
    pause: PauseInfo | None,
    dead_after: timedelta,
    overdue_after: timedelta,
) -> dict[str, Any]:
    """One row of ``scheduled_tasks`` as ``list`` shows it."""
    age = None
    if row.picked and row.last_heartbeat is not None:
        age = round((now - row.last_heartbeat).total_seconds(), 3)
    return {
        "task_name": row.task_name,
        "task_instance": row.task_instance,
        "state": _state(row, now, pause is not None, dead_after, overdue_after),
        "execution_time": _iso(row.execution_time),
        "picked": row.picked,
        "picked_by": row.picked_by,
        "heartbeat_age": age,
        "last_success": _iso(row.last_success),
        "last_failure": _iso(row.last_failure),
        "consecutive_failures": row.consecutive_failures or 0,
        "version": row.version,
        "paused_by": pause.paused_by if pause else None,
        "paused_at": _iso(pause.paused_at) if pause else None,
        "pause_reason": pause.reason if pause else None,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value).replace("\n", " ")
    return text if len(text) <= _CELL else text[: _CELL - 3] + "..."


class Output:
    """Writes results (stdout) and messages (stderr) in the chosen mode."""

    def __init__(
        self, *, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, default=str) + "\n")

    def table(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        json_value: Any,
        columns: Sequence[str] | None = None,
        title: str | None = None,
    ) -> None:
        if self.json_mode:
            self._json(json_value)
            return
        if title:
            self.stdout.write(title + "\n")
        if not rows:
            self.stdout.write("(none)\n")
            return
        names = list(columns or rows[0].keys())
        cells = [[_cell(row.get(name)) for name in names] for row in rows]
        headers = [name.upper().replace("_", " ") for name in names]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        for line in [headers, *cells]:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
            self.stdout.write("\n")

    def done(self, message: str, json_value: Any) -> None:
        if self.json_mode:
            self._json(json_value)
        else:
            self.stdout.write(message + "\n")

    def warn(self, message: str) -> None:
        self.stderr.write(f"ekbatan-jobs: warning: {message}\n")

    def fail(self, code: int, message: str) -> int:
        """Report an error; returns ``code`` (the exit code)."""
        self.stderr.write(f"ekbatan-jobs: error: {message}\n")
        if self.json_mode:
            self._json({"error": message, "exit_code": code})
        return code
