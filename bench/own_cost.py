"""The scheduler's own work per no-op execution, without a database: what
``bench/throughput.py``'s worker CPU per execution holds beyond ``bench/driver_floor.py``'s
statements (less the poll's and the completion's parameters, which this leaves out).

A real ``Scheduler`` is built (no connection is opened) with one no-op ``OneTimeJob`` and an
observer like ``throughput.py``'s; its completer's store answers every result as recorded,
at once. Each round launches ``BATCH`` claimed rows (``TaskRow`` as a poll builds them) through
``Executor.launch``, as the poller does, and turns the event loop until every execution ran, its
result (with its history record) went through the completer and it was let go. Printed: the
CPU per execution (``time.process_time``, the best of ``--repeat`` runs), which a busy machine
inflates, and, under callgrind, the machine instructions per execution of the last run, which it
does not:

    python bench/own_cost.py                       # 20,000 executions, best of 5
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/own.%p \\
        python bench/own_cost.py --callgrind -n 2000 --repeat 2

``--callgrind`` switches the instrumentation on and off around the last run only, through
callgrind's client requests (``valgrind/callgrind.h``, compiled with ``cc`` into a temporary
library at start): the ``totals:`` line of the output file divided by ``-n`` is the count per
execution. It never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from collections.abc import Sequence
from typing import Any

try:
    from bench.common import callgrind_toggle
except ImportError:  # run as a script: bench/ is on sys.path
    from common import callgrind_toggle  # type: ignore[no-redef]

BATCH = 50
"""Rows launched per round: the default batch size, as one poll claims them."""
_NEVER = (None, None, None)
"""A claimed row's ``last_success``, ``last_failure`` and ``consecutive_failures``."""


async def measure(n: int, repeat: int, toggle: Any = None) -> list[float]:
    """CPU seconds per execution of each run (``toggle``: instrument the last run only)."""
    from ekbatan_fastapi import ExecutionContext, OneTimeJob, SchedulerObserver, job_registry
    from ekbatan_fastapi.domain.rows import Finish, TaskKey, TaskRow

    class Noop(OneTimeJob):
        def name(self) -> str:
            return "bench-noop"

        async def execute(self, ctx: ExecutionContext) -> None:
            return None

    class Timings(SchedulerObserver):  # what throughput.py's observer asks to be told
        def poll_answered(self, result: Any, started: float, seconds: float) -> None:
            return None

        def results_written(self, items: Any, recorded: Any, error: Any, seconds: float) -> None:
            return None

    registry = (
        job_registry()
        .connection_provider("postgresql+asyncpg://bench@127.0.0.1:1/never-connected")
        .with_job(Noop())
        .customize_scheduler(lambda b: b.observer(Timings()))
        .build()
    )
    scheduler = registry.scheduler
    completer, executor, held = scheduler.completer, scheduler.executor, scheduler.executions

    async def finish(items: Sequence[Finish], **_: Any) -> set[TaskKey]:
        return {f.owned.key for f in items}  # every result recorded, at once

    class NoLease:
        def idle(self) -> None:
            return None

        async def release(self) -> None:
            return None

    completer.tasks.finish = finish  # type: ignore[method-assign]
    completer.lease = NoLease()  # type: ignore[assignment]
    completer.history.ops.presence.present = True  # the history goes with the completion
    running = asyncio.ensure_future(completer.run())
    due = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    runs: list[float] = []
    for index in range(repeat):
        rows = [
            TaskRow(*("bench-noop", f"{index}-{i}", None, due, True, "me"), *_NEVER, due, 2, None)
            for i in range(n)
        ]
        instrumented = toggle is not None and index == repeat - 1
        if instrumented:
            toggle.on()
        began = time.process_time()
        for start in range(0, n, BATCH):
            for row in rows[start : start + BATCH]:
                executor.launch(row)
            while held.executing or completer.pending or len(held):  # noqa: ASYNC110
                await asyncio.sleep(0)  # one turn of the loop: no timer, nothing else wakes
        runs.append((time.process_time() - began) / n)
        if instrumented:
            toggle.off()
    completer.close()
    await running
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=20_000, help="executions per run (20000)")
    p.add_argument("--repeat", type=int, default=5, help="runs (best; 5)")
    p.add_argument("--callgrind", action="store_true", help="instrument the last run only")
    args = p.parse_args(argv)
    toggle = callgrind_toggle() if args.callgrind else None
    runs = asyncio.run(measure(args.n, args.repeat, toggle))
    print(
        f"python {sys.version.split()[0]}: {args.n} no-op executions per run, best of "
        f"{len(runs)}: {min(runs) * 1e6:.2f} us CPU per execution "
        f"(runs: {', '.join(f'{r * 1e6:.1f}' for r in runs)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
