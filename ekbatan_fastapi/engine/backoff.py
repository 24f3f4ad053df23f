"""Exponential backoff for the scheduler's retry loops."""

from __future__ import annotations

__all__ = ["Backoff"]

_MIN = 0.05


class Backoff:
    """Exponential backoff from ``floor`` (50 ms) up to ``cap`` seconds (the polling interval,
    so that a database that comes back is used again within one interval)."""

    def __init__(self, cap: float, floor: float = _MIN) -> None:
        self.floor = floor
        self.cap = max(cap, floor)
        self.current = floor

    def next(self) -> float:
        value = self.current
        self.current = min(self.cap, self.current * 2)
        return value

    def reset(self) -> None:
        self.current = self.floor
