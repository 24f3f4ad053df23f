"""What ``ekbatan-jobs`` prints: aligned tables for people, one JSON document with ``--json``,
and messages on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

from ..domain.records import PauseInfo
from ..domain.tasks import ScheduledTask, derive_state, heartbeat_age

__all__ = ["Output", "row_view"]

_CELL = 60


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def row_view(
    row: ScheduledTask,
    now: datetime,
    pause: PauseInfo | None,
    dead_after: timedelta,
    overdue_after: timedelta,
) -> dict[str, Any]:
    """One row of ``scheduled_tasks`` as ``list`` shows it (its state as ``/jobs`` derives
    it; the CLI loads no jobs, so no row counts as unresolved)."""
    age = heartbeat_age(row, now)
    state = derive_state(
        row, now, dead_after=dead_after, overdue_after=overdue_after, paused=pause is not None
    )
    return {
        "task_name": row.task_name,
        "task_instance": row.task_instance,
        "state": state,
        "execution_time": _iso(row.execution_time),
        "picked": row.picked,
        "picked_by": row.picked_by,
        "heartbeat_age": round(age.total_seconds(), 3) if age is not None else None,
        "last_success": _iso(row.last_success),
        "last_failure": _iso(row.last_failure),
        "consecutive_failures": row.consecutive_failures,
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
