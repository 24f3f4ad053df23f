"""Which of the package's files and functions one recurring execution enters, in order.

A ``sys.setprofile`` trace of the real scheduler (no TimeMachine, no stubs) on a private
PostgreSQL (``bench/common.py``, or ``--url``): one recurring job runs once to warm up, its row
is made due again with a plain ``UPDATE``, the poller is woken, and every call into a function
of ``ekbatan_fastapi`` is recorded until the execution's history row is written. Calls made by
the loops that are not on the execution's path (the housekeeper's heartbeats, the
maintenance, the loop-lag monitor, the history retention, the listener, the liveness watch)
are left out by the task they run in.

    python -m bench.trace_execution [--url URL] [--json]

prints the count of files and functions and the functions in the order they were first
entered (docs/architecture.md, "One execution, from the poll to its history row").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import fresh_schema, private_postgres

PACKAGE = Path(__file__).resolve().parent.parent / "ekbatan_fastapi"
COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")
"""Code objects of comprehensions (Python 3.11; inlined from 3.12 on) are not functions."""
OFF_PATH = (
    "Housekeeper",
    "Maintenance",
    "LoopLagMonitor",
    "retain",
    "Listener",
    "_leave",
    "LivenessWatch",
)
"""Frames of these loops (by qualified name of the task's first coroutine) are not on the
execution's path."""


def _task_root(task: asyncio.Task[Any] | None) -> str:
    if task is None:
        return ""
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None)
    inner = getattr(coro, "cr_await", None)
    names = [getattr(coro, "__qualname__", "")]
    # _supervise(name, loop): the loop it supervises is in its frame's locals
    if frame is not None and "loop" in frame.f_locals:
        names.append(getattr(frame.f_locals["loop"], "__qualname__", ""))
    while inner is not None and hasattr(inner, "__qualname__"):
        names.append(inner.__qualname__)
        inner = getattr(inner, "cr_await", None)
    return " ".join(names)


class Trace:
    """The package's functions entered, in first-entry order, with their files."""

    def __init__(self) -> None:
        self.order: list[tuple[str, str]] = []
        self.seen: set[tuple[str, str]] = set()
        self.left_out: set[tuple[str, str]] = set()
        self._roots: dict[int, bool] = {}

    def _on_path(self) -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return True
        if task is None:
            return True
        key = id(task)
        known = self._roots.get(key)
        if known is None:
            root = _task_root(task)
            known = not any(name in root for name in OFF_PATH)
            self._roots[key] = known
        return known

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        path = Path(code.co_filename)
        if PACKAGE not in path.parents:
            return
        if code.co_name in COMPREHENSIONS:
            return
        entry = (str(path.relative_to(PACKAGE.parent)), code.co_qualname)
        if entry in self.seen:
            return
        if not self._on_path():
            self.left_out.add(entry)
            return
        self.seen.add(entry)
        self.order.append(entry)

    def files(self) -> list[str]:
        return list(dict.fromkeys(f for f, _ in self.order))


async def trace(url: str) -> Trace:
    from ekbatan_fastapi import (
        DistributedJob,
        ExecutionContext,
        Schedule,
        Schedules,
        job_registry,
    )
    from ekbatan_fastapi.engine.observer import ExecutionFinished, SchedulerObserver

    finished: asyncio.Queue[ExecutionFinished] = asyncio.Queue()

    class Seen(SchedulerObserver):
        def execution_finished(self, event: ExecutionFinished) -> None:
            finished.put_nowait(event)

    class Traced(DistributedJob):
        def name(self) -> str:
            return "traced"

        def schedule(self) -> Schedule:
            return Schedules.fixed_delay(dt.timedelta(hours=1))

        async def execute(self, ctx: ExecutionContext) -> None:
            return None

    registry = (
        job_registry()
        .connection_provider(url)
        .with_jobs([Traced()])
        .customize_scheduler(
            lambda b: (
                b.listen(False)
                .polling_interval(dt.timedelta(minutes=5))
                .heartbeat_interval(dt.timedelta(minutes=1))
                .observer(Seen())
            )
        )
        .build()
    )
    recorded = Trace()
    async with registry:
        await asyncio.wait_for(finished.get(), 30)  # the first run: warm-up
        await asyncio.sleep(0.2)  # its history written, the loops asleep again
        async with registry.engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE scheduled_tasks SET execution_time = now() - interval '1 second' "
                    "WHERE task_name = 'traced'"
                )
            )
        scheduler = registry.scheduler
        assert scheduler is not None
        sys.setprofile(recorded)
        try:
            scheduler.request_poll()
            await asyncio.wait_for(finished.get(), 30)
            # the history row: written with the completion on PostgreSQL; elsewhere by the
            # history writer's next batch
            await asyncio.sleep(0.3)
        finally:
            sys.setprofile(None)
    return recorded


def report(t: Trace) -> str:
    files = t.files()
    lines = [
        f"one recurring execution: {len(files)} files, {len(t.order)} functions of the package",
        "",
    ]
    for file in files:
        names = [name for f, name in t.order if f == file]
        lines.append(f"{file} ({len(names)}): {', '.join(names)}")
    return "\n".join(lines)


async def run(url: str | None) -> Trace:
    with private_postgres(url) as server:
        async with fresh_schema(server.url, "ekbatan_trace") as db_url:
            return await trace(db_url)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a PostgreSQL server on this machine (default: a private one)")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    args = p.parse_args(argv)
    t = asyncio.run(run(args.url))
    if args.json:
        print(json.dumps({"files": t.files(), "functions": t.order}, indent=1))
    else:
        print(report(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
