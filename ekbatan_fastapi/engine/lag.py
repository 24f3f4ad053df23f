"""Detection of a blocked event loop: a blocked loop delays heartbeats, so peers may revive this
instance's executions (a stalled process, in db-scheduler's terms)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from ..domain.logs import library_logger

__all__ = ["LoopLagMonitor"]

log = library_logger("ekbatan_fastapi.scheduler")


class LoopLagMonitor:
    """Measures how late the event loop wakes up; a blocked loop delays heartbeats, so peers
    may revive this instance's executions."""

    def __init__(
        self,
        scheduler_name: str,
        heartbeat_interval: timedelta,
        dead_after: timedelta,
        suspects: Callable[[], list[str]],
        now: Callable[[], datetime],
    ) -> None:
        self.name = scheduler_name
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self.suspects = suspects
        self.now = now
        self.events = 0
        self.max_lag = 0.0
        self.last_at: datetime | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 0.1
        threshold = max(0.1, min(1.0, self.heartbeat_interval.total_seconds() / 2))
        danger = self.dead_after.total_seconds() / 2
        while True:
            before = loop.time()
            await asyncio.sleep(tick)
            lag = loop.time() - before - tick
            if lag >= threshold:
                self._report(lag, danger)

    def _report(self, lag: float, danger: float) -> None:
        self.events += 1
        self.max_lag = max(self.max_lag, lag)
        self.last_at = self.now()
        log.log(
            logging.ERROR if lag >= danger else logging.WARNING,
            "scheduler %s: the event loop was blocked for %.2fs (heartbeat every %s, dead "
            "after %s%s). Running async executions: %s. Synchronous work inside an "
            "`async def execute` blocks heartbeats; make it a plain `def` (it then runs in "
            "a thread) or await it via asyncio.to_thread",
            self.name,
            lag,
            self.heartbeat_interval,
            self.dead_after,
            "; peers may revive this instance's executions" if lag >= danger else "",
            ", ".join(self.suspects()) or "none",
            extra={"scheduler": self.name},
        )
