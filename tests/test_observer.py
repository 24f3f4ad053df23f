"""The observer hooks: what the scheduler reports, and that an observer cannot break it."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ConfigurationError, Outcome, Scheduler, Schedules, job_registry
from ekbatan_fastapi.engine.observer import ExecutionFinished, SchedulerObserver

from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until


class Recorder(SchedulerObserver):
    def __init__(self) -> None:
        self.schedulers: list[Scheduler] = []
        self.started: list[tuple[str, str, float]] = []
        self.finished: list[ExecutionFinished] = []
        self.polls: list[tuple[float, int]] = []
        self.heartbeat_failures: list[tuple[str, str]] = []
        self.revived: list[tuple[str, str, str | None]] = []
        self.db_errors: list[str] = []

    def attached(self, scheduler: Scheduler) -> None:
        self.schedulers.append(scheduler)

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        self.started.append((task_name, task_instance, slot_lag))

    def execution_finished(self, event: ExecutionFinished) -> None:
        self.finished.append(event)

    def polled(self, duration: float, claimed: int) -> None:
        self.polls.append((duration, claimed))

    def heartbeat_failed(self, task_name: str, task_instance: str) -> None:
        self.heartbeat_failures.append((task_name, task_instance))

    def dead_execution_revived(
        self, task_name: str, task_instance: str, picked_by: str | None
    ) -> None:
        self.revived.append((task_name, task_instance, picked_by))

    def database_error(self, operation: str, error: BaseException) -> None:
        self.db_errors.append(operation)

    def outcomes(self, name: str) -> list[Outcome]:
        return [e.outcome for e in self.finished if e.task_name == name]


async def test_executions_and_polls_are_reported(registries: RegistryFactory) -> None:
    seen = Recorder()
    ok = RecordingJob("ok", Schedules.fixed_delay(timedelta(hours=1)))
    bad = RecordingJob("bad", Schedules.fixed_delay(timedelta(hours=1)), fail=True)
    once = CountingJob()
    registry = await registries.start(ok, bad, once, customize=lambda b: b.observer(seen))
    await registry.client.schedule("count", "a")
    await wait_until(lambda: len(seen.finished) == 3, what="three finished executions")
    assert seen.schedulers == [registry.scheduler]
    by_name = {e.task_name: e for e in seen.finished}
    assert by_name["ok"].outcome is Outcome.SUCCEEDED and by_name["ok"].consecutive_failures == 0
    assert by_name["bad"].outcome is Outcome.FAILED and by_name["bad"].consecutive_failures == 1
    assert isinstance(by_name["bad"].error, RuntimeError)
    assert by_name["count"].task_instance == "a"
    assert by_name["ok"].execution_time == ok.slots[0]
    for event in seen.finished:
        assert 0 <= event.duration < 5
        assert -0.5 < event.slot_lag < 5  # the database clock is estimated: tiny skew allowed
    assert sorted(name for name, _, _ in seen.started) == ["bad", "count", "ok"]
    assert sum(claimed for _, claimed in seen.polls) == 3
    assert all(duration >= 0 for duration, _ in seen.polls)
    assert (seen.heartbeat_failures, seen.revived, seen.db_errors) == ([], [], [])


async def test_superseded_runs_heartbeat_failures_and_revivals_are_reported(
    registries: RegistryFactory, engine: AsyncEngine
) -> None:
    seen = Recorder()
    release = asyncio.Event()
    held = RecordingJob("held", Schedules.fixed_delay(timedelta(hours=1)), block=release)
    once = CountingJob()
    # "held" stops heartbeating once superseded: a 5 s dead window keeps the housekeeper from
    # reviving it (as well as the ghost) when a loaded machine delays its sweep past 1 s
    registry = await registries.start(
        held, once, customize=lambda b: b.observer(seen).missed_heartbeats_limit(50)
    )
    await asyncio.wait_for(held.started.wait(), 5)
    async with engine.begin() as conn:
        # another instance took "held" over meanwhile ...
        await conn.execute(text("UPDATE scheduled_tasks SET version = version + 1"))
        # ... and a crashed one left "count/x" picked with an old heartbeat
        await conn.execute(
            text(
                "INSERT INTO scheduled_tasks (task_name, task_instance, execution_time, picked, "
                "picked_by, last_heartbeat, version, consecutive_failures, priority) VALUES "
                "('count', 'x', now() - interval '1 hour', true, 'ghost', "
                "now() - interval '1 hour', 3, 0, 0)"
            )
        )
    await wait_until(lambda: seen.heartbeat_failures != [], what="a failed heartbeat")
    assert seen.heartbeat_failures[0] == ("held", "recurring")
    await wait_until(lambda: seen.revived != [], what="a revival")
    assert seen.revived == [("count", "x", "ghost")]
    await wait_until(lambda: once.runs["x"] == 1, what="the revived run")
    release.set()
    await wait_until(lambda: seen.outcomes("held") != [], what="the superseded run")
    assert seen.outcomes("held") == [Outcome.SUPERSEDED]
    assert [e.consecutive_failures for e in seen.finished if e.task_name == "held"] == [None]
    assert registry.scheduler.observer.errors == 0


class Broken(SchedulerObserver):
    """Every hook it overrides raises (a hook it does not override is never called)."""

    def attached(self, scheduler: Any) -> None:
        raise RuntimeError("observer bug in attached")

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        raise RuntimeError("observer bug in execution_started")

    def execution_finished(self, event: Any) -> None:
        raise RuntimeError("observer bug in execution_finished")

    def polled(self, duration: float, claimed: int) -> None:
        raise RuntimeError("observer bug in polled")


async def test_a_failing_observer_is_logged_and_never_stops_the_scheduler(
    registries: RegistryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    job = CountingJob()
    with caplog.at_level(logging.ERROR, logger="ekbatan_fastapi.engine.observer"):
        registry = await registries.start(job, customize=lambda b: b.observer(Broken()))
        for instance in "abc":
            await registry.client.schedule("count", instance)
        await wait_until(lambda: sum(job.runs.values()) == 3, what="three runs")
        await wait_until(lambda: registry.scheduler.running == {}, what="recorded")
    assert registry.scheduler.observer.errors >= 7  # attached + 3 starts + 3 finishes (+ polls)
    hooks = sorted(
        r.getMessage().split(" in ")[-1].split(" ")[0]
        for r in caplog.records
        if "observer Broken raised" in r.getMessage()
    )
    # logged once per hook (rate limited), with the traceback; on a loaded machine a
    # heartbeat round may come within the executions and log its hook too
    assert len(hooks) == len(set(hooks)), hooks
    assert {"attached", "execution_finished", "execution_started", "polled"} <= set(hooks)


def test_observer_must_be_a_scheduler_observer() -> None:
    not_an_observer: Any = object()
    builder = job_registry().connection_provider("postgresql+asyncpg://u@h/db")
    builder.customize_scheduler(lambda b: b.observer(not_an_observer))
    with pytest.raises(ConfigurationError, match="SchedulerObserver"):
        builder.build()
