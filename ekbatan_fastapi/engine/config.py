"""Every setting of Ekbatan, in one place: ``SchedulerConfig``.

Each field is declared with its default, its description and its rule (bounds, choices). The
settings model (``ekbatan_fastapi.settings``: ``ekbatan.jobs.<key>``, ``EKBATAN_JOBS__<KEY>``)
is generated from these fields, the builder (``SchedulerBuilder``) sets them by name, and
``SchedulerConfig.validate`` applies the rules: adding a setting is one field here (and its
docs). ``settings_of()`` lists them (the settings reference in the docs is built from it).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..domain.clock import Clock, SystemClock
from ..domain.durations import format_iso_duration, parse_iso_duration
from ..domain.errors import ConfigurationError
from ..domain.limits import JobOverride
from ..domain.origins import parse_origin
from ..domain.rows import PollingStrategy
from ..domain.tasks import dead_after
from ..domain.text import is_valid_name
from ..store.options import DEFAULT_IDLE_TRANSACTION_TIMEOUT, validate_pooler
from ..store.tables import DEFAULT_TABLE_NAME, validate_table_name
from .logs import LOG_HANDLER_MODES
from .observer import SchedulerObserver

if TYPE_CHECKING:
    from ..store.dialects import Dialect

__all__ = [
    "DEFAULT_RESULTS_WAIT",
    "LIVENESS_LOCK_MODES",
    "MAX_CLAIM_AHEAD",
    "MAX_DURATION",
    "MIN_MISSED_HEARTBEATS",
    "SchedulerConfig",
    "Setting",
    "closest",
    "default_scheduler_name",
    "settings_of",
]

MIN_MISSED_HEARTBEATS = 4
DEFAULT_RESULTS_WAIT = 5.0
"""Seconds a stop gives the database to record the last results (see ``shutdown_results_wait``)."""
MAX_CLAIM_AHEAD = timedelta(seconds=10)
"""The longest ``claim_ahead``: rows claimed ahead are held by this instance until their time,
out of reach of the others."""
MAX_DURATION = timedelta(days=36_500)
"""The longest duration a scheduler takes (100 years): the loops add each to today's date
and subtract it, which a much longer one would carry out of the calendar."""
SCHEDULER_NAME_LENGTH = 50
"""The ``picked_by`` column's limit (``varchar(50)`` on MySQL)."""

Kind = Literal["duration", "integer", "boolean", "text", "texts", "object"]


def default_scheduler_name() -> str:
    """``<host>-<pid>`` cut to 50 characters (the ``picked_by`` value)."""
    return f"{socket.gethostname()}-{os.getpid()}"[-SCHEDULER_NAME_LENGTH:]


def closest(word: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known word nearest ``word`` (a misspelt key), if any is near enough."""
    import difflib

    found = difflib.get_close_matches(word, list(known), n=1, cutoff=cutoff)
    return found[0] if found else None


@dataclass(frozen=True)
class Setting:
    """One setting: what the settings model, the builder, the validation and the docs know."""

    name: str
    description: str
    kind: Kind
    default: Any
    """The default value (for lists: an empty list); see ``default_text``."""
    optional: bool = False
    """None is a value (its meaning is in the description)."""
    shortest: Any = None
    longest: Any = None
    example: str | None = None
    """A value to show in errors (``PT10S``)."""
    why: str = ""
    """Appended to an error about the bounds: why they are what they are."""
    check: Callable[[Any], Any] | None = None
    """Besides the type and the bounds: returns the value (normalized) or raises ValueError or
    ConfigurationError naming the problem."""
    item: str = "values"
    """For a list: what its items are (in errors)."""
    in_file: bool = True
    """A key of ``ekbatan.jobs`` (settings file, environment); False: only the builder's."""
    builder: bool = True
    """Set by ``SchedulerBuilder`` (``b.<name>(value)``); False: read by the FastAPI
    integration from the settings, not by the scheduler."""
    shown: str | None = None
    """The default as the docs show it, when computed at run time (``<host>-<pid>``)."""

    @property
    def key(self) -> str:
        """The settings key as the docs spell it (``polling-interval``)."""
        return self.name.replace("_", "-")

    @property
    def environment(self) -> str | None:
        """The environment variable, for a settings key."""
        return f"EKBATAN_JOBS__{self.name.upper()}" if self.in_file else None

    @property
    def default_text(self) -> str:
        """The default as the docs and the settings file write it."""
        value = self.default
        if self.shown is not None:
            return self.shown
        if isinstance(value, timedelta):
            return format_iso_duration(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "none"
        return "[]" if isinstance(value, list) else str(value)

    def checked(self, value: Any) -> Any:
        """``value`` if it follows this setting's rule (normalized by ``check``); else a
        ValueError whose text reads after the setting's name (``must be ...``)."""
        if value is None and self.optional:
            return None
        value = _TYPE_CHECKS[self.kind](self, value)
        if self.shortest is not None or self.longest is not None:
            _check_bounds(self, value)
        if self.check is not None:
            try:
                value = self.check(value)
            except ConfigurationError as error:
                raise ValueError(str(error)) from None
        return value

    def error(self, problem: ValueError) -> ConfigurationError:
        """``checked``'s complaint as the builder says it: ``name must be ...``."""
        text = str(problem)
        if not text.startswith(self.name):
            joint = " " if text.startswith(("must ", "is ")) else ": "
            text = f"{self.name}{joint}{text}"
        return ConfigurationError(text)


def _python(example: str | None) -> str:
    if example is None:
        return ""
    return f"; e.g. {parse_iso_duration(example)!r}"


def _duration(setting: Setting, value: Any) -> Any:
    if not isinstance(value, timedelta):
        raise ValueError(
            f"must be a datetime.timedelta, got {type(value).__name__} {value!r}"
            f"{_python(setting.example)}"
        )
    return value


def _integer(setting: Setting, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, got {type(value).__name__} {value!r}")
    return value


def _boolean(setting: Setting, value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {type(value).__name__} {value!r}")
    return value


def _text(setting: Setting, value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {type(value).__name__} {value!r}")
    return value


def _texts(setting: Setting, value: Any) -> Any:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"must be a list of strings ({setting.item}), got {value!r}")
    return list(value)


def _anything(setting: Setting, value: Any) -> Any:
    return value


_TYPE_CHECKS: dict[Kind, Callable[[Setting, Any], Any]] = {
    "duration": _duration,
    "integer": _integer,
    "boolean": _boolean,
    "text": _text,
    "texts": _texts,
    "object": _anything,
}


def _check_bounds(setting: Setting, value: Any) -> None:
    low, high = setting.shortest, setting.longest
    if (low is None or low <= value) and (high is None or value <= high):
        return
    why = f"; {setting.why}" if setting.why else ""
    if setting.kind == "integer":
        if high is None:
            raise ValueError(f"must be at least {low}, got {value}{why}")
        raise ValueError(f"must be an integer from {low} to {high}, got {value}{why}")
    shown = format_iso_duration(value)
    span = f"{format_iso_duration(low)} to {format_iso_duration(high)}"
    if value <= timedelta(0) < low:
        problem = f"must be longer than zero, got {shown}"
    elif value < low:
        problem = f"{shown} is shorter than the shortest allowed, {format_iso_duration(low)}"
    else:
        problem = f"{shown} is longer than the longest allowed, {format_iso_duration(high)}"
    example = f", e.g. {setting.example}" if setting.example else ""
    raise ValueError(f"{problem} (allowed: {span}){example}{why}")


# -- the declarations: one call per setting ------------------------------------------------


def _declare(kind: Kind, default: Any, description: str, **rule: Any) -> Any:
    """A dataclass field carrying its ``Setting`` (named when the class is built); a list,
    a dict or a callable default is a factory."""
    if isinstance(default, list | dict) or callable(default):
        factory = default if callable(default) else type(default)
        metadata = {"setting": (kind, factory(), description, rule)}
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata={"setting": (kind, default, description, rule)})


def duration(
    default: str | None,
    description: str,
    *,
    shortest: str,
    longest: str,
    example: str | None = None,
    why: str = "",
    optional: bool = False,
    in_file: bool = True,
    builder: bool = True,
) -> Any:
    """A duration setting, ISO-8601 in the settings (``PT10S``), bounded."""
    return _declare(
        "duration",
        None if default is None else parse_iso_duration(default),
        description,
        shortest=parse_iso_duration(shortest),
        longest=parse_iso_duration(longest),
        example=example or default,
        why=why,
        optional=optional or default is None,
        in_file=in_file,
        builder=builder,
    )


def integer(
    default: int | None,
    description: str,
    *,
    least: int,
    most: int | None = None,
    why: str = "",
    in_file: bool = True,
    builder: bool = True,
) -> Any:
    return _declare(
        "integer",
        default,
        description,
        shortest=least,
        longest=most,
        why=why,
        optional=default is None,
        in_file=in_file,
        builder=builder,
    )


def flag(default: bool, description: str, in_file: bool = True, builder: bool = True) -> Any:
    return _declare("boolean", default, description, in_file=in_file, builder=builder)


def text(
    default: str | Callable[[], str] | None,
    description: str,
    *,
    check: Callable[[Any], Any] | None = None,
    shown: str | None = None,
    in_file: bool = True,
    builder: bool = True,
) -> Any:
    rule: dict[str, Any] = {"shown": shown} if shown is not None else {}
    return _declare(
        "text",
        default,
        description,
        check=check,
        optional=default is None,
        **rule,
        in_file=in_file,
        builder=builder,
    )


def texts(
    description: str,
    *,
    item: str,
    check: Callable[[str], str] | None = None,
    in_file: bool = True,
    builder: bool = True,
) -> Any:
    """A list of strings (comma-separated or a JSON list in the environment)."""

    def each(values: list[str]) -> list[str]:
        return [check(value) for value in values] if check is not None else values

    return _declare(
        "texts", [], description, item=item, check=each, in_file=in_file, builder=builder
    )


def value(
    default: Any,
    description: str,
    *,
    shown: str | None = None,
    check: Callable[[Any], Any] | None = None,
) -> Any:
    """A Python object set through the builder only (a clock, the observers)."""
    rule: dict[str, Any] = {"shown": shown} if shown is not None else {}
    return _declare("object", default, description, in_file=False, check=check, **rule)


def _choice(name: str, choices: Iterable[str], hint: str = "") -> Callable[[Any], Any]:
    allowed = list(choices)

    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"{name} {value!r} is unknown; use one of {', '.join(allowed)}{hint}")
        return value

    return check


def _scheduler_name(value: str) -> str:
    if not is_valid_name(value, SCHEDULER_NAME_LENGTH):
        raise ValueError(
            f"must be 1 to {SCHEDULER_NAME_LENGTH} characters (the picked_by column; no NUL, "
            f"no lone surrogate), got {value!r}"
        )
    return value


def _observers(values: Any) -> Any:
    for item in values:
        if not isinstance(item, SchedulerObserver):
            raise ValueError(f"must be SchedulerObservers (ekbatan_fastapi.observer), got {item!r}")
    return values


def _log_handler(value: str) -> str:
    if value not in LOG_HANDLER_MODES:
        raise ValueError(
            f"is {value!r}; use auto (the server's log handlers when nothing else receives "
            "the library's records) or none (leave logging alone)"
        )
    return value


LIVENESS_LOCK_MODES = ("auto", "on", "off")


def _liveness_mode(value: Any) -> str:
    if value not in LIVENESS_LOCK_MODES:
        raise ConfigurationError(
            f"liveness_lock must be one of {', '.join(LIVENESS_LOCK_MODES)}, got {value!r} "
            "(auto: on wherever sessions are stable; off: dead executions wait for the dead "
            "window)"
        )
    return str(value)


@dataclass
class SchedulerConfig:
    """Every setting: the scheduler's, the builder's and the FastAPI integration's."""

    # -- the scheduler's loops ----------------------------------------------------------------
    polling_interval: timedelta = duration(
        "PT10S",
        "How often each instance looks for due tasks (it also wakes at every due time it knows, "
        "and on PostgreSQL at every notification).",
        # A poll tighter than 10 ms only burns CPU and database time; the poller also wakes
        # at every due time it knows, so a long interval delays only rows scheduled elsewhere
        # without a notification (MySQL/MariaDB): an hour at most.
        shortest="PT0.01S",
        longest="PT1H",
    )
    heartbeat_interval: timedelta = duration(
        "PT10S",
        "How often running executions heartbeat.",
        # Dead after heartbeat-interval x missed-heartbeats-limit: an hour's interval already
        # leaves a dead execution unrevived for six hours.
        shortest="PT0.01S",
        longest="PT1H",
    )
    missed_heartbeats_limit: int = integer(
        6,
        "An execution is dead after heartbeat-interval x this (60 s by default) and is revived "
        "elsewhere; at least 4.",
        least=MIN_MISSED_HEARTBEATS,
        why="fewer would declare executions dead after one slow heartbeat",
    )
    shutdown_max_wait: timedelta = duration(
        "PT30M",
        "Applied twice at shutdown: wait, cancel, wait again.",
        # No orchestrator waits a day for a process.
        shortest="PT0.001S",
        longest="P1D",
    )
    shutdown_results_wait: timedelta = duration(
        f"PT{DEFAULT_RESULTS_WAIT:g}S",
        "At shutdown, once the executions have ended: how long the database may take to record "
        "their results and history (and, before the executions' wait, to answer the poller's "
        "last claim). What is still unrecorded then is left: those rows stay picked and are "
        "revived after the dead window, like an abandoned execution. It keeps a stop with the "
        "database down within a pod's grace period (docs/deployment.md); never longer than "
        "shutdown-max-wait.",
        shortest="PT0.001S",
        longest="PT1H",
    )
    delete_unresolved_after: timedelta = duration(
        "P14D",
        "Rows of task names no registered job knows are deleted once this overdue.",
        shortest="PT1M",
        longest="P3650D",
    )
    claim_ahead: timedelta = duration(
        "PT0S",
        "Claim rows that come due within this lead and start each at its own time: when many "
        "come due together, the claims are made before the slot instead of after it (every "
        "dialect; PT0S: claim only due rows, as db-scheduler does). docs/schedules.md, "
        '"Claiming ahead".',
        # Rows claimed ahead are out of the other instances' reach.
        shortest="PT0S",
        longest=format_iso_duration(MAX_CLAIM_AHEAD),
        example="PT0.2S",
    )
    timeout_grace: timedelta | None = duration(
        None,
        "How long a timed-out async execution has to clean up after its cancellation before "
        "it is abandoned (none: one heartbeat interval).",
        shortest="PT0.001S",
        longest="P1D",
        example="PT10S",
    )
    app_version: str | None = text(
        None,
        "The application's version, written with the job definitions: during a rolling deploy "
        "an older version never changes what a newer one wrote.",
    )

    # -- the jobs pool --------------------------------------------------------------------------
    pooler: str = text(
        "none",
        "What sits between the scheduler and PostgreSQL: none (also right for PgBouncer's "
        "session mode), pgbouncer-session or pgbouncer-transaction: the pool then keeps no "
        "prepared statement past its statement and LISTEN is off (docs/deployment.md).",
        check=validate_pooler,
    )
    liveness_lock: str = text(
        "auto",
        "auto, on or off: hold a session lock named after this instance on a connection of its "
        "own, so that peers revive its executions as soon as it dies instead of after the dead "
        "window (docs/robustness.md); auto is off behind PgBouncer's transaction mode, on "
        "Galera and with pool_size=1.",
        check=_liveness_mode,
    )
    idle_transaction_timeout: timedelta | None = duration(
        f"PT{DEFAULT_IDLE_TRANSACTION_TIMEOUT:g}S",
        "MySQL/MariaDB: the jobs sessions' innodb_lock_wait_timeout and (MariaDB) "
        "idle_transaction_timeout, so that a transaction orphaned by a partition cannot stall "
        "the cluster; PT0S (or none) leaves the server's settings.",
        # Session bounds, in whole seconds there.
        shortest="PT0S",
        longest="P1D",
        optional=True,
    )

    # -- the builder's only ---------------------------------------------------------------------
    polling_strategy: PollingStrategy | str | None = text(
        None,
        "lock-and-fetch (FOR UPDATE SKIP LOCKED) or fetch (optimistic); none: lock-and-fetch "
        "where the dialect has SKIP LOCKED, fetch otherwise.",
        check=_choice("polling_strategy", PollingStrategy),
        in_file=False,
    )
    batch_size: int | None = integer(
        None,
        "Rows claimed per poll (none: max(50, 3 x number of jobs)).",
        least=1,
        most=10_000,
        in_file=False,
    )
    history: bool = flag(
        True,
        "Record every execution in ekbatan_execution_history (batched, off the hot path).",
        in_file=False,
    )
    record_missed_slots: bool = flag(
        True,
        "Record in the history every slot of a recurring job that passes without a run "
        "(merged by CatchUp.latest, skipped by the catch-up policy, due while a run was going; "
        "outcome missed, the reason in error_class; at most 100 named per completion plus a "
        "summary of the rest) and tell it to the observers' slot_missed. A job's "
        "record_missed_slots() overrides it.",
        in_file=False,
    )
    history_retention: timedelta = duration(
        "P7D",
        "How long history records are kept.",
        shortest="PT0.001S",
        longest=f"P{MAX_DURATION.days}D",
        in_file=False,
    )
    listen: bool = flag(
        True,
        "Where the database supports it (PostgreSQL LISTEN/NOTIFY), hold one pooled connection "
        "that wakes this instance when any instance schedules work.",
        in_file=False,
    )
    scheduler_name: str = text(
        default_scheduler_name,
        "This instance's name in picked_by (<host>-<pid> cut to 50 characters by default).",
        check=_scheduler_name,
        shown="<host>-<pid>",
        in_file=False,
    )
    statement_timeout: timedelta | None = duration(
        "PT30S",
        "How long one database statement may take (none: unbounded). A connection that died "
        "without a reset never answers; past this bound it is discarded and the statement "
        "retried on a new one, instead of the loop waiting forever.",
        shortest="PT0.001S",
        longest="P1D",
        optional=True,
        in_file=False,
    )
    table_name: str = text(
        DEFAULT_TABLE_NAME,
        "The tasks table (schema.table allowed).",
        check=validate_table_name,
        in_file=False,
    )
    dialect: str | Dialect | None = value(
        None,
        "Overrides the dialect read from the URL (e.g. mysql5 for MySQL before 8), by name or "
        "as a Dialect (ekbatan_fastapi.store.dialects).",
    )
    clock: Clock = value(
        SystemClock, "The scheduler's clock (tests: a ManualClock).", shown="SystemClock()"
    )
    observers: list[SchedulerObserver] = value(
        [],
        "Hooks called at the scheduler's events (metrics); see ekbatan_fastapi.observer. "
        "b.observer(hook) adds one.",
        check=_observers,
    )
    job_overrides: dict[str, JobOverride] = value(
        {},
        "Per job: a timeout or concurrency limit that wins over the job class's. "
        "b.job_override(name, timeout=..., max_concurrency=...) sets one.",
    )

    # -- read by the FastAPI integration ----------------------------------------------------
    modules: list[str] = texts(
        "Modules imported at startup so that their @distributed_job classes are found "
        "(comma-separated or a JSON list in the environment).",
        item="module names",
        builder=False,
    )
    metrics: bool = flag(
        False,
        "Collect Prometheus metrics (the [metrics] extra); metrics_router serves them.",
        builder=False,
    )
    opentelemetry: bool = flag(
        False,
        "Trace every execution with OpenTelemetry (the [otel] extra, docs/opentelemetry.md); "
        "off: opentelemetry is never imported by Ekbatan.",
        builder=False,
    )
    opentelemetry_statements: bool = flag(
        False,
        "Also a span per poll and completion statement (needs opentelemetry: true).",
        builder=False,
    )
    log_handler: str = text(
        "auto",
        "auto: when nothing receives the library's log records (no root handler, none on "
        "ekbatan_fastapi), hand them to uvicorn's or gunicorn's handlers, or stderr; none: "
        "leave logging alone (docs/logging.md).",
        check=_log_handler,
        builder=False,
    )
    admin_trusted_origins: list[str] = texts(
        "Origins besides the application's own whose pages may call the admin routes "
        "(https://ops.example.com): a dashboard served behind another host name (SECURITY.md; "
        "comma-separated or a JSON list in the environment).",
        item="origins",
        check=parse_origin,
        builder=False,
    )
    web_read_pool_size: int = integer(
        2,
        "Connections of the web reads' own pool (/jobs, its history, the dashboard): at most "
        "this many reports are built at once, never on the scheduler's connections.",
        least=1,
        most=20,
        builder=False,
    )
    web_report_cache: timedelta = duration(
        "PT1S",
        "How long one built report answers every request for the same page (PT0S: none; "
        "concurrent requests still share one read).",
        # Longer than a minute and a probe reads a stale picture.
        shortest="PT0S",
        longest="PT1M",
        builder=False,
    )

    @property
    def grace(self) -> timedelta:
        """The effective ``timeout_grace``."""
        return self.timeout_grace if self.timeout_grace is not None else self.heartbeat_interval

    @property
    def dead_after(self) -> timedelta:
        """A picked row whose heartbeat is older than this is revived elsewhere."""
        return dead_after(self.heartbeat_interval, self.missed_heartbeats_limit)

    def validate(self) -> None:
        """Every setting by its rule, then the dead window; a ConfigurationError naming the
        first setting that breaks its rule, its value and the fix."""
        for setting in settings_of():
            try:
                checked = setting.checked(getattr(self, setting.name))
            except ValueError as problem:
                raise setting.error(problem) from None
            setattr(self, setting.name, checked)
        try:
            window: timedelta | None = self.dead_after
        except OverflowError:
            window = None
        if window is None or window > MAX_DURATION:
            shown = "beyond any date" if window is None else format_iso_duration(window)
            raise ConfigurationError(
                f"the dead window (heartbeat_interval x missed_heartbeats_limit) is {shown}: at "
                f"most {MAX_DURATION.days} days (longer ones carry dates out of the calendar); "
                "use a shorter one"
            )


def _named(item: dataclasses.Field[Any]) -> Setting:
    kind, default, description, rule = item.metadata["setting"]
    return Setting(item.name, description, kind, default, **rule)


_SETTINGS = tuple(_named(item) for item in dataclasses.fields(SchedulerConfig))


def settings_of() -> tuple[Setting, ...]:
    """Every setting, in declaration order."""
    return _SETTINGS
