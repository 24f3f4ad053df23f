"""What ``ekbatan-jobs`` prints: aligned tables for people, one JSON document with ``--json``,
and messages on stderr.

Text for people passes through ``printable``: a task name, instance, pause reason or error
message holding terminal escape sequences (anyone who can schedule a task chooses its
instance id) is shown escaped (``\x1b[31m``), never acted on. JSON escapes control
characters by itself (``\u001b``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ..domain.text import printable

__all__ = ["Output"]

_CELL = 60


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = printable(str(value), lines=False)
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
            self.stdout.write(printable(title) + "\n")
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
            self.stdout.write(printable(message) + "\n")

    def warn(self, message: str) -> None:
        self.stderr.write(f"ekbatan-jobs: warning: {printable(message)}\n")

    def fail(self, code: int, message: str) -> int:
        """Report an error; returns ``code`` (the exit code)."""
        self.stderr.write(f"ekbatan-jobs: error: {printable(message)}\n")
        if self.json_mode:
            self._json({"error": message, "exit_code": code})
        return code
