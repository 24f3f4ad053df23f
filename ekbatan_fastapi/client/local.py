"""``LocalScheduler``: what the client uses of a scheduler running in the same process."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from ..domain.job import Job
from ..domain.rows import TaskRow

__all__ = ["LocalScheduler"]


class LocalScheduler(Protocol):
    """What the client uses of a scheduler running in the same process."""

    @property
    def name(self) -> str: ...

    @property
    def jobs(self) -> Mapping[str, Job]: ...

    def request_poll(self) -> None: ...

    def note_due(self, when: datetime) -> None: ...

    def claiming(self) -> AbstractContextManager[None]: ...

    def run_claimed(self, row: TaskRow) -> None: ...
