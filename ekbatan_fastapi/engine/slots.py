"""``SlotCounter``: the slots each recurring job missed, caught up and skipped, counted when the
result that decided them is recorded: added to ``ekbatan_jobs`` (cluster-wide totals for
``/jobs`` and the CLI), told to the observers (Prometheus counters), and, for skipped slots,
written to the history (outcome ``skipped``)."""

from __future__ import annotations

from ..domain.logs import library_logger
from ..domain.rows import Finish, FinishKind
from ..store.jobs import JobsStore
from .execution import Execution
from .history import HistoryRecorder
from .observer import ObserverDispatch

__all__ = ["SlotCounter"]

log = library_logger(__name__)

_MAX_PENDING = 10_000
"""Jobs with unwritten counts kept while the database refuses them (then they are dropped)."""


class SlotCounter:
    """Counts, buffered until the completer's next quiet moment (``flush``)."""

    def __init__(self, store: JobsStore, history: HistoryRecorder, observer: ObserverDispatch):
        self.store = store
        self.history = history
        self.observer = observer
        self.pending: dict[str, tuple[int, int, int]] = {}

    def count(self, execution: Execution, finish: Finish) -> None:
        """A recorded result (no I/O)."""
        if finish.kind not in (FinishKind.SUCCEEDED, FinishKind.FAILED, FinishKind.SKIPPED):
            return
        plan = execution.plan
        missed = execution.missed
        caught_up = int(plan is not None and plan.caught_up and plan.slot is not None)
        skipped = plan.skipped if plan is not None else 0
        record = execution.skip_record()
        if record is not None:
            self.history.add(record)
        if not (missed or caught_up or skipped):
            return
        name = execution.row.task_name
        if self.observer.active:
            self.observer.slots_counted(name, missed, caught_up, skipped)
        if name in self.pending or len(self.pending) < _MAX_PENDING:
            m, c, s = self.pending.get(name, (0, 0, 0))
            self.pending[name] = (m + missed, c + caught_up, s + skipped)

    async def flush(self) -> None:
        """Add the pending counts to ``ekbatan_jobs`` (kept for the next try on failure)."""
        if not self.pending:
            return
        if not self.store.present and not await self.store.look():
            self.pending.clear()  # no table to count in (migration V0003 not applied)
            return
        pending, self.pending = self.pending, {}
        try:
            await self.store.add_counts(pending)
        except Exception as error:
            log.debug("could not add the slot counts to the job definitions: %s", error)
            for name, (m, c, s) in pending.items():
                m2, c2, s2 = self.pending.get(name, (0, 0, 0))
                self.pending[name] = (m + m2, c + c2, s + s2)
