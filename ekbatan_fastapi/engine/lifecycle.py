"""``Lifecycle``: a scheduler's loops as one ordered list of named services, started in that
order and stopped in db-scheduler's two phases; the same list is what a manual driver (the
``TimeMachine``) starts and steps, so a loop added here runs there too.

Each ``Service`` says how it stops (``Stop``) and how it runs under a manual driver
(``Manual``). A stop goes:

1. **stop claiming**: the ``FIRST`` services are cancelled and the ``CLAIMING`` one (the poller)
   is woken to finish its claim, waited for up to ``shutdown_results_wait``;
2. **wait for the running executions** (up to ``shutdown_max_wait``, cancel the ``async``
   ones, as long again; then abandoned);
3. **record**: each ``FLUSH`` service (completer, history writer), in list order, is told to
   close and waited for, all within one ``shutdown_results_wait``;
4. **stop heartbeats and housekeeping**: the ``LAST`` services are cancelled while this
   instance leaves (its instance row is removed);
5. **release**: the observers are told, the shared re-read and the worker threads let go.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..domain.logs import bind_log_context, library_logger
from .poller import Backoff, DatabaseLink
from .running import RunState

__all__ = ["Lifecycle", "Manual", "Service", "Stop", "StopSteps"]

log = library_logger(__name__)

_CANCEL_WAIT = 5.0
"""Seconds a stop waits for a cancelled loop to end (a statement cancelled on a silent
connection costs SQLAlchemy's polite close, 2 s): past it, the loop is left behind."""


class Stop(Enum):
    """When a service stops (the phases are in the module's docstring)."""

    FIRST = "first"
    """Cancelled as the stop begins (nothing is lost: the listener, the maintenance)."""
    CLAIMING = "claiming"
    """Woken by the stop, finishes its claim and returns (waited for, then cancelled)."""
    FLUSH = "flush"
    """Once the executions ended: told to close, then waited for (what it still records)."""
    LAST = "last"
    """Cancelled once nothing runs any more (heartbeats: peers judge this instance by them)."""


class Manual(Enum):
    """How a service runs under a manual driver (``TimeMachine``), where no clock moves alone."""

    LOOP = "loop"
    """Its loop runs as in production (it reacts to work handed to it, not to time)."""
    STEP = "step"
    """Its ``step`` runs once per driver round, in list order (a claim, a revival)."""
    OFF = "off"
    """Not run: what it does depends on time passing by itself (maintenance, loop lag)."""


@dataclass(frozen=True, slots=True)
class Service:
    """One of a scheduler's loops: supervised while it runs (a crash is logged, restarted)."""

    name: str
    loop: Callable[[], Coroutine[Any, Any, None]]
    """Runs until the service is stopped (``Stop``)."""
    stop: Stop
    manual: Manual
    step: Callable[[], Awaitable[object]] | None = None
    """One round of the loop, without its sleeps, errors propagating (``Manual.STEP``)."""
    close: Callable[[], None] | None = None
    """Asks the loop to finish what it holds and return (``Stop.FLUSH``)."""

    def __post_init__(self) -> None:
        if self.manual is Manual.STEP and self.step is None:
            raise ValueError(f"service {self.name!r}: Manual.STEP needs a step")
        if self.stop is Stop.FLUSH and self.close is None:
            raise ValueError(f"service {self.name!r}: Stop.FLUSH needs a close")


@dataclass(frozen=True, slots=True)
class StopSteps:
    """What a stop does between and after the services' phases."""

    begin: Callable[[], None]
    """Mark the scheduler as stopping and wake what sleeps."""
    executions: Callable[[], Awaitable[None]]
    """Phase 2: wait for the running executions (cancel, abandon)."""
    leave: Callable[[], Awaitable[None]]
    """Phase 4, beside the ``LAST`` cancellations: this instance's row removed."""
    release: Callable[[float], Awaitable[None]]
    """Phase 5, given the seconds left: observers told, resources let go."""


class Lifecycle:
    """Starts the services in order and stops them in the two phases."""

    def __init__(
        self,
        name: str,
        services: Iterable[Service],
        *,
        state: RunState,
        link: DatabaseLink,
        steps: StopSteps,
        results_wait: float,
        retry_cap: float,
    ) -> None:
        self.name = name
        self.services: list[Service] = list(services)
        """In start order; a service may be added before the start (``add``)."""
        self.state = state
        self.link = link
        self.steps = steps
        self.results_wait = results_wait
        self.retry_cap = retry_cap
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """The running services' tasks, by name."""
        self._started = False

    def add(self, service: Service) -> None:
        """Register a service (before the start): it runs in production and manual mode alike."""
        if self._started:
            raise RuntimeError(f"scheduler {self.name} is started: add {service.name!r} before")
        if any(s.name == service.name for s in self.services):
            raise ValueError(f"scheduler {self.name} already has a service {service.name!r}")
        self.services.append(service)

    @property
    def started(self) -> bool:
        return self._started

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every service's loop, supervised, in list order; no round trip here."""
        self._started = True
        for service in self.services:
            self.tasks[service.name] = asyncio.create_task(
                self._supervise(service.name, service.loop), name=f"ekbatan:{service.name}"
            )

    def start_manual(self) -> None:
        """Manual mode: start the ``Manual.LOOP`` services' loops, unsupervised (a crash is
        the driver's error: ``crashed``); the driver calls ``step`` for the others."""
        self._started = True
        for service in self.services:
            if service.manual is Manual.LOOP:
                self.tasks[service.name] = asyncio.create_task(
                    service.loop(), name=f"ekbatan:{service.name}"
                )

    async def step(self) -> dict[str, object]:
        """Manual mode: one round of each ``Manual.STEP`` service, in list order; what each
        returned, by name."""
        done: dict[str, object] = {}
        for service in self.services:
            if service.manual is Manual.STEP and service.step is not None:
                done[service.name] = await service.step()
        return done

    def crashed(self) -> tuple[str, BaseException] | None:
        """A service's loop that ended with an error (manual mode: nothing restarts it)."""
        for name, task in self.tasks.items():
            if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                return name, error
        return None

    # -- stop ----------------------------------------------------------------------------------

    def _named(self, stop: Stop) -> list[str]:
        return [s.name for s in self.services if s.stop is stop]

    async def stop(self) -> None:
        """The two-phase stop (the module's docstring)."""
        self.steps.begin()
        # 1. stop claiming. The poller is not cancelled at once: a claim interrupted
        # mid-statement may have committed and its rows would stay picked, run by nobody until
        # revived. Woken by ``begin``, it finishes its statement, starts what it claimed
        # (waited for below like any execution) and returns; a database that does not answer
        # gets shutdown_results_wait.
        await self.cancel(*self._named(Stop.FIRST))
        for name in self._named(Stop.CLAIMING):
            await self.drain(name, timeout=self.results_wait)
        # 2. wait for the running executions.
        await self.steps.executions()
        # 3. record. The last results, their history and leaving share shutdown_results_wait:
        # with the database down, a stop must still fit a pod's grace period. What is left
        # unrecorded is revived after the dead window, like an abandoned execution.
        deadline = asyncio.get_running_loop().time() + self.results_wait
        for service in self.services:
            if service.stop is Stop.FLUSH and service.close is not None:
                service.close()
                await self.drain(service.name, timeout=_left(deadline))
        # 4. stop heartbeats and housekeeping, and leave.
        await self._leave(_left(deadline))
        # 5. release.
        await self.steps.release(_left(deadline))

    async def _leave(self, timeout: float) -> None:
        """Nothing runs any more: heartbeats can stop. Removing this instance's row is cosmetic
        (a stopped instance's row would age out anyway): never worth a long wait on a
        connection that died silently. Both at once: a statement cancelled on a silent
        connection costs SQLAlchemy's polite close (2 s) each."""

        async def leave() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.steps.leave(), timeout=timeout)

        await asyncio.gather(self.cancel(*self._named(Stop.LAST)), leave())

    async def drain(self, name: str, timeout: float) -> None:
        """Let a loop that was told to close finish its work; cancel it after ``timeout``."""
        task = self.tasks.get(name)
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except TimeoutError:
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)  # its statement's connection is discarded
            log.warning(
                "scheduler %s: the %s did not finish in %.1fs (shutdown_results_wait); what it "
                "had not recorded is revived after the dead window",
                self.name,
                name,
                timeout,
            )
        except Exception:  # manual mode: a loop that crashed (the driver reported it)
            return

    async def cancel(self, *names: str) -> None:
        """Cancel the named loops all at once, then wait for them: a loop cancelled in a
        statement on a silent connection takes SQLAlchemy's polite close (2 s), and those
        waits overlap instead of adding up."""
        tasks = {self.tasks[name]: name for name in names if name in self.tasks}
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=_CANCEL_WAIT)
        for task in done:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                log.warning("scheduler %s: the %s ended with %r", self.name, tasks[task], error)
        for task in pending:  # never a stop that waits on a connection that went silent
            log.warning(
                "scheduler %s: the %s did not end within %.0fs of its cancellation; left behind",
                self.name,
                tasks[task],
                _CANCEL_WAIT,
            )

    async def _supervise(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a loop; if it crashes, log it, count it, and restart it after a backoff."""
        bind_log_context(scheduler=self.name)  # this loop's task: its records name us
        backoff = Backoff(self.retry_cap)
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.state.loop_restarts += 1
                delay = backoff.next()
                log.exception(
                    "scheduler %s: the %s loop crashed; restarting it in %.2fs",
                    self.name,
                    name,
                    delay,
                    extra={"scheduler": self.name},
                )
                self.link.report("loop-crashed", f"{name} loop crashed (restarted)")
                await asyncio.sleep(delay)


def _left(deadline: float) -> float:
    return max(deadline - asyncio.get_running_loop().time(), 0.01)
