"""Why a change to one task instance was not made: not scheduled (with a hint where the
caller named a one-time job's instance as ``recurring``), running, or changed meanwhile."""

from __future__ import annotations

from collections.abc import Mapping

from ..domain.errors import TaskNotFoundError, TaskPickedError
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job
from ..store.tasks import TaskStore

__all__ = ["explain_failure"]

_SHOWN = 3
"""Instances named as examples in the hint."""


async def explain_failure(
    tasks: TaskStore, jobs: Mapping[str, Job], job_name: str, instance_id: str, verb: str
) -> None:
    """Raise the error that says why ``job_name/instance_id`` was not ``verb``."""
    row = await tasks.get(job_name, instance_id)
    where = f"{job_name}/{instance_id}"
    if row is None:
        hint = await _instance_hint(tasks, jobs, job_name, instance_id)
        raise TaskNotFoundError(f"no task instance {where} is scheduled{hint}")
    if row.picked:
        raise TaskPickedError(
            f"{where} is running right now on {row.picked_by}; it cannot be {verb} until "
            "it finishes"
        )
    raise TaskPickedError(f"{where} changed concurrently and was not {verb}; try again")


async def _instance_hint(
    tasks: TaskStore, jobs: Mapping[str, Job], job_name: str, instance_id: str
) -> str:
    if instance_id != RECURRING_INSTANCE or isinstance(jobs.get(job_name), DistributedJob):
        return ""
    rows = await tasks.list_tasks(job_name, limit=_SHOWN + 1)
    if job_name not in jobs and not rows:
        return ""
    shown = ", ".join(repr(r.task_instance) for r in rows[:_SHOWN])
    more = ", ..." if len(rows) > _SHOWN else ""
    scheduled = f" (scheduled now: {shown}{more})" if rows else ""
    return (
        f": {job_name} is a one-time job whose instances have ids of their own{scheduled}; "
        "name one: ?instance=<id> over HTTP, --instance <id> in the CLI, instance_id in Python"
    )
