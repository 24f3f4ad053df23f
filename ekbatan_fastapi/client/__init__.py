"""The scheduler client: schedule, reschedule, cancel and read task instances; the history,
pauses, instances and jobs of the cluster. It needs only the database."""

from __future__ import annotations

from ..domain.tasks import ScheduledTask
from ..domain.text import MAX_NAME_LENGTH, is_storable_text, validate_name
from .client import LocalScheduler, SchedulerClient

__all__ = [
    "MAX_NAME_LENGTH",
    "LocalScheduler",
    "ScheduledTask",
    "SchedulerClient",
    "is_storable_text",
    "validate_name",
]
