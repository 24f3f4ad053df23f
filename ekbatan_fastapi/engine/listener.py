"""``Listener``: holds a LISTEN connection (where the dialect has notifications), so work that
any instance schedules wakes this one at once instead of at its next poll.

A LISTEN connection sees nothing of a failover: after the old primary was fenced read-only
(or any other error that may mean the database moved), it stays on the old server, deaf to
the new one's notifications. So when the other loops get answers again after such an error
(``DatabaseLink.moved``), the listener reconnects, and its new connection goes where theirs
went.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from ..domain.logs import library_logger
from ..store.tasks import TaskStore
from .config import SchedulerConfig
from .poller import Alarm, Backoff, DatabaseLink
from .running import RunState

__all__ = ["Listener"]

log = library_logger(__name__)

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
            self.link.moved.clear()
            try:
                if await self._listen_until_moved():
                    # WARNING, as the error and the "answers again" before it: an operator
                    # reading a failover's log wants to see the listener follow.
                    log.warning(
                        "the database answers again after an error that may have been a "
                        "failover: reconnecting the LISTEN connection"
                    )
                    continue
            except Exception as error:
                if clock.monotonic() - began > _STABLE:
                    backoff.reset()
                self.link.failed(error, "listening for notifications", failover=False)
            await asyncio.sleep(backoff.next())

    async def _listen_until_moved(self) -> bool:
        """Listen until the connection is lost (raises) or the database may have moved
        (True: the connection was closed, to be opened again)."""
        listening = asyncio.create_task(self.tasks.listen(self.notified))
        moved = asyncio.create_task(self.link.moved.wait())
        try:
            await asyncio.wait({listening, moved}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listening, moved):
                task.cancel()
            for task in (listening, moved):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({task})
        if listening.done() and not listening.cancelled():
            listening.result()  # raises the loss
        return True

    def notified(self, when: datetime | None) -> None:
        if when is None or when <= self.link.now():
            self.alarm.request_poll()
        else:
            self.alarm.note_due(when)
