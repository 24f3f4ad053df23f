"""``SlotCounter``: the slots each recurring job missed, caught up and skipped, counted when the
result that decided them is recorded: added to ``ekbatan_jobs`` (cluster-wide totals for
``/jobs`` and the CLI), told to the observers (Prometheus counters), and, for skipped slots,
written to the history (outcome ``skipped``).

Every slot that passes without a run (``Execution.passed_spans``: merged by ``CatchUp.latest``,
skipped by a catch-up policy, passed over while a run was going) is also, where the job
records missed slots (``record_missed_slots``), written to the history by name (outcome
``missed``, ``error_class`` the reason) and told to ``slot_missed``: the newest
``MISSED_SLOTS_NAMED`` of one completion, the rest of each span as one summary record; and
counted in the task's streak of consecutive missed slots (``ekbatan_missed_streaks``, the
``missed_streak`` hook), which the next slot that runs ends."""

from __future__ import annotations

from datetime import datetime

from ..domain.catchup import MISSED_SLOTS_NAMED, PassedSlots
from ..domain.logs import library_logger
from ..domain.rows import ExecutionRecord, Finish, FinishKind, Outcome
from ..domain.schedule import Schedule
from ..domain.text import storable
from ..store.jobs import JobsStore, Streak
from .execution import Execution
from .history import HistoryRecorder
from .observer import ObserverDispatch

__all__ = ["SlotCounter", "missed_records"]

log = library_logger(__name__)

_MAX_PENDING = 10_000
"""Jobs with unwritten counts kept while the database refuses them (then they are dropped)."""
_MESSAGE_LIMIT = 2000


def _named(schedule: Schedule | None, span: PassedSlots, room: int) -> list[datetime]:
    """The newest ``room`` slots of ``span`` at most, newest first."""
    if room <= 0:
        return []
    slots = [span.last]
    if schedule is None:
        return slots if span.first == span.last else []
    while len(slots) < min(room, span.count) and slots[-1] > span.first:
        before = schedule.previous(slots[-1])
        if before is None or before < span.first:
            break
        slots.append(before)
    return slots


def missed_records(
    execution: Execution, spans: list[PassedSlots], cap: int = MISSED_SLOTS_NAMED
) -> tuple[list[ExecutionRecord], list[tuple[datetime, str]]]:
    """The history records of ``spans`` (the newest ``cap`` slots by name, the rest of each
    span as one summary record) and the named (slot, reason) pairs, oldest first."""
    at = execution.finished_at or execution.started
    schedule = execution.schedule
    records: list[ExecutionRecord] = []
    named: list[tuple[datetime, str]] = []
    room = cap
    for span in reversed(spans):
        slots = _named(schedule, span, room)
        room -= len(slots)
        rest = span.count - len(slots)
        if rest > 0:
            to = schedule.back(slots[-1], 1) if slots and schedule is not None else span.last
            count = f"at least {rest}" if span.capped else str(rest)
            text = (
                f"{count} slots {span.first.isoformat()} to {to.isoformat()} not run: "
                f"{span.why} (a completion names its newest {cap} missed slots; these are "
                "counted here)"
            )
            records.append(_record(execution, span.first, span.reason.value, text, at))
        for slot in slots:
            text = f"slot {slot.isoformat()} not run: {span.why}"
            records.append(_record(execution, slot, span.reason.value, text, at))
            named.append((slot, span.reason.value))
    records.sort(key=lambda r: r.execution_time)
    named.sort()
    return records, named


def _record(
    execution: Execution, slot: datetime, reason: str, text: str, at: datetime
) -> ExecutionRecord:
    row = execution.row
    return ExecutionRecord(
        row.task_name,
        row.task_instance,
        slot,
        row.picked_by,
        at,
        at,
        Outcome.MISSED.value,
        reason,
        storable(text, _MESSAGE_LIMIT),
    )


class SlotCounter:
    """Counts, buffered until the completer's next quiet moment (``flush``)."""

    def __init__(self, store: JobsStore, history: HistoryRecorder, observer: ObserverDispatch):
        self.store = store
        self.history = history
        self.observer = observer
        self.pending: dict[str, tuple[int, int, int]] = {}
        self.streaks: dict[tuple[str, str], Streak] = {}
        """Streaks of missed slots to write (``ekbatan_missed_streaks``)."""
        self.known: dict[tuple[str, str], tuple[int, datetime]] = {}
        """The streaks this instance last counted: (count, the row's due time after them)."""

    @property
    def waiting(self) -> bool:
        """Something to write (``flush``)."""
        return bool(self.pending or self.streaks)

    def count(self, execution: Execution, finish: Finish) -> None:
        """A recorded result (no I/O)."""
        if finish.kind not in (FinishKind.SUCCEEDED, FinishKind.FAILED, FinishKind.SKIPPED):
            return
        plan = execution.plan
        missed = execution.missed
        caught_up = int(plan is not None and plan.caught_up and plan.slot is not None)
        skipped = plan.skipped if plan is not None else 0
        # the rare cases behind cheap checks: a no-op slot's result makes no call here
        if skipped:
            record = execution.skip_record()
            if record is not None:
                self.history.add(record)
        if execution.dropped is not None:
            dropped = execution.dropped_record()
            if dropped is not None:
                self.history.add(dropped)
        if skipped or execution.passed:
            spans = execution.passed_spans()
            if spans:
                self._passed(execution, finish, spans)
        if not (missed or caught_up or skipped):
            return
        name = execution.row.task_name
        if "slots_counted" in self.observer.wants:
            self.observer.slots_counted(name, missed, caught_up, skipped)
        if name in self.pending or len(self.pending) < _MAX_PENDING:
            m, c, s = self.pending.get(name, (0, 0, 0))
            self.pending[name] = (m + missed, c + caught_up, s + skipped)

    def _passed(self, execution: Execution, finish: Finish, spans: list[PassedSlots]) -> None:
        """Slots passed without a run: named in the history and to the observers (where the
        job records them), counted in the task's streak."""
        row = execution.row
        if execution.record_missed:
            records, named = missed_records(execution, spans)
            if self.history.enabled:
                for record in records:
                    self.history.add(record)
            if "slot_missed" in self.observer.wants:
                for slot, reason in named:
                    self.observer.slot_missed(row.task_name, row.task_instance, slot, reason)
        next_time = finish.next_time
        if next_time is None or finish.kind is FinishKind.DELETED:
            return
        key = (row.task_name, row.task_instance)
        if execution.ran:  # the streak starts again after the slot that ran
            after: datetime | None = None
            count = sum(s.count for s in spans if s.first > execution.execution_time)
            total = count
        else:
            after = row.execution_time
            count = sum(s.count for s in spans)
            known = self.known.get(key)
            total = count + (known[0] if known is not None and known[1] == after else 0)
        if count == 0:
            return
        if key not in self.known and len(self.known) >= _MAX_PENDING:
            self.known.clear()  # schedules come and go: only the gauge's running total is lost
        self.known[key] = (total, next_time)
        if "missed_streak" in self.observer.wants:
            self.observer.missed_streak(row.task_name, row.task_instance, total)
        pending = self.streaks.get(key)
        if pending is not None and after is not None and pending[2] == after:
            self.streaks[key] = (pending[0], pending[1] + count, next_time)
        elif key in self.streaks or len(self.streaks) < _MAX_PENDING:
            self.streaks[key] = (after, count, next_time)

    async def flush(self) -> None:
        """Add the pending counts to ``ekbatan_jobs`` (kept for the next try on failure)."""
        if self.streaks:
            await self._flush_streaks()
        if not self.pending:
            return
        if not self.store.presence.present and not await self.store.look():
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

    async def _flush_streaks(self) -> None:
        presence = self.store.streak_presence
        if not presence.present and not await presence.look():
            self.streaks.clear()  # migration V0007 not applied
            return
        streaks, self.streaks = self.streaks, {}
        try:
            await self.store.add_streaks(streaks)
        except Exception as error:  # a streak is a gauge: the next one replaces it
            log.debug("could not write the streaks of missed slots: %s", error)
