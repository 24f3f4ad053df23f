"""Exceptions a user can cause or meet; each message names the offending value and the fix."""

from __future__ import annotations


class EkbatanError(Exception):
    """Base class of every error raised by ekbatan-fastapi."""


class ScheduleError(EkbatanError, ValueError):
    """A schedule, cron expression, time zone or duration could not be understood."""


class ConfigurationError(EkbatanError, ValueError):
    """The registry, a job or a setting is configured wrongly (raised at build/startup)."""


class SchemaMissingError(EkbatanError):
    """The ``scheduled_tasks`` table (or one of ours) does not exist in the database."""


class TaskNotFoundError(EkbatanError, LookupError):
    """No row exists for the given task name and instance."""


class TaskPickedError(EkbatanError):
    """The task instance is running right now, so it cannot be changed or cancelled."""


class UnknownJobError(EkbatanError, LookupError):
    """A task name that no registered job answers to."""


class TaskPausedError(EkbatanError):
    """The task is paused cluster-wide; the action needs ``force=True`` or a resume first."""


class DatabaseUnavailable(EkbatanError, ConnectionError):
    """The jobs database cannot be reached: a wrong host, a refused or lost connection, or no
    answer in time (``DatabaseTimeout``). The message names where (``backend://host:port/db``,
    never the password); the driver's error is the ``__cause__``. The scheduler's loops retry
    by themselves; a call of the client raises it."""


class DatabaseLoginRefused(DatabaseUnavailable):
    """The database server answered but refused the configured user's login (a wrong
    password, an unknown user, a host its access rules do not admit) or has no database of
    the URL's name. The message names where and the fix, never the user's name. The
    scheduler's loops retry (a database created meanwhile is used); a call of the client
    raises it."""


class DatabaseTimeout(DatabaseUnavailable, TimeoutError):
    """A statement got no answer within ``statement_timeout``; its connection was discarded
    (it may have died without a reset). The scheduler's loops retry on a new connection."""


class RunNotClaimedError(EkbatanError, TimeoutError):
    """A forced run of a paused task was not claimed by any instance in time."""


class ExecutionSuperseded(EkbatanError):
    """The execution lost its slot: the row was revived (and maybe run and completed) by
    another instance meanwhile, so this execution's ``ctx.transaction()`` was rolled back and
    nothing of it committed. Raised from the block; the history records it as superseded."""


class JobTimedOut(EkbatanError, TimeoutError):
    """An execution ran longer than its job's ``timeout()`` (recorded as its error; the
    history outcome is ``timed_out``)."""


class ExecutionCancelled(EkbatanError):
    """A running execution was stopped on request (``client.cancel_running``, the admin route,
    ``ekbatan-jobs cancel``): the history outcome is ``cancelled``, its message says
    who asked and why. A recurring job goes on with its next slot; a one-time task is removed."""


class NotRunningError(TaskNotFoundError):
    """``cancel_running`` named a task instance that is not running right now."""
