"""Task repositories, one per database dialect."""

from __future__ import annotations

from .base import PollingStrategy, TaskRepository
from .model import Finish, FinishKind, NewTask, Owned, PollResult, TaskKey, TaskRow

__all__ = [
    "Finish",
    "FinishKind",
    "NewTask",
    "Owned",
    "PollResult",
    "PollingStrategy",
    "TaskKey",
    "TaskRepository",
    "TaskRow",
]
