"""A plain scheduler process of the chaos harness (no web server): ``python -m
tests.chaos.worker URL [options]``, with the ``CHAOS_*`` environment of ``tests/chaos/jobs.py``.

It prints ``STARTED`` once its registry started (the database may still be away) and ``READY``
once the scheduler reached the database. SIGTERM stops it gracefully (two-phase shutdown);
``CHAOS_DEADLINE`` or the harness's exit stops it in any case.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta

from ekbatan_fastapi import OffsetClock, SchedulerBuilder, job_registry


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("url")
    parser.add_argument("--name", required=True, help="the scheduler name (picked_by)")
    parser.add_argument("--poll", type=float, default=0.5, help="polling interval, seconds")
    parser.add_argument("--heartbeat", type=float, default=0.25, help="seconds")
    parser.add_argument("--missed", type=int, default=6, help="missed_heartbeats_limit")
    parser.add_argument("--shutdown-wait", type=float, default=1.0, help="seconds, applied 2x")
    parser.add_argument(
        "--clock-offset", type=float, default=0.0, help="this process's clock error, seconds"
    )
    parser.add_argument("--dialect", default=None, help="a b.dialect(...) override")
    parser.add_argument("--pooler", default=None, help="b.pooler(...)")
    parser.add_argument("--statement-timeout", type=float, default=None, help="seconds")
    parser.add_argument("--strategy", default=None, help="b.polling_strategy(...)")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> int:
    # Imported here: it configures itself from CHAOS_* (ledger, watchdog).
    from tests.chaos import jobs as chaos_jobs

    observer = chaos_jobs.ledger_observer()

    def customize(b: SchedulerBuilder) -> None:
        if observer is not None:
            b.observer(observer)
        b.missed_heartbeats_limit(args.missed)
        b.scheduler_name(args.name)
        if args.clock_offset:
            b.clock(OffsetClock(timedelta(seconds=args.clock_offset)))
        if args.dialect:
            b.dialect(args.dialect)
        if args.pooler:
            b.pooler(args.pooler)
        if args.statement_timeout is not None:
            b.statement_timeout(timedelta(seconds=args.statement_timeout))
        if args.strategy:
            b.polling_strategy(args.strategy)

    registry = (
        job_registry()
        .connection_provider(args.url)
        .with_jobs(chaos_jobs.job_instances())
        .poll_interval(timedelta(seconds=args.poll))
        .heartbeat_interval(timedelta(seconds=args.heartbeat))
        .shutdown_max_wait(timedelta(seconds=args.shutdown_wait))
        .customize_scheduler(customize)
        .build()
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with registry:
        print("STARTED", flush=True)
        waiter = asyncio.create_task(registry.wait_until_ready())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            print("READY", flush=True)
        await stopper
        waiter.cancel()
        chaos_jobs.ledger().write("stopping")
    scheduler = registry.scheduler
    chaos_jobs.ledger().write(
        "stopped",
        strategy=str(scheduler.polling_strategy),
        write_conflicts=scheduler.store.db.write_conflicts,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ["CHAOS_DB_URL"] = args.url  # the chaos-settle job's own connection, when asked
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s [{args.name} {os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
