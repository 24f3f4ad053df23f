"""Prometheus metrics of the scheduler (the optional ``[metrics]`` extra, ``prometheus-client``).

``EkbatanMetrics`` is a ``SchedulerObserver``: register it with the builder and serve its
registry::

    metrics = EkbatanMetrics()                       # its own CollectorRegistry
    registry = job_registry()...customize_scheduler(lambda b: b.observer(metrics)).build()
    app.mount("/metrics", metrics.asgi_app())        # any ASGI app; or metrics.render()

With the FastAPI integration, ``ekbatan.jobs.metrics: true`` does the registering and
``metrics_router`` serves ``GET /metrics``. prometheus_client is imported only when an
``EkbatanMetrics`` is created, so the core never needs it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .domain.errors import ConfigurationError
from .domain.records import Outcome
from .engine.observer import ExecutionFinished, SchedulerObserver

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .engine.scheduler import Scheduler

__all__ = ["DURATION_BUCKETS", "LAG_BUCKETS", "POLL_BUCKETS", "EkbatanMetrics"]

_SECONDS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
DURATION_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, *_SECONDS)
LAG_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, *_SECONDS)
POLL_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
POLL_BUCKETS += (1.0, 2.5, 5.0, 10.0)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'ekbatan-fastapi[metrics]'"
        ) from None
    return prometheus_client


class EkbatanMetrics(SchedulerObserver):
    """The scheduler's metrics, in ``registry`` (by default a new ``CollectorRegistry`` of its
    own, so that two applications or two tests in one process never collide; pass
    ``prometheus_client.REGISTRY`` to add them to the process-wide one).

    Per task (label ``task`` = the task name; instance ids are never labels):

    * ``ekbatan_executions_total{task,outcome}``: finished executions by outcome
      (succeeded, failed, timed_out, superseded, cancelled);
    * ``ekbatan_execution_duration_seconds{task}``: how long ``execute`` ran (histogram);
    * ``ekbatan_execution_slot_lag_seconds{task}``: start minus the slot's execution_time,
      on the database clock, observed when the execution starts (histogram);
    * ``ekbatan_last_success_timestamp_seconds{task}``: when the last success seen by this
      instance finished (Unix time);
    * ``ekbatan_consecutive_failures{task}``: the row's ``consecutive_failures`` as this
      instance last wrote it (0 after a success; a failure adds one to the count the row had,
      which other instances may have raised): the table's value, from this instance's writes;
    * ``ekbatan_heartbeat_failures_total{task}``, ``ekbatan_dead_executions_revived_total{task}``;
    * ``ekbatan_running_executions{task}``: executions running on this instance (read at
      scrape time); ``sum`` over the instances against ``ekbatan_job_max_concurrency{task}``
      (its limit) shows how many run out of the limit;
    * ``ekbatan_job_timeout_seconds{task}``: a job's timeout, where it has one.

    Per scheduler: ``ekbatan_poll_duration_seconds`` (histogram of poll statements),
    ``ekbatan_claimed_executions_total`` (rows claimed by polls) and
    ``ekbatan_database_errors_total{operation}``.

    Timestamps and gauges describe what this instance saw: across a cluster, aggregate with
    ``max`` (last success, consecutive failures) or ``sum`` (counters, running).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        duration_buckets: Sequence[float] = DURATION_BUCKETS,
        lag_buckets: Sequence[float] = LAG_BUCKETS,
        poll_buckets: Sequence[float] = POLL_BUCKETS,
    ) -> None:
        prom = _prometheus()
        self._prom = prom
        self.registry: CollectorRegistry = (
            registry if registry is not None else prom.CollectorRegistry()
        )
        self._define_task_metrics(tuple(duration_buckets), tuple(lag_buckets))
        self._define_scheduler_metrics(tuple(poll_buckets))
        self._define_limit_metrics()
        self._schedulers: list[weakref.ref[Scheduler]] = []
        self.registry.register(_RunningCollector(self._running))
        # labels() takes a lock and builds a key: cache the children for the hot path
        self._outcome_children: dict[tuple[str, str], Any] = {}
        self._task_children: dict[str, tuple[Any, Any]] = {}

    def _metric(
        self, kind: Any, name: str, documentation: str, labels: Sequence[str], **options: Any
    ) -> Any:
        return kind(name, documentation, labels, registry=self.registry, **options)

    def _define_task_metrics(
        self, duration_buckets: tuple[float, ...], lag_buckets: tuple[float, ...]
    ) -> None:
        prom, metric = self._prom, self._metric
        task = ("task",)
        self.executions = metric(
            prom.Counter,
            "ekbatan_executions",
            "Finished executions by task and outcome.",
            ("task", "outcome"),
        )
        self.duration = metric(
            prom.Histogram,
            "ekbatan_execution_duration_seconds",
            "How long a task's execute() ran.",
            task,
            buckets=duration_buckets,
        )
        self.slot_lag = metric(
            prom.Histogram,
            "ekbatan_execution_slot_lag_seconds",
            "Start of an execution minus its slot (execution_time), database clock.",
            task,
            buckets=lag_buckets,
        )
        self.last_success = metric(
            prom.Gauge,
            "ekbatan_last_success_timestamp_seconds",
            "When the last successful execution seen by this instance finished (Unix time).",
            task,
        )
        self.consecutive_failures = metric(
            prom.Gauge,
            "ekbatan_consecutive_failures",
            "The row's consecutive_failures as this instance last recorded it.",
            task,
        )
        self.heartbeat_failures = metric(
            prom.Counter,
            "ekbatan_heartbeat_failures",
            "Failed heartbeats of running executions (database error or row taken over).",
            task,
        )
        self.dead_revived = metric(
            prom.Counter,
            "ekbatan_dead_executions_revived",
            "Executions whose heartbeats stopped, revived by this instance.",
            task,
        )
        self.slots = metric(
            prom.Counter,
            "ekbatan_slots",
            "Slots of recurring tasks decided by their catch-up policy, by decision: missed "
            "(coalesced into a later run), caught_up (run late, one by one), skipped (not run).",
            ("task", "decision"),
        )

    def _define_limit_metrics(self) -> None:
        prom, metric = self._prom, self._metric
        self.job_timeout = metric(
            prom.Gauge,
            "ekbatan_job_timeout_seconds",
            "A job's timeout (jobs without one have no series).",
            ("task",),
        )
        self.job_max_concurrency = metric(
            prom.Gauge,
            "ekbatan_job_max_concurrency",
            "A job's cluster-wide concurrency limit (per key where it has one).",
            ("task",),
        )

    def _define_scheduler_metrics(self, poll_buckets: tuple[float, ...]) -> None:
        prom, metric = self._prom, self._metric
        self.poll_duration = metric(
            prom.Histogram,
            "ekbatan_poll_duration_seconds",
            "Duration of the statements that claim due executions.",
            (),
            buckets=poll_buckets,
        )
        self.claimed = metric(
            prom.Counter, "ekbatan_claimed_executions", "Executions claimed by polls.", ()
        )
        self.database_errors = metric(
            prom.Counter,
            "ekbatan_database_errors",
            "Failed database statements of the scheduler (retried with backoff).",
            ("operation",),
        )

    # -- serving ------------------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition (body, content type); OpenMetrics if ``accept`` asks for it."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving the metrics (``app.mount("/metrics", metrics.asgi_app())``)."""
        app: Callable[..., Any] = self._prom.make_asgi_app(self.registry)
        return app

    # -- the observer -------------------------------------------------------------------

    def attached(self, scheduler: Scheduler) -> None:
        self._schedulers.append(weakref.ref(scheduler))
        for name, limits in scheduler.limits.items():
            if limits.timeout is not None:
                self.job_timeout.labels(name).set(limits.timeout.total_seconds())
            if limits.max_concurrency is not None:
                self.job_max_concurrency.labels(name).set(limits.max_concurrency)

    def _running(self) -> dict[str, int]:
        """Running executions per task (0 for every job of an attached scheduler)."""
        counts: dict[str, int] = {}
        for ref in self._schedulers:
            scheduler = ref()
            if scheduler is None:
                continue
            for name in scheduler.jobs:
                counts.setdefault(name, 0)
            for execution in list(scheduler.running.values()):
                task = execution.row.task_name
                counts[task] = counts.get(task, 0) + 1
        return counts

    def _task(self, task: str) -> tuple[Any, Any]:
        children = self._task_children.get(task)
        if children is None:
            children = (self.duration.labels(task), self.slot_lag.labels(task))
            self._task_children[task] = children
        return children

    def execution_started(self, task_name: str, task_instance: str, slot_lag: float) -> None:
        self._task(task_name)[1].observe(max(0.0, slot_lag))

    def execution_finished(self, event: ExecutionFinished) -> None:
        task = event.task_name
        key = (task, event.outcome.value)
        counter = self._outcome_children.get(key)
        if counter is None:
            counter = self._outcome_children[key] = self.executions.labels(*key)
        counter.inc()
        self._task(task)[0].observe(event.duration)
        if event.outcome is Outcome.SUCCEEDED:
            self.last_success.labels(task).set(event.finished_at.timestamp())
        if event.consecutive_failures is not None:
            self.consecutive_failures.labels(task).set(event.consecutive_failures)

    def polled(self, duration: float, claimed: int) -> None:
        self.poll_duration.observe(duration)
        if claimed:
            self.claimed.inc(claimed)

    def heartbeat_failed(self, task_name: str, task_instance: str) -> None:
        self.heartbeat_failures.labels(task_name).inc()

    def dead_execution_revived(
        self, task_name: str, task_instance: str, picked_by: str | None
    ) -> None:
        self.dead_revived.labels(task_name).inc()

    def slots_counted(self, task_name: str, missed: int, caught_up: int, skipped: int) -> None:
        for decision, count in (("missed", missed), ("caught_up", caught_up), ("skipped", skipped)):
            if count:
                self.slots.labels(task_name, decision).inc(count)

    def database_error(self, operation: str, error: BaseException) -> None:
        self.database_errors.labels(operation).inc()


class _RunningCollector:
    """``ekbatan_running_executions{task}``, counted from the schedulers at scrape time."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts
        from prometheus_client.core import GaugeMetricFamily

        self._family = GaugeMetricFamily

    def describe(self) -> list[Metric]:
        return [self._family("ekbatan_running_executions", "", labels=["task"])]

    def collect(self) -> Iterator[Metric]:
        family = self._family(
            "ekbatan_running_executions",
            "Executions running on this instance.",
            labels=["task"],
        )
        for task, count in sorted(self._counts().items()):
            family.add_metric([task], count)
        yield family
