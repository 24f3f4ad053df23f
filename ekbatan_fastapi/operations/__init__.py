"""Execution history, cluster-wide pause/resume and live instances (our own tables)."""

from __future__ import annotations

from .models import ExecutionRecord, InstanceInfo, Outcome, PauseInfo
from .repository import OperationsRepository
from .tables import OperationsTables

__all__ = [
    "ExecutionRecord",
    "InstanceInfo",
    "OperationsRepository",
    "OperationsTables",
    "Outcome",
    "PauseInfo",
]
