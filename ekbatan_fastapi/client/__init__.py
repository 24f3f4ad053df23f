"""The scheduler client: schedule, reschedule, cancel and read task instances; the history,
pauses, instances and jobs of the cluster. It needs only the database. ``ReadModel`` shows
them as ``GET /jobs`` and ``ekbatan-jobs --json`` do (``views.py``)."""

from __future__ import annotations

from ..domain.tasks import ScheduledTask
from ..domain.text import MAX_NAME_LENGTH, is_storable_text, validate_name
from .client import LocalScheduler, SchedulerClient
from .read_model import ReadModel

__all__ = [
    "MAX_NAME_LENGTH",
    "LocalScheduler",
    "ReadModel",
    "ScheduledTask",
    "SchedulerClient",
    "is_storable_text",
    "validate_name",
]
