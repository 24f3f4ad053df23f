"""``Listener``: holds a LISTEN connection (where the dialect has notifications), so work that
any instance schedules wakes this one at once instead of at its next poll."""

from __future__ import annotations

import asyncio
from datetime import datetime

from ..store.tasks import TaskStore
from .alarm import Alarm
from .backoff import Backoff
from .config import SchedulerConfig
from .link import DatabaseLink
from .running import RunState

__all__ = ["Listener"]

_STABLE = 5.0
"""Seconds a LISTEN connection must have lasted for its loss to restart the backoff."""


class Listener:
    """The notification loop."""

    def __init__(
        self,
        *,
        tasks: TaskStore,
        config: SchedulerConfig,
        link: DatabaseLink,
        alarm: Alarm,
        state: RunState,
    ) -> None:
        self.tasks = tasks
        self.config = config
        self.link = link
        self.alarm = alarm
        self.state = state

    async def run(self) -> None:
        await self.state.ready.wait()
        backoff = Backoff(self.config.polling_interval.total_seconds())
        clock = self.config.clock
        while not self.state.stopping:
            began = clock.monotonic()
            try:
                await self.tasks.listen(self.notified)
            except Exception as error:
                if clock.monotonic() - began > _STABLE:
                    backoff.reset()
                self.link.failed(error, "listening for notifications")
            await asyncio.sleep(backoff.next())

    def notified(self, when: datetime | None) -> None:
        if when is None or when <= self.link.now():
            self.alarm.request_poll()
        else:
            self.alarm.note_due(when)
