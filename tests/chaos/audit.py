"""The chaos harness's audit: reads every process's ledger and the fault timetable, and tells
per run which slots were expected, executed, executed twice (and why), lost, and how long the
cluster took to recover from each fault.

Definitions (slots are identified by task, instance and ``execution_time``):

* **expected**: a recurring job's slots are its first slot and every next slot a recorded
  completion scheduled; a one-time instance is expected when the harness scheduled it.
  Slots due later than ``horizon`` (the end of the workload minus a grace period) are
  ignored: the run ended before they could run.
* **executed**: the slot started at least once; **completed**: a completion of it was
  recorded (the version-guarded write succeeded).
* **lost**: expected but never completed.
* **executed twice**: a slot that started more than once. Each extra start is explained by
  the previous execution's fate: *revived after <fault>* (a peer revived the row after a fault
  hit its owner), *released at shutdown* (cancelled in phase 2 of a graceful stop), or not:
  *revived without a fault* (a false dead detection) and *unexplained* are failures.
* **coalesced**: fixed-rate slots skipped by design because the previous one completed after
  they were due (db-scheduler coalesces missed slots into one run).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.chaos.cluster import Fault, Probe

__all__ = ["Audit", "AuditInput", "Execution", "FaultRecovery", "audit", "load_ledger"]

RECURRING_PREFIX = "chaos-r"
_EXPLAINED = ("revived after", "released at shutdown")


@dataclasses.dataclass
class Execution:
    task: str
    inst: str
    slot: int
    ver: int
    by: str
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None
    detail: str | None = None
    finish: str | None = None
    """``recorded`` or ``rejected`` (its completion write), None when it never got that far."""
    kind: str | None = None
    next: int | None = None
    finishes: list[str] = dataclasses.field(default_factory=list)
    """The ledger observer's records of this execution's completion writes, in order."""

    @property
    def slot_key(self) -> tuple[str, str, int]:
        return (self.task, self.inst, self.slot)

    @property
    def slot_seconds(self) -> float:
        return self.slot / 1e6


@dataclasses.dataclass
class AuditInput:
    records: list[dict[str, Any]]
    faults: list[Fault]
    probes: list[Probe]
    begin: float
    end: float
    """The end of the workload; slots due after ``end - grace`` are not expected."""
    grace: float
    periods: dict[str, float]
    """Each recurring job's period in seconds."""
    one_time: dict[tuple[str, str], float]
    """Every one-time instance the harness scheduled, with its due time."""
    exits: dict[int, float]
    """pid -> when the process was seen to exit."""
    remaining: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """The (task, instance) rows left in ``scheduled_tasks`` after the run."""
    logs: Sequence[Path] = ()


@dataclasses.dataclass
class Duplicate:
    slot_key: tuple[str, str, int]
    runs: list[Execution]
    reasons: list[str]
    overlap: float
    """Seconds during which two executions of the slot were alive at once (wall clock)."""

    @property
    def explained(self) -> bool:
        return all(reason.startswith(_EXPLAINED) for reason in self.reasons)


@dataclasses.dataclass
class FaultRecovery:
    fault: Fault
    orphans: int = 0
    """Executions the fault interrupted that ran again elsewhere."""
    rerun_after: list[float] = dataclasses.field(default_factory=list)
    """Seconds from the fault's start to each orphan's rerun."""
    resumed_first: float | None = None
    resumed_all: float | None = None
    """Seconds from the database's return to the first / to every process's next execution."""
    jobs_during: list[str] = dataclasses.field(default_factory=list)
    """``/jobs`` answers seen during the fault (status codes, or the transport error)."""
    jobs_200_after: float | None = None
    """Seconds from the fault's end until every app answered ``/jobs`` with 200."""


@dataclasses.dataclass
class Audit:
    recurring_expected: int = 0
    recurring_executed: int = 0
    recurring_lost: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)
    coalesced: int = 0
    one_time_expected: int = 0
    one_time_executed: int = 0
    one_time_lost: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    executions: int = 0
    off_grid: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)
    """Recurring slots that are not on their fixed-rate grid (never expected)."""
    unseen_completions: int = 0
    """Completions that reached the database although their process never saw the answer."""
    duplicates: list[Duplicate] = dataclasses.field(default_factory=list)
    completed_twice: int = 0
    recorded_twice: int = 0
    stale_rejected: int = 0
    revivals: int = 0
    early_starts: int = 0
    lag_p50: float | None = None
    lag_p99: float | None = None
    lag_max: float | None = None
    recoveries: list[FaultRecovery] = dataclasses.field(default_factory=list)
    errors_logged: int = 0
    error_kinds: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def lost(self) -> int:
        return len(self.recurring_lost) + len(self.one_time_lost)

    @property
    def unexplained(self) -> list[Duplicate]:
        return [d for d in self.duplicates if not d.explained]

    def reasons(self) -> collections.Counter[str]:
        return collections.Counter(r for d in self.duplicates for r in d.reasons)


def load_ledger(directory: Path) -> list[dict[str, Any]]:
    """Every record of every process, in time order (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob("ledger-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    records.sort(key=lambda r: r["t"])
    return records


def _executions(records: Iterable[dict[str, Any]]) -> list[Execution]:
    runs: dict[tuple[str, str, int, int, int], Execution] = {}
    finishes: dict[tuple[str, str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        if r["e"] == "start":
            key = (r["task"], r["inst"], r["slot"], r["ver"], r["pid"])
            runs[key] = Execution(
                r["task"], r["inst"], r["slot"], r["ver"], r["by"], r["pid"], r["t"]
            )
        elif r["e"] == "end":
            run = runs.get((r["task"], r["inst"], r["slot"], r["ver"], r["pid"]))
            if run is not None:
                run.end, run.outcome, run.detail = r["t"], r["outcome"], r.get("detail")
        elif r["e"] in ("recorded", "rejected", "finish-error"):
            finishes[(r["task"], r["inst"], r["ver"])].append(r)
    for run in runs.values():
        events = finishes.get((run.task, run.inst, run.ver), [])
        if events:
            run.kind, run.next = events[-1]["kind"], events[-1]["next"]
            run.finishes = [e["e"] for e in events]
    return sorted(runs.values(), key=lambda run: run.start)


def _resolve_finishes(
    runs: Sequence[Execution],
    revivals: dict[Any, dict[str, Any]],
    remaining: set[tuple[str, str]],
) -> int:
    """Decide whether each execution's result was recorded; how many were recorded although
    their process never saw the answer.

    The ledger's observer sees an answer. When the connection broke during the statement (the
    completer retries, and the retry is rejected) or the process was killed right after it,
    the database decides: a one-time instance no longer in the table was deleted by its
    completion; a recurring row claimed again at a later slot with version + 2 was moved there
    by it (a revival would have kept the slot). A rejected retry is our own write unless the
    row was revived meanwhile (only a revival or our write could have changed its version).
    """
    slots = collections.Counter(run.slot_key for run in runs)
    claims = {(run.task, run.ver): run for run in runs}
    unseen = 0
    for run in runs:
        if "recorded" in run.finishes:
            run.finish = "recorded"
            continue
        rerun = slots[run.slot_key] > 1
        revived = (run.task, run.inst, run.slot, run.ver) in revivals
        if "rejected" in run.finishes and ("finish-error" not in run.finishes or revived or rerun):
            run.finish = "rejected"
            continue
        if run.outcome != "ok" or revived or rerun:
            continue
        if run.task.startswith(RECURRING_PREFIX):
            following = claims.get((run.task, run.ver + 2))
            if following is not None and following.slot > run.slot:
                run.finish, run.kind, run.next = "recorded", "succeeded", following.slot
                unseen += 1
        elif (run.task, run.inst) not in remaining:
            run.finish, run.kind = "recorded", "deleted"
            unseen += 1
    return unseen


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _fault_hit(fault: Fault, pid: int, began: float, until: float) -> bool:
    """``fault`` affected process ``pid`` at some time between ``began`` and ``until``."""
    if not (fault.everyone or pid in fault.pids) or fault.kind in ("lock", "skew", "http-load"):
        return False
    ended = fault.ended if fault.ended is not None else float("inf")
    return fault.began <= until and ended >= began


def _explain(
    previous: Execution,
    later: Execution,
    revivals: dict[Any, dict[str, Any]],
    faults: Sequence[Fault],
) -> str:
    revival = revivals.get((previous.task, previous.inst, previous.slot, previous.ver))
    if revival is not None:
        # from the claim (its heartbeat, in the revival record): a blocked loop may even start
        # the execution only after its revival
        claimed = min(previous.start, revival["hb"] or previous.start)
        hits = [f for f in faults if _fault_hit(f, previous.pid, claimed, revival["t"])]
        if hits:
            return f"revived after {hits[-1].kind}"
        return "revived without a fault"
    if previous.outcome == "cancelled" and previous.kind == "released":
        return "released at shutdown"
    return "unexplained"


def _death(run: Execution, exits: dict[int, float]) -> float | None:
    return run.end if run.end is not None else exits.get(run.pid)


def _duplicates(
    runs: Sequence[Execution],
    revivals: dict[Any, dict[str, Any]],
    faults: Sequence[Fault],
    exits: dict[int, float],
) -> list[Duplicate]:
    by_slot: dict[tuple[str, str, int], list[Execution]] = collections.defaultdict(list)
    for run in runs:
        by_slot[run.slot_key].append(run)
    found = []
    for key, group in by_slot.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda run: run.ver)
        reasons = [_explain(a, b, revivals, faults) for a, b in itertools.pairwise(group)]
        overlap = 0.0
        for a, b in itertools.pairwise(group):
            a_end, b_end = _death(a, exits), _death(b, exits)
            if a_end is not None and b_end is not None:
                overlap += max(0.0, min(a_end, b_end) - max(a.start, b.start))
        found.append(Duplicate(key, group, reasons, overlap))
    return found


def _recoveries(
    data: AuditInput, runs: Sequence[Execution], faults: Sequence[Fault]
) -> list[FaultRecovery]:
    by_slot: dict[tuple[str, str, int], list[Execution]] = collections.defaultdict(list)
    for run in runs:
        by_slot[run.slot_key].append(run)
    result = []
    for fault in faults:
        if fault.kind in ("lock", "skew", "http-load"):
            continue
        recovery = FaultRecovery(fault)
        ended = fault.ended if fault.ended is not None else fault.began
        for run in runs:
            if not (fault.everyone or run.pid in fault.pids):
                continue
            death = _death(run, data.exits)
            if run.start > ended or (death is not None and death < fault.began):
                continue
            reruns = [r for r in by_slot[run.slot_key] if r.ver > run.ver and r.start > fault.began]
            if reruns:
                recovery.orphans += 1
                recovery.rerun_after.append(min(r.start for r in reruns) - fault.began)
        if fault.everyone and fault.ended is not None:
            firsts: dict[int, float] = {}
            for run in runs:
                if run.start > fault.ended and run.pid not in firsts:
                    firsts[run.pid] = run.start - fault.ended
            alive = {r.pid for r in runs if r.start > fault.ended}
            if firsts:
                recovery.resumed_first = min(firsts.values())
                recovery.resumed_all = max(firsts[p] for p in alive)
        _probe_summary(recovery, data.probes)
        result.append(recovery)
    return result


def _probe_summary(recovery: FaultRecovery, probes: Sequence[Probe]) -> None:
    fault = recovery.fault
    if fault.ended is None:
        return
    # answered during the fault: sent after it began, answered (or given up) before it ended
    during = [p for p in probes if fault.began + 0.3 <= p.t and p.t + p.seconds < fault.ended]
    # a 200 whose rows were read before the fault began is the read budget's cache, not a
    # claim that the database answers: shown as "cached"
    recovery.jobs_during = sorted({p.shown(fault.began) for p in during})
    labels = {p.label for p in probes if p.t > fault.ended}
    times = []
    for label in labels:
        ok = [p.t for p in probes if p.label == label and p.t > fault.ended and p.status == 200]
        if not ok:
            return
        times.append(min(ok) - fault.ended)
    recovery.jobs_200_after = max(times) if times else None


_LEVEL = re.compile(r"\b(ERROR|CRITICAL)\b|^Traceback")


def _errors(logs: Sequence[Path]) -> tuple[int, list[tuple[int, str]]]:
    kinds: collections.Counter[str] = collections.Counter()
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if not _LEVEL.search(line):
                continue
            message = line.split(": ", 1)[-1] if ": " in line else line
            message = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "N", message)
            kinds[message[:110]] += 1
    return sum(kinds.values()), [(n, text) for text, n in kinds.most_common(6)]


def audit(data: AuditInput) -> Audit:
    runs = _executions(data.records)
    faults = data.faults
    revivals = {
        (r["task"], r["inst"], r["slot"], r["ver"]): r for r in data.records if r["e"] == "revive"
    }
    horizon = data.end - data.grace
    result = Audit(executions=len(runs), revivals=len(revivals))
    result.unseen_completions = _resolve_finishes(runs, revivals, data.remaining)
    result.outcomes = dict(collections.Counter(run.outcome or "no end" for run in runs))

    completed = {
        run.slot_key for run in runs if run.finish == "recorded" and run.kind != "released"
    }
    started = {run.slot_key for run in runs}
    # recurring: every slot a row was claimed at, and every next slot a completion recorded
    scheduled: dict[str, set[int]] = collections.defaultdict(set)
    for run in runs:
        if not run.task.startswith(RECURRING_PREFIX):
            continue
        scheduled[run.task].add(run.slot)
        if run.finish == "recorded" and run.next is not None:
            scheduled[run.task].add(run.next)
    for task, slots in scheduled.items():
        expected = {s for s in slots if s / 1e6 <= horizon}
        result.recurring_expected += len(expected)
        result.recurring_executed += sum((task, "recurring", s) in started for s in expected)
        result.recurring_lost += [
            (task, "recurring", s)
            for s in sorted(expected)
            if (task, "recurring", s) not in completed
        ]
        ordered = sorted(slots)
        period = data.periods.get(task)
        if period:
            step = round(period * 1e6)
            for a, b in itertools.pairwise(ordered):
                result.coalesced += max(0, (b - a) // step - 1)
            result.off_grid += [(task, "recurring", s) for s in ordered if (s - ordered[0]) % step]
    # one-time instances: each must have been deleted by a recorded completion
    deleted = {
        (run.task, run.inst) for run in runs if run.finish == "recorded" and run.kind == "deleted"
    }
    ran = {(run.task, run.inst) for run in runs}
    expected_once = {key for key, due in data.one_time.items() if due <= horizon}
    result.one_time_expected = len(expected_once)
    result.one_time_executed = len(expected_once & ran)
    result.one_time_lost = sorted(expected_once - deleted)

    result.duplicates = _duplicates(runs, revivals, faults, data.exits)
    ok_by_slot = collections.Counter(run.slot_key for run in runs if run.outcome == "ok")
    result.completed_twice = sum(1 for n in ok_by_slot.values() if n > 1)
    recorded_by_slot = collections.Counter(
        run.slot_key for run in runs if run.finish == "recorded" and run.kind != "released"
    )
    result.recorded_twice = sum(1 for n in recorded_by_slot.values() if n > 1)
    result.stale_rejected = sum(1 for run in runs if run.finish == "rejected")
    result.early_starts = sum(1 for run in runs if run.start < run.slot_seconds - 0.001)
    first_start: dict[tuple[str, str, int], float] = {}
    for run in runs:
        if run.task.startswith(RECURRING_PREFIX):
            first_start.setdefault(run.slot_key, run.start - run.slot_seconds)
    lags = list(first_start.values())
    result.lag_p50 = statistics.median(lags) if lags else None
    result.lag_p99 = _percentile(lags, 0.99)
    result.lag_max = max(lags) if lags else None
    result.recoveries = _recoveries(data, runs, faults)
    result.errors_logged, result.error_kinds = _errors(data.logs)
    return result
