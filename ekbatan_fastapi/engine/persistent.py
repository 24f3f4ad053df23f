"""A ``PersistentScheduleJob``'s row in the engine: read its schedule when it is claimed (an
unreadable one is parked), and count each run into the row when it ends, taking a schedule
changed meanwhile (``update_schedule``) for the next slot."""

from __future__ import annotations

from ..domain.catchup import CatchUp
from ..domain.logs import library_logger
from ..domain.persistent import ScheduleRowInvalid, ScheduleSpec, parse_spec
from ..store.external import Caller
from ..store.schedules import ScheduleRows
from .execution import Execution
from .logs import log_extra

__all__ = ["count_run", "read_schedule_row"]

log = library_logger(__name__)

_ATTEMPTS = 5
"""Times a run is counted against a row that keeps changing (then its claimed schedule is kept)."""


def _read(execution: Execution, raw: bytes | None) -> ScheduleSpec | None:
    row = execution.row
    try:
        spec = parse_spec(raw, where=execution.label)
        schedule = spec.parsed(row.task_name, row.task_instance)
    except ScheduleRowInvalid as error:
        execution.unfit = error
        return None
    except Exception as error:  # a schedule that parses but cannot bind: parked the same way
        execution.unfit = ScheduleRowInvalid(
            f"the stored schedule row {execution.label} cannot be used: {error}",
            [{"loc": ("schedule",), "msg": str(error), "type": "schedule_row"}],
        )
        return None
    execution.persistent = spec
    execution.schedule = schedule
    return spec


def read_schedule_row(execution: Execution) -> None:
    """Take the claimed row's schedule, data and bounds (an unreadable row: ``unfit``, so
    that it is parked with the reason, and ``execute`` is not called)."""
    _read(execution, execution.row.task_data)


async def count_run(rows: ScheduleRows, execution: Execution, caller: Caller | None = None) -> None:
    """Count the run into the row (``runs + 1``), unless the row changed since it was claimed:
    then read it again, and decide the next slot by its new schedule. A row deleted or revived
    meanwhile is left alone (the result then matches no row, and nothing is written).
    ``caller``: counted inside its transaction (``ctx.transaction()``, which commits the
    count with the completion); its errors propagate (the transaction rolls back)."""
    spec = execution.persistent
    assert spec is not None
    old = execution.row.task_data
    owned = execution.owned
    for _ in range(_ATTEMPTS):
        counted = spec.counted(slot=execution.retry_of is None, at=execution.execution_time)
        try:
            if await rows.count_run(owned, old, counted.encode(where=execution.label), caller):
                execution.persistent = counted
                return
            row = await rows.tasks.get(owned.task_name, owned.task_instance)
        except Exception as error:
            if caller is not None:
                raise
            log.warning(
                "could not count the run of %s into its row (%s); its next slot comes from "
                "the schedule it was claimed with",
                execution.label,
                error,
                extra=log_extra(execution.row, execution.row.picked_by or ""),
            )
            return
        if row is None or row.version != owned.version or not row.picked:
            return  # deleted, or revived elsewhere: our result will match nothing
        changed = _read(execution, row.task_data)
        if changed is None:
            return  # edited into something unreadable: parked below, with the reason
        if execution.catch_up is None:
            execution.catch_up = CatchUp.latest()
        spec, old = changed, row.task_data
    log.warning(
        "the row of %s kept changing while its run was counted; its next slot comes from the "
        "schedule it was last read with",
        execution.label,
        extra=log_extra(execution.row, execution.row.picked_by or ""),
    )
