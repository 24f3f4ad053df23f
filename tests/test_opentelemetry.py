"""OpenTelemetry tracing (``ekbatan_fastapi.otel``, the ``[otel]`` extra): a span per execution
with its attributes and outcome, the link to the trace that scheduled a one-time task (kept in
``ekbatan_trace_context``, migration V0005), statement spans behind a flag, and no import of
opentelemetry while tracing is off. Real schedulers on real databases; the SDK's in-memory
exporter collects the spans."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from ekbatan_fastapi import ConfigurationError, ExecutionContext, OneTimeJob, Schedules
from ekbatan_fastapi.engine.observer import ExecutionStarted, SchedulerObserver
from ekbatan_fastapi.otel import EkbatanTracing
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web.lifespan import build_registry

from .conftest import Database
from .helpers import RecordingJob, RegistryFactory, wait_until

TWO_DATABASES = pytest.mark.parametrize(
    "any_database", ["postgresql-embedded", "mysql"], indirect=True
)
"""Embedded PostgreSQL and the MySQL/MariaDB server (EKBATAN_TEST_MYSQL_URL); the others
(``any_database``'s four) where the statements differ by dialect."""
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


class Greet(OneTimeJob):
    """Makes a span of its own (a child of the execution's), in a worker thread."""

    def __init__(self, provider: TracerProvider, name: str = "greet") -> None:
        self._name = name
        self.tracer = provider.get_tracer("the-app")
        self.done: set[str] = set()

    def name(self) -> str:
        return self._name

    def execute(self, ctx: ExecutionContext) -> None:  # a plain def: a worker thread
        with self.tracer.start_as_current_span("inside the job"):
            pass
        self.done.add(ctx.task_instance)


class Boom(OneTimeJob):
    def __init__(self) -> None:
        self.calls = 0

    def name(self) -> str:
        return "boom"

    async def execute(self, ctx: ExecutionContext) -> None:
        self.calls += 1
        raise ValueError("no invoice 42")


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def tracing(provider: TracerProvider, **options: Any) -> Any:
    tracer = EkbatanTracing(provider, **options)
    return lambda b: b.observer(tracer)


async def trace_rows(engine: AsyncEngine) -> list[tuple[str, str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT task_name, task_instance, traceparent FROM ekbatan_trace_context "
                "ORDER BY task_instance"
            )
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_a_span_per_execution_with_its_attributes_and_outcome(
    any_database: Database,
    any_registries: RegistryFactory,
    exporter: InMemorySpanExporter,
    provider: TracerProvider,
) -> None:
    greet, boom = Greet(provider), Boom()
    registry = await any_registries.start(greet, boom, customize=tracing(provider))
    await registry.client.schedule("greet", "alice", data={"to": "alice"})
    await registry.client.schedule("boom", "invoice-42")
    await wait_until(lambda: len(spans(exporter, "execute greet")) == 1, what="greet's span")
    await wait_until(lambda: len(spans(exporter, "execute boom")) == 1, what="boom's span")

    (ok,) = spans(exporter, "execute greet")
    assert ok.kind is SpanKind.CONSUMER
    attributes = dict(ok.attributes or {})
    assert attributes["ekbatan.task_name"] == "greet"
    assert attributes["ekbatan.task_instance"] == "alice"
    assert attributes["ekbatan.picked_by"] == registry.scheduler.name
    assert attributes["ekbatan.outcome"] == "succeeded"
    assert attributes["ekbatan.version"] == 2  # scheduled at 1, claimed at 2
    assert attributes["ekbatan.kind"] == "one-time"
    slot = datetime.fromisoformat(str(attributes["ekbatan.slot"]))
    assert abs(slot - datetime.now(UTC)) < timedelta(minutes=1)
    assert ok.status.status_code is StatusCode.UNSET
    assert ok.links == ()  # scheduled outside any span: nothing to link to
    # the job's own span (made in its worker thread) is a child of the execution's
    (inner,) = spans(exporter, "inside the job")
    assert inner.parent is not None and inner.parent.span_id == ok.context.span_id
    assert inner.context.trace_id == ok.context.trace_id

    (failed,) = spans(exporter, "execute boom")
    failed_attributes = dict(failed.attributes or {})
    assert failed_attributes["ekbatan.outcome"] == "failed"
    assert failed_attributes["ekbatan.consecutive_failures"] == 1
    assert failed.status.status_code is StatusCode.ERROR
    assert "ValueError: no invoice 42" in (failed.status.description or "")
    (event,) = [e for e in failed.events if e.name == "exception"]
    assert (event.attributes or {})["exception.message"] == "no invoice 42"
    # the span ended with the recorded result, not before
    assert ok.end_time is not None and ok.start_time is not None
    assert ok.end_time >= ok.start_time


async def test_an_execution_links_to_the_trace_that_scheduled_it(
    any_database: Database,
    any_engine: AsyncEngine,
    any_registries: RegistryFactory,
    exporter: InMemorySpanExporter,
    provider: TracerProvider,
) -> None:
    greet = Greet(provider)
    registry = await any_registries.start(greet, customize=tracing(provider))
    client = registry.client
    request_tracer = provider.get_tracer("the-web-app")
    later = datetime.now(UTC) + timedelta(hours=1)

    # rolled back with the application's transaction: neither the task nor its context
    with request_tracer.start_as_current_span("POST /rolled-back"):
        async with registry.engine.connect() as conn:
            await conn.begin()
            assert await client.schedule("greet", "rolled-back", later, connection=conn)
            await conn.rollback()
    assert await trace_rows(any_engine) == []

    # written in the scheduling transaction, beside db-scheduler's row (its data untouched)
    with request_tracer.start_as_current_span("POST /invoices") as request:
        assert await client.schedule("greet", "bob", later, data={"to": "bob"})
    scheduled = request.get_span_context()
    ((name, instance, parent),) = await trace_rows(any_engine)
    assert (name, instance) == ("greet", "bob")
    assert parent.startswith(f"00-{scheduled.trace_id:032x}-{scheduled.span_id:016x}-")
    task = await client.get("greet", "bob")
    assert task is not None and task.data == {"to": "bob"}

    await client.pause("greet")
    with request_tracer.start_as_current_span("POST /jobs/greet/run?force=true"):
        await client.run_now("greet", "bob", force=True)  # launched here, from this span
    await wait_until(lambda: len(spans(exporter, "execute greet")) == 1, what="greet's span")
    (execution,) = spans(exporter, "execute greet")
    assert execution.parent is None  # never a child of the caller's span: linked
    (link,) = execution.links
    assert link.context.trace_id == scheduled.trace_id
    assert link.context.span_id == scheduled.span_id
    assert execution.context.trace_id != scheduled.trace_id  # its own trace, linked
    # the task is done: its context is deleted
    await wait_until(
        lambda: _no_rows(any_engine), what="the trace context deleted after the success"
    )


async def _no_rows(engine: AsyncEngine) -> bool:
    return await trace_rows(engine) == []


@TWO_DATABASES
async def test_schedule_many_keeps_contexts_of_created_rows_and_pruning_drops_orphans(
    any_database: Database,
    any_engine: AsyncEngine,
    any_registries: RegistryFactory,
    provider: TracerProvider,
) -> None:
    registry = any_registries.build(Greet(provider), customize=tracing(provider))
    client = registry.client
    later = datetime.now(UTC) + timedelta(hours=1)
    assert await client.schedule("greet", "a", later)  # outside a span: no context
    tracer = provider.get_tracer("the-web-app")
    with tracer.start_as_current_span("POST /batch"):
        created = await client.schedule_many(
            "greet", [("a", later, None), ("b", later, None), ("c", later, None)]
        )
    assert created == 2
    assert [r[1] for r in await trace_rows(any_engine)] == ["b", "c"]  # "a" existed
    await client.cancel("greet", "b")
    assert await registry.store.traces.prune() == 1
    assert [r[1] for r in await trace_rows(any_engine)] == ["c"]

    # in the application's ORM session: committed with it
    with tracer.start_as_current_span("POST /session"):
        async with AsyncSession(registry.engine) as session, session.begin():
            assert await client.schedule("greet", "d", later, connection=session)
            assert await client.schedule_many("greet", [("e", later, None)], connection=session)
    assert [r[1] for r in await trace_rows(any_engine)] == ["c", "d", "e"]


@TWO_DATABASES
async def test_the_housekeeper_prunes_contexts_whose_task_is_gone(
    any_database: Database,
    any_engine: AsyncEngine,
    any_registries: RegistryFactory,
    provider: TracerProvider,
) -> None:
    async with any_engine.begin() as conn:  # a context left by a task cancelled elsewhere
        await conn.execute(
            text(
                "INSERT INTO ekbatan_trace_context (task_name, task_instance, traceparent, "
                "created_at) VALUES ('greet', 'gone', :parent, :at)"
            ),
            {"parent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "at": datetime.now(UTC)},
        )
    assert len(await trace_rows(any_engine)) == 1
    await any_registries.start(Greet(provider))  # no tracing here: the pruning is the core's
    await wait_until(lambda: _no_rows(any_engine), what="the first housekeeping round's prune")


def test_without_the_extra_tracing_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'ekbatan-fastapi\[otel\]'"):
        EkbatanTracing()


@TWO_DATABASES
async def test_statement_spans_only_with_the_flag(
    any_database: Database,
    any_registries: RegistryFactory,
    exporter: InMemorySpanExporter,
    provider: TracerProvider,
) -> None:
    plain = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = await any_registries.start(plain, customize=tracing(provider))
    await wait_until(lambda: len(spans(exporter, "execute tick")) >= 2, what="two ticks")
    await registry.stop()
    assert spans(exporter, "ekbatan poll") == [] and spans(exporter, "ekbatan complete") == []
    exporter.clear()

    traced = RecordingJob("tock", Schedules.fixed_delay(timedelta(milliseconds=50)))
    await any_registries.start(traced, customize=tracing(provider, statements=True))
    await wait_until(lambda: len(spans(exporter, "execute tock")) >= 2, what="two tocks")
    await wait_until(lambda: spans(exporter, "ekbatan complete") != [], what="a completion span")
    executed = len(spans(exporter, "execute tock"))  # before the polls: their spans end first
    polls = spans(exporter, "ekbatan poll")
    assert polls and all(p.kind is SpanKind.CLIENT for p in polls)
    claimed = [dict(p.attributes or {}).get("ekbatan.claimed") for p in polls]
    assert all(isinstance(c, int) for c in claimed), claimed  # every poll says how many
    # every execution was claimed by a traced poll (a poll's span ends before it launches)
    assert sum(c for c in claimed if isinstance(c, int)) >= executed >= 2, (claimed, executed)
    first = dict(polls[0].attributes or {})
    assert first["db.operation.name"] == "poll"
    assert first["db.system"] == any_database.dialect.replace("mysql5", "mysql")
    complete = dict(spans(exporter, "ekbatan complete")[0].attributes or {})
    assert complete["ekbatan.rows"] >= 1
    # the execution spans are not children of the statement that claimed them
    assert all(s.parent is None for s in spans(exporter, "execute tock"))


async def test_an_execution_cancelled_at_shutdown_ends_its_span(
    registries: RegistryFactory, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    stuck = RecordingJob("stuck", Schedules.fixed_delay(timedelta(hours=1)), block=asyncio.Event())
    registry = await registries.start(stuck, shutdown=0.2, customize=tracing(provider))
    await asyncio.wait_for(stuck.started.wait(), 10)
    assert spans(exporter, "execute stuck") == []  # still running: not ended
    await registry.stop()
    (span,) = spans(exporter, "execute stuck")
    assert dict(span.attributes or {})["ekbatan.outcome"] == "cancelled"
    assert dict(span.attributes or {})["ekbatan.kind"] == "recurring"


async def test_a_failing_observer_scope_never_breaks_an_execution(
    registries: RegistryFactory,
) -> None:
    class Broken(SchedulerObserver):
        def execution_scope(self, execution: ExecutionStarted) -> Any:
            raise RuntimeError("an observer's bug")

        def statement_scope(self, operation: str, rows: int) -> Any:
            raise RuntimeError("another")

    job = RecordingJob("still-runs", Schedules.fixed_delay(timedelta(milliseconds=50)))
    registry = await registries.start(job, customize=lambda b: b.observer(Broken()))
    await wait_until(lambda: len(job.slots) >= 2, what="two runs despite the observer")
    assert registry.scheduler.observer.errors >= 2


def test_settings_turn_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+asyncpg://u@localhost/db"
    monkeypatch.setenv("EKBATAN_JOBS__OPENTELEMETRY", "true")
    monkeypatch.setenv("EKBATAN_JOBS__OPENTELEMETRY_STATEMENTS", "true")
    registry = build_registry(EkbatanSettings(), [], connection=url)
    (tracer,) = [o for o in registry.config.observers if isinstance(o, EkbatanTracing)]
    assert tracer.statements is True

    monkeypatch.setenv("EKBATAN_JOBS__OPENTELEMETRY", "false")
    with pytest.raises(ConfigurationError, match="opentelemetry: true as well"):
        build_registry(EkbatanSettings(), [], connection=url)
    monkeypatch.delenv("EKBATAN_JOBS__OPENTELEMETRY_STATEMENTS")
    registry = build_registry(EkbatanSettings(), [], connection=url)
    assert not any(isinstance(o, EkbatanTracing) for o in registry.config.observers)


_RUN_ONE = """
import asyncio, json, sys
from datetime import timedelta
from ekbatan_fastapi import ExecutionContext, OneTimeJob, job_registry

class Job(OneTimeJob):
    def __init__(self):
        self.done = asyncio.Event()
    def name(self):  # each mode its own job: the two processes share the database
        return "job-" + sys.argv[2]
    async def execute(self, ctx: ExecutionContext) -> None:
        self.done.set()

async def main():
    job = Job()
    builder = job_registry().connection_provider(sys.argv[1]).with_job(job)
    builder.poll_interval(timedelta(milliseconds=100)).heartbeat_interval(timedelta(seconds=1))
    if sys.argv[2] == "traced":
        from ekbatan_fastapi.otel import EkbatanTracing
        tracing = EkbatanTracing(statements=True)
        builder.customize_scheduler(lambda b: b.observer(tracing))
    async with builder.build() as registry:
        assert await registry.wait_until_ready(20)
        await registry.client.schedule("job-" + sys.argv[2], "one")
        await asyncio.wait_for(job.done.wait(), 20)
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))

asyncio.run(main())
"""


@pytest.mark.parametrize("any_database", ["postgresql-embedded"], indirect=True)
async def test_without_tracing_opentelemetry_is_never_imported(
    any_database: Database, any_engine: AsyncEngine
) -> None:
    """A scheduler runs a job with tracing off: no opentelemetry module is loaded (FastAPI
    itself imports opentelemetry-api since 0.16x, so this runs the core alone); with tracing
    on, it is (the check can fail)."""

    def run(mode: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_RUN_ONE), any_database.url, mode],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
        return loaded

    plain, traced = await asyncio.gather(
        asyncio.to_thread(run, "plain"), asyncio.to_thread(run, "traced")
    )
    assert plain == []
    assert "opentelemetry.trace" in traced
