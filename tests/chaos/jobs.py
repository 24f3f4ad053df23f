"""The chaos harness's jobs, its execution ledger and an observer that writes the ledger.

Imported by the plain scheduler processes (``tests/chaos/worker.py``) and by the example app
(``tests/chaos/app.py``, with ``EKBATAN_JOBS__MODULES=tests.chaos.jobs``), each registering
``ledger_observer()`` on its scheduler, and configured by environment variables so that
every process of a run registers the same jobs:

``CHAOS_LEDGER_DIR``  where each process appends its ledger (``ledger-<pid>.jsonl``); required
``CHAOS_RECURRING``   how many recurring jobs (``chaos-r00`` ...), each FIXED_RATE 200-500 ms
``CHAOS_EXTRA``       comma-separated extra one-time jobs: ``long``, ``block``, ``sync``
``CHAOS_LABEL``       this process's name in the ledger
``CHAOS_DEADLINE``    a wall-clock time (epoch seconds) after which the process stops itself

The ledger is a file per process, written with one ``os.write`` per record on an
``O_APPEND`` descriptor: a record survives SIGKILL and SIGSTOP of its writer, and it does
not depend on the database that the faults are injected into.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    ExecutionSuperseded,
    FailureHandler,
    Job,
    OneTimeJob,
    RetryLater,
    Schedule,
    SchedulerObserver,
    Schedules,
    distributed_job,
)
from ekbatan_fastapi.domain.rows import Finish, FinishKind, TaskKey

__all__ = [
    "EFFECTS_TABLE",
    "ONCE",
    "PREFIX",
    "SETTLE",
    "Ledger",
    "LedgerObserver",
    "Ledgered",
    "job_instances",
    "ledger_observer",
    "micros",
    "recurring_period",
    "recurring_work",
]

PREFIX = "chaos-"
ONCE = "chaos-once"
LONG = "chaos-long"
BLOCK = "chaos-block"
SYNC = "chaos-sync"
SETTLE = "chaos-settle"
EFFECTS_TABLE = "chaos_effects"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def micros(value: datetime) -> int:
    """A slot as integer microseconds since the epoch (exact, unlike a float)."""
    return (value - _EPOCH) // _MICRO


def recurring_period(index: int) -> timedelta:
    """Job ``index``'s fixed-rate period: spread over 200-500 ms, the same in every process."""
    return timedelta(milliseconds=200 + (index * 37) % 301)


def recurring_work(index: int) -> float:
    """Seconds job ``index`` works per slot: 0 to 45 % of its period."""
    return recurring_period(index).total_seconds() * ((index * 13) % 46) / 100


class Ledger:
    """This process's append-only ledger file."""

    def __init__(self, directory: Path, label: str) -> None:
        self.directory = directory
        self.label = label
        self._fd: int | None = None
        self._pid = -1

    def write(self, event: str, **fields: Any) -> None:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            path = self.directory / f"ledger-{pid}.jsonl"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = pid
        record = {"e": event, "pid": pid, "t": time.time(), **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


_ledger: Ledger | None = None


def ledger() -> Ledger:
    global _ledger
    if _ledger is None:
        directory = os.environ.get("CHAOS_LEDGER_DIR")
        if not directory:
            raise RuntimeError("CHAOS_LEDGER_DIR is not set: the chaos jobs need a ledger")
        _ledger = Ledger(Path(directory), os.environ.get("CHAOS_LABEL", f"pid-{os.getpid()}"))
    return _ledger


def _slot_fields(ctx: ExecutionContext) -> dict[str, Any]:
    return {
        "task": ctx.task_name,
        "inst": ctx.task_instance,
        "slot": micros(ctx.execution_time),
        "ver": ctx.version,
        "by": ctx.picked_by,
    }


class Bailed(Exception):
    """A polite job stopped early because its heartbeats went stale."""


class Ledgered:
    """Writes ``start`` before the work and ``end`` (with the outcome) after it."""

    async def ledgered(self, ctx: ExecutionContext, work: Callable[[], Awaitable[None]]) -> None:
        fields = _slot_fields(ctx)
        ledger().write("start", **fields)
        try:
            await work()
        except asyncio.CancelledError:
            ledger().write("end", outcome="cancelled", **fields)
            raise
        except Bailed as error:
            ledger().write("end", outcome="bailed", detail=str(error), **fields)
            raise
        except Exception as error:
            ledger().write("end", outcome="failed", detail=repr(error)[:200], **fields)
            raise
        ledger().write("end", outcome="ok", **fields)


class ChaosRecurring(Ledgered, DistributedJob):
    """Recurring job ``index``: a FIXED_RATE slot that works for a fixed fraction of it."""

    index = 0

    def name(self) -> str:
        return f"{PREFIX}r{self.index:02d}"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(recurring_period(self.index))

    async def execute(self, ctx: ExecutionContext) -> None:
        await self.ledgered(ctx, functools.partial(asyncio.sleep, recurring_work(self.index)))


class _Retried(OneTimeJob):
    def failure_handler(self) -> FailureHandler:
        return RetryLater(timedelta(seconds=1))


class ChaosOnce(Ledgered, _Retried):
    """A one-time task that works for ``data["ms"]`` milliseconds."""

    def name(self) -> str:
        return ONCE

    async def execute(self, ctx: ExecutionContext) -> None:
        seconds = float(ctx.data.get("ms", 0)) / 1000 if isinstance(ctx.data, dict) else 0.0
        await self.ledgered(ctx, functools.partial(asyncio.sleep, seconds))


class ChaosLong(Ledgered, _Retried):
    """Works ``data["seconds"]``; a polite one (``data["polite"]``) gives up once half of the
    dead window passed without a successful heartbeat, before a peer can take it over."""

    def name(self) -> str:
        return LONG

    async def execute(self, ctx: ExecutionContext) -> None:
        data = ctx.data if isinstance(ctx.data, dict) else {}
        seconds = float(data.get("seconds", 1.0))
        polite = bool(data.get("polite", False))

        async def work() -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                fraction = ctx.heartbeat_state.fraction_dead
                if polite and fraction >= 0.5:
                    raise Bailed(f"fraction_dead={fraction:.2f}")
                await asyncio.sleep(0.02)

        await self.ledgered(ctx, work)


class ChaosBlock(Ledgered, _Retried):
    """An ``async def`` that blocks the event loop for ``data["seconds"]`` (a mistake)."""

    def name(self) -> str:
        return BLOCK

    async def execute(self, ctx: ExecutionContext) -> None:
        seconds = float(ctx.data.get("seconds", 1.0)) if isinstance(ctx.data, dict) else 1.0

        async def work() -> None:
            time.sleep(seconds)  # noqa: ASYNC251 - deliberately blocks the event loop

        await self.ledgered(ctx, work)


class ChaosSync(_Retried):
    """A plain ``def`` (it runs in a worker thread) that works ``data["seconds"]`` and ignores
    ``ctx.is_shutting_down``: it cannot be cancelled at shutdown."""

    def name(self) -> str:
        return SYNC

    def execute(self, ctx: ExecutionContext) -> None:
        seconds = float(ctx.data.get("seconds", 1.0)) if isinstance(ctx.data, dict) else 1.0
        fields = _slot_fields(ctx)
        ledger().write("start", **fields)
        time.sleep(seconds)
        ledger().write("end", outcome="ok", **fields)


class ChaosSettle(_Retried):
    """Writes one row of ``chaos_effects`` for its instance and holds ``data["hold"]`` seconds
    after it: inside ``ctx.transaction()`` (``data["tx"]``: the effect commits with the slot),
    or committed at once on a connection of its own (without: at least once). The ledger gets
    ``start``, ``in-block`` (the effect is written, the hold begins) and ``end``."""

    def name(self) -> str:
        return SETTLE

    async def execute(self, ctx: ExecutionContext) -> None:
        data = ctx.data if isinstance(ctx.data, dict) else {}
        hold = float(data.get("hold", 0.0))
        fields = _slot_fields(ctx)
        effect = text(
            f"INSERT INTO {EFFECTS_TABLE} (task_instance, pid, version) VALUES (:i, :p, :v)"
        )
        params = {"i": ctx.task_instance, "p": os.getpid(), "v": ctx.version}
        ledger().write("start", **fields)
        try:
            if data.get("tx"):
                if data.get("stop_at_commit"):
                    _STOP_AT_COMMIT[ctx.task_name, ctx.task_instance] = float(
                        data["stop_at_commit"]
                    )
                async with ctx.transaction() as conn:
                    await conn.execute(effect, params)
                    ledger().write("in-block", **fields)
                    await asyncio.sleep(hold)
            else:
                async with _plain_engine().begin() as conn:
                    await conn.execute(effect, params)
                ledger().write("in-block", **fields)
                await asyncio.sleep(hold)
        except asyncio.CancelledError:
            ledger().write("end", outcome="cancelled", **fields)
            raise
        except ExecutionSuperseded as error:
            ledger().write("end", outcome="superseded", detail=str(error)[:120], **fields)
            raise
        except Exception as error:
            ledger().write("end", outcome="failed", detail=repr(error)[:200], **fields)
            raise
        ledger().write("end", outcome="ok", **fields)


_STOP_AT_COMMIT: dict[tuple[str, str], float] = {}
"""Instances whose ``ctx.transaction()`` pauses between its completion and its commit."""
_engines: list[AsyncEngine] = []


def _plain_engine() -> AsyncEngine:
    """The effects' own engine (the process's database URL, ``CHAOS_DB_URL``)."""
    if not _engines:
        _engines.append(create_async_engine(os.environ["CHAOS_DB_URL"], pool_size=2))
    return _engines[0]


_EXTRA_CLASSES: dict[str, type[Job]] = {
    "long": ChaosLong,
    "block": ChaosBlock,
    "sync": ChaosSync,
    "settle": ChaosSettle,
}


def _configured_classes() -> list[type[Job]]:
    """Marked subclasses for this process's configuration, found by the example app's
    ``@distributed_job`` discovery (each class gives one instance, hence one class per job)."""
    classes: list[type[Job]] = []
    for index in range(int(os.environ.get("CHAOS_RECURRING", "0"))):
        classes.append(type(f"ChaosRecurring{index:02d}", (ChaosRecurring,), {"index": index}))
    classes.append(type("ChaosOnceJob", (ChaosOnce,), {}))
    for kind in filter(None, os.environ.get("CHAOS_EXTRA", "").split(",")):
        base = _EXTRA_CLASSES.get(kind.strip())
        if base is None:
            raise RuntimeError(f"CHAOS_EXTRA: unknown job kind {kind!r}")
        classes.append(type(f"{base.__name__}Job", (base,), {}))
    return [distributed_job(cls) for cls in classes]


def job_instances() -> list[Job]:
    """One instance of every configured job (for a registry built by hand)."""
    return [cls() for cls in _CLASSES]


# -- an observer of the scheduler: which results were recorded, which rows were revived --------


class LedgerObserver(SchedulerObserver):
    """Writes the results the completer sent (recorded, rejected, or lost to an error after
    which the statement may have committed: the audit knows) and the revivals of dead
    executions into the ledger. It only observes. Every chaos process registers one
    (``ledger_observer``): the worker with its builder, the app through ``tests.chaos.app``."""

    def results_written(
        self,
        items: Sequence[Finish],
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        event = "finish-error" if recorded is None else "recorded"
        for item in items:
            owned = item.owned
            if not owned.task_name.startswith(PREFIX):
                continue
            ledger().write(
                event if recorded is None or owned.key in recorded else "rejected",
                task=owned.task_name,
                inst=owned.task_instance,
                ver=owned.version,
                kind=FinishKind(item.kind).name.lower(),
                next=micros(item.next_time) if item.next_time is not None else None,
            )

    def transaction_completing(self, finish: Finish) -> None:
        """A ``ctx.transaction()`` wrote its completion: an instance marked ``stop_at_commit``
        says so in the ledger and pauses there (blocking this process), so that the harness
        can SIGSTOP it while it holds the slot's row locked."""
        pause = _STOP_AT_COMMIT.pop(finish.owned.key, None)
        if pause is None:
            return
        owned = finish.owned
        ledger().write("completing", task=owned.task_name, inst=owned.task_instance)
        time.sleep(pause)

    def transaction_committed(self, finish: Finish) -> None:
        """Committed by ``ctx.transaction()``: recorded, as a completion the completer wrote."""
        self.results_written([finish], {finish.owned.key}, None, 0.0)

    def rows_revived(self, rows: Sequence[Any]) -> None:
        """Revived after the dead window (``TaskRow``) or at once by the liveness lock
        (``Held``, whose slot the look may not know)."""
        for row in rows:
            if row.task_name.startswith(PREFIX):
                hb = row.last_heartbeat
                ledger().write(
                    "revive",
                    task=row.task_name,
                    inst=row.task_instance,
                    slot=micros(row.execution_time) if row.execution_time else None,
                    ver=row.version,
                    owner=row.picked_by,
                    hb=hb.timestamp() if isinstance(hb, datetime) else None,
                )


def _watchdog() -> None:
    """Stop this process at ``CHAOS_DEADLINE`` or when its parent (the harness) is gone:
    SIGTERM first, SIGKILL 20 s later. No chaos process outlives its run."""
    deadline = float(os.environ.get("CHAOS_DEADLINE", "0")) or time.time() + 900
    parent = os.getppid()

    def watch() -> None:
        while time.time() < deadline and os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="chaos-watchdog", daemon=True).start()


_CLASSES: list[type[Job]] = []


def ledger_observer() -> SchedulerObserver | None:
    """The observer that writes this process's ledger (None outside a chaos run)."""
    return LedgerObserver() if os.environ.get("CHAOS_LEDGER_DIR") else None


if os.environ.get("CHAOS_LEDGER_DIR"):
    _CLASSES = _configured_classes()
    _watchdog()
    ledger().write("boot", label=ledger().label)
