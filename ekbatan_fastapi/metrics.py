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

import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .client.read_model import running_here
from .domain.errors import ConfigurationError
from .domain.rows import Outcome
from .domain.schedule import Schedule
from .engine.observer import ExecutionFinished, SchedulerObserver

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .engine.scheduler import Scheduler

__all__ = [
    "ALERT_RULES",
    "DURATION_BUCKETS",
    "LAG_BUCKETS",
    "POLL_BUCKETS",
    "EkbatanMetrics",
    "longest_gap",
]

_SECONDS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
DURATION_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, *_SECONDS)
LAG_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, *_SECONDS)
POLL_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
POLL_BUCKETS += (1.0, 2.5, 5.0, 10.0)


_GAPS = 10


def longest_gap(schedule: Schedule, now: datetime) -> float | None:
    """Seconds of the longest gap between consecutive slots among ``schedule``'s next few
    from ``now`` (a weekday cron's weekend counts); None for a disabled schedule."""
    if schedule.is_disabled:
        return None
    slot = schedule.initial_execution_time(now)
    longest = 0.0
    for _ in range(_GAPS):
        following = schedule.next_execution_time(slot, slot)
        longest = max(longest, (following - slot).total_seconds())
        slot = following
    return longest


ALERT_RULES = Path(__file__).parent / "prometheus" / "ekbatan-alerts.yml"
"""Prometheus alerting rules for these metrics (docs/alerts.md): copy it next to your
Prometheus configuration and list it under ``rule_files``."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'ekbatan-fastapi[metrics]'"
        ) from None
    return prometheus_client


_STREAKS_KEPT = 10_000
"""Task instances per task whose streak of missed slots the gauge keeps (past that, the
shortest is dropped: schedules come and go)."""


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
    * ``ekbatan_last_failure_timestamp_seconds{task}``: when the last failure (or timeout) seen
      by this instance finished (Unix time);
    * ``ekbatan_consecutive_failures{task}``: the row's ``consecutive_failures`` as this
      instance last wrote it (0 after a success; a failure adds one to the count the row had,
      which other instances may have raised): the table's value, from this instance's writes;
    * ``ekbatan_consecutive_missed_slots{task}``: slots in a row that passed without a run,
      as this instance last counted them (merged by ``CatchUp.latest``, skipped by its
      catch-up policy, due while a run was going), per task instance (a schedule of a
      ``PersistentScheduleJob``: each has its own streak, as ``ekbatan_missed_streaks``
      keeps them) and exported per task as the longest of its instances' streaks; a slot of
      an instance that runs here ends that instance's streak (0 once none is left);
    * ``ekbatan_missed_slots_timestamp_seconds{task}``: when this instance last counted
      missed slots of the task, or ran a slot of one of its instances here while another's
      streak goes on (Unix time): a success or failure recorded later, on any instance,
      means a slot ran since (the alert rule compares them);
    * ``ekbatan_missed_slots_total{task,reason}``: slots named as missed (``slot_missed``;
      ``record_missed_slots``), by reason: ``coalesced``, ``overlap``, ``catch_up`` (at most
      100 per completion: ``ekbatan_slots_total`` has every count);
    * ``ekbatan_heartbeat_failures_total{task}``, ``ekbatan_dead_executions_revived_total{task}``;
    * ``ekbatan_job_paused_by_failure{task}``: 1 once this instance paused the task after its
      failures (``pause_after_failures()``), 0 again at its next success recorded here;
    * ``ekbatan_running_executions{task}``: executions running on this instance (read at
      scrape time); ``sum`` over the instances against ``ekbatan_job_max_concurrency{task}``
      (its limit) shows how many run out of the limit;
    * ``ekbatan_job_timeout_seconds{task}``: a job's timeout, where it has one;
    * ``ekbatan_schedules{task,state}``: a ``PersistentScheduleJob``'s schedules by state,
      cluster-wide (read from the table when ``/metrics`` is scraped);
    * ``ekbatan_job_interval_seconds{task}``: a recurring job's longest gap between two of its
      next slots (the window of the alert rule "did not succeed", ``ALERT_RULES``).

    Per scheduler: ``ekbatan_poll_duration_seconds`` (histogram of poll statements),
    ``ekbatan_claimed_executions_total`` (rows claimed by polls),
    ``ekbatan_database_errors_total{operation}`` and ``ekbatan_write_conflicts_total``
    (MySQL/MariaDB transactions run again after error 1213: an InnoDB deadlock, or on a
    multi-primary Galera cluster a certification conflict reported at ``COMMIT``; retried
    at once, never counted as database errors).

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
        self.registry.register(_ConflictsCollector(self._conflicts))
        # labels() takes a lock and builds a key: cache the children for the hot path
        self._outcome_children: dict[tuple[str, str], Any] = {}
        self._task_children: dict[str, tuple[Any, Any]] = {}
        self._paused_here: set[str] = set()
        self._missing_here: dict[str, dict[str, int]] = {}
        """The streaks of missed slots this instance counted and no run here ended yet, by
        task and task instance (a ``PersistentScheduleJob``'s schedules each have their
        own, as ``ekbatan_missed_streaks`` keeps them): the task's gauge is the longest."""
        """Tasks this instance paused after their failures (their gauge is 1)."""

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
        self.last_failure = metric(
            prom.Gauge,
            "ekbatan_last_failure_timestamp_seconds",
            "When the last failed or timed-out execution seen by this instance finished "
            "(Unix time).",
            task,
        )
        self.consecutive_failures = metric(
            prom.Gauge,
            "ekbatan_consecutive_failures",
            "The row's consecutive_failures as this instance last recorded it.",
            task,
        )
        self.consecutive_missed = metric(
            prom.Gauge,
            "ekbatan_consecutive_missed_slots",
            "Slots in a row that passed without a run, the longest streak of the task's "
            "instances (schedules) as this instance last counted them; an instance's streak "
            "ends when a slot of it runs here.",
            task,
        )
        self.missed_at = metric(
            prom.Gauge,
            "ekbatan_missed_slots_timestamp_seconds",
            "When this instance last counted missed slots of the task, or ran a slot of it "
            "while another instance's (schedule's) streak goes on (Unix time).",
            task,
        )
        self.missed_slots = metric(
            prom.Counter,
            "ekbatan_missed_slots",
            "Slots named as missed (slot_missed; at most 100 per completion), by reason: "
            "coalesced, overlap, catch_up.",
            ("task", "reason"),
        )
        self.paused_by_failure = metric(
            prom.Gauge,
            "ekbatan_job_paused_by_failure",
            "1 once this instance paused the task after its failures (pause_after_failures); "
            "back to 0 at the task's next success recorded here.",
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
        self.schedules = metric(
            prom.Gauge,
            "ekbatan_schedules",
            "A PersistentScheduleJob's schedules by state (scheduled, running, paused, "
            "parked), cluster-wide: read from the table when /metrics is scraped.",
            ("task", "state"),
        )
        self.job_interval = metric(
            prom.Gauge,
            "ekbatan_job_interval_seconds",
            "A recurring job's longest gap between two consecutive slots of its next "
            f"{_GAPS + 1} (the alert rules' window; disabled schedules have no series).",
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
        now = scheduler.db_time()
        for name, schedule in scheduler.schedules.items():
            gap = longest_gap(schedule, now)
            if gap is not None:
                self.job_interval.labels(name).set(gap)

    def _running(self) -> dict[str, int]:
        """Running executions per task (0 for every job of an attached scheduler), counted as
        ``/jobs`` counts them (``client/read_model.py``)."""
        counts: dict[str, int] = {}
        for ref in self._schedulers:
            scheduler = ref()
            if scheduler is None:
                continue
            for name, count in running_here(scheduler).items():
                counts[name] = counts.get(name, 0) + count
        return counts

    def _conflicts(self) -> int:
        """Write conflicts retried by the attached schedulers' stores."""
        total = 0
        for ref in self._schedulers:
            scheduler = ref()
            if scheduler is not None:
                total += scheduler.store.db.write_conflicts
        return total

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
            if task in self._paused_here:
                self._paused_here.discard(task)
                self.paused_by_failure.labels(task).set(0)
        elif event.outcome in (Outcome.FAILED, Outcome.TIMED_OUT):
            self.last_failure.labels(task).set(event.finished_at.timestamp())
        if event.consecutive_failures is not None:
            self.consecutive_failures.labels(task).set(event.consecutive_failures)
            streaks = self._missing_here.get(task)
            if streaks is not None:
                self._slot_ran(task, event.task_instance, event.finished_at, streaks)

    def _slot_ran(
        self, task: str, instance: str, finished_at: datetime, streaks: dict[str, int]
    ) -> None:
        """A slot of ``instance`` ran: its streak of missed slots is over; those of the
        task's other instances (schedules) go on, stamped after this run (the alert rule
        takes a success or failure recorded after the stamp as the end of the streak)."""
        if streaks.pop(instance, None) is not None:
            self.consecutive_missed.labels(task).set(max(streaks.values(), default=0))
        if not streaks:
            del self._missing_here[task]
            return
        at = max(time.time(), finished_at.timestamp() + 0.001)
        self.missed_at.labels(task).set(at)

    def schedules_counted(self, counts: dict[str, dict[str, int]]) -> None:
        """The schedules of each ``PersistentScheduleJob`` by state (every state of each
        job gets a value: 0 where it has none)."""
        for task, by_state in counts.items():
            for state in ("scheduled", "running", "paused", "parked"):
                self.schedules.labels(task, state).set(by_state.get(state, 0))

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

    def slot_missed(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        self.missed_slots.labels(task_name, reason).inc()

    def missed_streak(self, task_name: str, task_instance: str, consecutive: int) -> None:
        streaks = self._missing_here.setdefault(task_name, {})
        if task_instance not in streaks and len(streaks) >= _STREAKS_KEPT:
            streaks.pop(min(streaks, key=streaks.__getitem__))  # the shortest goes
        streaks[task_instance] = consecutive
        self.consecutive_missed.labels(task_name).set(max(streaks.values()))
        self.missed_at.labels(task_name).set(time.time())

    def job_paused(self, task_name: str, task_instance: str, slot: datetime, reason: str) -> None:
        self._paused_here.add(task_name)
        self.paused_by_failure.labels(task_name).set(1)

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


class _ConflictsCollector:
    """``ekbatan_write_conflicts_total``, read from the stores at scrape time."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        from prometheus_client.core import CounterMetricFamily

        self._family = CounterMetricFamily

    def describe(self) -> list[Metric]:
        return [self._family("ekbatan_write_conflicts", "")]

    def collect(self) -> Iterator[Metric]:
        yield self._family(
            "ekbatan_write_conflicts",
            "Transactions run again after a write conflict (MySQL/MariaDB error 1213: a "
            "deadlock, or a Galera certification conflict).",
            value=self._count(),
        )
