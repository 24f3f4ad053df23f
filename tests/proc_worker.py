"""A scheduler process for the multi-process tests: ``python -m tests.proc_worker MODE URL``.

Modes:
  slots  a 200 ms fixed-rate job that inserts its slot into ``ledger`` (slot is UNIQUE) in
         ``ctx.transaction()``: the insert commits with the slot's completion
  long   a job that records its start in ``starts`` and then runs until the process dies
  limited  a one-time job ``export`` with max_concurrency 2 that records its start and end in
         ``spans`` and sleeps ``--work`` seconds
  rollout  a recurring job ``rolling`` with the schedule ``--schedule`` (its string form), run by
         an application of version ``--app-version`` (a rolling deploy)
  schedules  a ``PersistentScheduleJob`` ``perslots`` whose slots insert (schedule, slot, pid,
         data) into ``schedule_ledger`` (the key is (schedule, slot)); a schedule whose data
         says ``"hang": true`` records its start that way and then runs until the process dies
  retries  an hourly recurring job ``flaky`` (due when the test puts its row) whose attempts
         insert (slot, attempt, pid) into ``attempts``; attempts 1-3 fail, retried 300 ms later
  overlap  a recurring job ``overlapping`` every ``--period`` seconds with
         ``Overlap.cancel_other()`` (due when the test puts its row) whose runs insert (slot,
         pid) into ``overlap_runs``; the first run ever then runs until it is cancelled
It prints READY once its scheduler reached the database, and stops gracefully on SIGTERM.
The two tables are described by ``LEDGERS`` (portable over every dialect; tests create them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from datetime import UTC, datetime, timedelta

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.types import TypeEngine

from ekbatan_fastapi import (
    CatchUp,
    DistributedJob,
    ExecutionContext,
    FailureHandler,
    Job,
    MaxRetries,
    OneTimeJob,
    Overlap,
    PersistentScheduleJob,
    RetryLater,
    Schedule,
    Schedules,
    job_registry,
)
from ekbatan_fastapi.store.tables import UTCDateTime


def _timestamp() -> TypeEngine[datetime]:
    return DateTime(timezone=True).with_variant(UTCDateTime(), "mysql", "mariadb")


LEDGERS = MetaData()
ledger = Table(
    "ledger",
    LEDGERS,
    Column("slot", _timestamp(), primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("started", _timestamp(), nullable=True),
)
spans = Table(
    "spans",
    LEDGERS,
    Column("instance", String(100), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started", _timestamp(), nullable=False),
    Column("ended", _timestamp(), nullable=False),
)
schedule_ledger = Table(
    "schedule_ledger",
    LEDGERS,
    Column("instance", String(100), primary_key=True),
    Column("slot", _timestamp(), primary_key=True),
    Column("pid", Integer, primary_key=True),
    Column("data", String(200), nullable=False),
)
attempts = Table(
    "attempts",
    LEDGERS,
    Column("slot", _timestamp(), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("pid", Integer, nullable=False),
)
overlap_runs = Table(
    "overlap_runs",
    LEDGERS,
    Column("slot", _timestamp(), primary_key=True),
    Column("pid", Integer, nullable=False),
)
starts = Table(
    "starts",
    LEDGERS,
    Column("slot", _timestamp()),
    Column("pid", Integer),
    Column("started", _timestamp()),
)


class SlotsJob(DistributedJob):
    def __init__(self, engine: AsyncEngine, period: float) -> None:
        self.engine = engine
        self.period = period

    def name(self) -> str:
        return "slots"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(seconds=self.period))

    async def execute(self, ctx: ExecutionContext) -> None:
        # The slot's effect commits with its completion (``ctx.transaction()``): a process
        # SIGKILLed between the two would otherwise leave a written slot whose row is still
        # held, and its revival (at-least-once, as db-scheduler's) would write it again.
        async with ctx.transaction() as conn:
            await conn.execute(
                insert(ledger).values(
                    slot=ctx.execution_time, pid=os.getpid(), started=datetime.now(UTC)
                )
            )


class MissingJob(SlotsJob):
    """Minutely, its row put behind by the test: the slots it missed are named once."""

    def name(self) -> str:
        return "missing"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(minutes=1))


class LongJob(DistributedJob):
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def name(self) -> str:
        return "long"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(hours=1))

    async def execute(self, ctx: ExecutionContext) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(starts).values(
                    slot=ctx.execution_time, pid=os.getpid(), started=datetime.now(UTC)
                )
            )
        await asyncio.sleep(3600)


class ExportJob(OneTimeJob):
    """At most two run at once across the cluster; each records its start and end."""

    def __init__(self, engine: AsyncEngine, work: float) -> None:
        self.engine = engine
        self.work = work

    def name(self) -> str:
        return "export"

    def max_concurrency(self) -> int | None:
        return 2

    async def execute(self, ctx: ExecutionContext) -> None:
        started = datetime.now(UTC)
        await asyncio.sleep(self.work)
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(spans).values(
                    instance=ctx.task_instance,
                    pid=os.getpid(),
                    started=started,
                    ended=datetime.now(UTC),
                )
            )


class FlakyJob(DistributedJob):
    """Fails its slot's first three attempts; a retry follows 300 ms later."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def name(self) -> str:
        return "flaky"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(hours=1))

    def failure_handler(self) -> FailureHandler | None:
        return MaxRetries(5, RetryLater(timedelta(milliseconds=300)))

    async def execute(self, ctx: ExecutionContext) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(attempts).values(
                    slot=ctx.execution_time, attempt=ctx.attempt, pid=os.getpid()
                )
            )
        if ctx.attempt <= 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")


class OverlappingJob(DistributedJob):
    """Its first run ever hangs until its next slot cancels it (``Overlap.cancel_other``)."""

    def __init__(self, engine: AsyncEngine, period: float) -> None:
        self.engine = engine
        self.period = period

    def name(self) -> str:
        return "overlapping"

    def schedule(self) -> Schedule:
        return Schedules.fixed_rate(timedelta(seconds=self.period))

    def overlap(self) -> Overlap:
        return Overlap.cancel_other()

    async def execute(self, ctx: ExecutionContext) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(overlap_runs).values(slot=ctx.execution_time, pid=os.getpid())
            )
            runs = (await conn.execute(select(func.count()).select_from(overlap_runs))).scalar()
        if runs == 1:
            await asyncio.sleep(3600)


class RollingJob(DistributedJob):
    def __init__(self, schedule: str) -> None:
        self._schedule = Schedules.parse_schedule(schedule)

    def name(self) -> str:
        return "rolling"

    def schedule(self) -> Schedule:
        return self._schedule

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


class PerSlotsJob(PersistentScheduleJob):
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def name(self) -> str:
        return "perslots"

    def catch_up(self) -> CatchUp:
        return CatchUp.all(max_slots=1000)  # a slot found late still runs: none is skipped

    async def execute(self, ctx: ExecutionContext) -> None:
        hang = isinstance(ctx.data, dict) and ctx.data.get("hang")
        row = {
            "instance": ctx.task_instance,
            "slot": ctx.execution_time,
            # a hanging slot is recorded per process (a revived one runs again elsewhere)
            "pid": os.getpid() if hang else 0,
            "data": json.dumps(ctx.data, sort_keys=True),
        }
        async with self.engine.begin() as conn:
            await conn.execute(insert(schedule_ledger).values(**row))
        if hang:
            await asyncio.sleep(3600)


def _job(args: argparse.Namespace, engine: AsyncEngine) -> Job:
    if args.mode == "schedules":
        return PerSlotsJob(engine)
    if args.mode == "slots":
        return SlotsJob(engine, args.period)
    if args.mode == "long":
        return LongJob(engine)
    if args.mode == "missing":
        return MissingJob(engine, 60.0)
    if args.mode == "rollout":
        return RollingJob(args.schedule)
    if args.mode == "retries":
        return FlakyJob(engine)
    if args.mode == "overlap":
        return OverlappingJob(engine, args.period)
    return ExportJob(engine, args.work)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode",
        choices=[
            "slots",
            "long",
            "limited",
            "rollout",
            "schedules",
            "retries",
            "overlap",
            "missing",
        ],
    )
    parser.add_argument("url")
    parser.add_argument("--heartbeat", type=float, default=0.2)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--period", type=float, default=0.2)
    parser.add_argument("--dialect", default=None, help="a b.dialect(...) override")
    parser.add_argument("--work", type=float, default=0.3, help="seconds per export")
    parser.add_argument("--schedule", default="FIXED_RATE|PT1H", help="rollout: the schedule")
    parser.add_argument("--app-version", default=None, help="rollout: jobs.app-version")
    parser.add_argument("--claim-ahead", type=float, default=0.0, help="seconds")
    parser.add_argument("--missed", type=int, default=4, help="missed heartbeats limit")
    parser.add_argument("--liveness-lock", default="auto", help="auto, on or off")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"[{os.getpid()}] %(levelname)s %(message)s")
    engine = create_async_engine(args.url, pool_size=2)
    job = _job(args, engine)
    registry = (
        job_registry()
        .connection_provider(args.url)
        .with_job(job)
        .poll_interval(timedelta(seconds=args.poll))
        .heartbeat_interval(timedelta(seconds=args.heartbeat))
        .shutdown_max_wait(timedelta(seconds=1))
        .customize_scheduler(lambda b: b.missed_heartbeats_limit(args.missed))
        .customize_scheduler(lambda b: b.liveness_lock(args.liveness_lock))
        .customize_scheduler(lambda b: b.dialect(args.dialect) if args.dialect else None)
        .customize_scheduler(lambda b: b.app_version(args.app_version))
        .customize_scheduler(lambda b: b.claim_ahead(timedelta(seconds=args.claim_ahead)))
        .build()
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with registry:
        await registry.wait_until_ready()
        print("READY", flush=True)
        await stop.wait()
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
