"""OpenTelemetry tracing of the scheduler (the optional ``[otel]`` extra, ``opentelemetry-api``).

``EkbatanTracing`` is a ``SchedulerObserver``: register it with the builder, or set
``ekbatan.jobs.opentelemetry: true`` with the FastAPI integration::

    tracing = EkbatanTracing()                       # the global TracerProvider
    registry = job_registry()...customize_scheduler(lambda b: b.observer(tracing)).build()

What it makes (docs/opentelemetry.md):

* one span per execution, ``execute <task name>`` (kind CONSUMER), current while the job runs
  (the job's own spans are its children, also in a plain ``def``'s worker thread), ended when
  the result is recorded, with ``ekbatan.task_name``, ``ekbatan.task_instance``,
  ``ekbatan.slot``, ``ekbatan.version``, ``ekbatan.picked_by``, ``ekbatan.outcome`` and more;
* a link from an execution of a one-time task to the span that scheduled it: a
  ``client.schedule()`` inside an active span stores its W3C ``traceparent`` in
  ``ekbatan_trace_context`` (migration V0005), in the scheduling transaction;
* with ``statements=True``, a span per poll and per completion statement.

opentelemetry is imported only when an ``EkbatanTracing`` is created (this module is imported
only then by the FastAPI integration), so the core never needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .domain.errors import ConfigurationError
from .domain.logs import library_logger
from .domain.rows import Outcome
from .domain.version import VERSION
from .engine.observer import ExecutionFinished, ExecutionStarted, SchedulerObserver
from .store.traces import TraceStore

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from .engine.scheduler import Scheduler

__all__ = ["INSTRUMENTATION_NAME", "EkbatanTracing"]

log = library_logger(__name__)

INSTRUMENTATION_NAME = "ekbatan_fastapi"
"""The tracer's (instrumentation scope's) name."""

_ERRORS = {Outcome.FAILED, Outcome.TIMED_OUT, Outcome.PARKED}
_LINK_WAIT = 2.0
"""Seconds an execution waits at most for its stored trace context (then runs unlinked)."""


def _trace_api() -> Any:
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        raise ConfigurationError(
            "OpenTelemetry tracing needs opentelemetry-api: pip install 'ekbatan-fastapi[otel]' "
            "(and an SDK or distro to export the spans), or set ekbatan.jobs.opentelemetry "
            "to false"
        ) from None
    return trace, context, TraceContextTextMapPropagator()


@dataclass(slots=True)
class _Open:
    """An execution's span, from its start to its recorded result."""

    span: Span
    linked: bool
    """It was scheduled in a stored trace context (deleted once the task is done)."""


class EkbatanTracing(SchedulerObserver):
    """Spans of the scheduler's executions (and, ``statements=True``, of its poll and
    completion statements) from ``tracer_provider`` (default: the global one, as set by the
    application's SDK or distro). ``link_scheduling`` (default True): an execution of a
    one-time task links to the span its ``schedule()`` ran in."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        statements: bool = False,
        link_scheduling: bool = True,
    ) -> None:
        self._trace, self._context, self._propagator = _trace_api()
        self._tracer = self._trace.get_tracer(
            INSTRUMENTATION_NAME, VERSION, tracer_provider=tracer_provider
        )
        self.statements = statements
        self.link_scheduling = link_scheduling
        self._open: dict[tuple[str, str, int], _Open] = {}
        self._traces: TraceStore | None = None
        self._db_system = ""
        self._scheduler = ""
        self._cleanups: set[asyncio.Task[None]] = set()

    def attached(self, scheduler: Scheduler) -> None:
        self._traces = scheduler.store.traces
        name = scheduler.store.dialect.name
        self._db_system = "mysql" if name == "mysql5" else name
        self._scheduler = scheduler.name

    # -- the scheduling side ------------------------------------------------------------

    def scheduling_context(self) -> Mapping[str, str] | None:
        if not self.link_scheduling:
            return None
        span = self._trace.get_current_span()
        if not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier

    # -- executions ---------------------------------------------------------------------

    def execution_scope(self, execution: ExecutionStarted) -> _ExecutionScope:
        return _ExecutionScope(self, execution)

    async def _links(self, execution: ExecutionStarted) -> list[Any]:
        """The link to the span that scheduled a one-time task (none when none is stored)."""
        traces = self._traces
        if not (self.link_scheduling and execution.one_time and traces is not None):
            return []
        try:
            async with asyncio.timeout(_LINK_WAIT):
                if not await traces.look():
                    return []
                stored = await traces.load(execution.task_name, execution.task_instance)
        except Exception as error:  # a span without its link, never a failed execution
            log.debug("could not read the trace context of %s: %s", execution.task_name, error)
            return []
        if stored is None:
            return []
        carrier = {"traceparent": stored.traceparent}
        if stored.tracestate:
            carrier["tracestate"] = stored.tracestate
        scheduled = self._trace.get_current_span(self._propagator.extract(carrier))
        span_context = scheduled.get_span_context()
        if not span_context.is_valid:
            return []
        return [self._trace.Link(span_context, {"ekbatan.link": "scheduled"})]

    def _start(self, execution: ExecutionStarted, links: list[Any]) -> Span:
        attributes: dict[str, Any] = {
            "ekbatan.task_name": execution.task_name,
            "ekbatan.task_instance": execution.task_instance,
            "ekbatan.slot": execution.execution_time.isoformat(),
            "ekbatan.version": execution.version,
            "ekbatan.picked_by": execution.picked_by,
            "ekbatan.consecutive_failures": execution.consecutive_failures,
            "ekbatan.kind": "one-time" if execution.one_time else "recurring",
        }
        if execution.backfill:
            attributes["ekbatan.backfill"] = True
        span: Span = self._tracer.start_span(
            f"execute {execution.task_name}",
            context=self._context.Context(),  # a trace of its own (a forced run's too)
            kind=self._trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        key = (execution.task_name, execution.task_instance, execution.version)
        self._open[key] = _Open(span, bool(links))
        return span

    def _ended_early(self, execution: ExecutionStarted, error: BaseException) -> None:
        """Abandoned (past the shutdown wait or its timeout's grace) or its task cancelled:
        no result comes; end the span now."""
        key = (execution.task_name, execution.task_instance, execution.version)
        opened = self._open.pop(key, None)
        if opened is None:
            return
        ended = "cancelled" if isinstance(error, asyncio.CancelledError) else "abandoned"
        opened.span.set_attribute("ekbatan.outcome", ended)
        opened.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, ended))
        opened.span.end()

    def execution_finished(self, event: ExecutionFinished) -> None:
        opened = self._open.pop((event.task_name, event.task_instance, event.version), None)
        if opened is None:
            return
        span = opened.span
        span.set_attribute("ekbatan.outcome", event.outcome.value)
        if event.consecutive_failures is not None:
            span.set_attribute("ekbatan.consecutive_failures", event.consecutive_failures)
        if event.error is not None:
            span.record_exception(event.error)
        if event.outcome in _ERRORS:
            description = f"{type(event.error).__name__}: {event.error}" if event.error else None
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))
        span.end()
        if event.deleted and opened.linked:
            self._forget_context(event.task_name, event.task_instance)

    def slot_missed(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        """A slot that passed without a run: a span of no duration of its own (a trace of its
        own), ``missed {task}``, with the slot and the reason."""
        attributes = {
            "ekbatan.task_name": task_name,
            "ekbatan.task_instance": task_instance,
            "ekbatan.slot": slot.isoformat(),
            "ekbatan.reason": reason,
            "ekbatan.outcome": "missed",
            "ekbatan.scheduler": self._scheduler,
        }
        span = self._tracer.start_span(
            f"missed {task_name}",
            context=self._context.Context(),
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attributes,
        )
        span.end()

    def _forget_context(self, task_name: str, task_instance: str) -> None:
        """The task is done: delete its stored context (in the background; what fails here
        the housekeeper's hourly pruning deletes)."""
        traces = self._traces
        if traces is None:
            return

        async def forget() -> None:
            try:
                await traces.delete(task_name, task_instance)
            except Exception as error:
                log.debug("could not delete the trace context of %s: %s", task_name, error)

        task = asyncio.get_running_loop().create_task(forget())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    # -- statements ---------------------------------------------------------------------

    def statement_scope(self, operation: str, rows: int) -> Any:
        if not self.statements:
            return None
        return self._statement(operation, rows)

    @contextmanager
    def _statement(self, operation: str, rows: int) -> Iterator[None]:
        attributes = {
            "db.system": self._db_system,
            "db.operation.name": operation,
            "ekbatan.scheduler": self._scheduler,
            "ekbatan.rows": rows,
        }
        with self._tracer.start_as_current_span(
            f"ekbatan {operation}", kind=self._trace.SpanKind.CLIENT, attributes=attributes
        ):
            yield

    def polled(self, duration: float, claimed: int) -> None:
        if self.statements:  # called inside the poll's span
            self._trace.get_current_span().set_attribute("ekbatan.claimed", claimed)


class _ExecutionScope:
    """The execution's span: started (with its link) and made current before ``execute``."""

    def __init__(self, tracing: EkbatanTracing, execution: ExecutionStarted) -> None:
        self._tracing = tracing
        self._execution = execution
        self._token: Any = None

    async def __aenter__(self) -> None:
        tracing = self._tracing
        links = await tracing._links(self._execution)
        span = tracing._start(self._execution, links)
        self._token = tracing._context.attach(tracing._trace.set_span_in_context(span))

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            self._tracing._context.detach(self._token)
        if exc is not None:
            self._tracing._ended_early(self._execution, exc)
