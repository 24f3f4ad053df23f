"""Slot-lag analysis shared by ``slot_lag.py`` (ours) and the peers' runs (stdlib only).

A record is one execution: ``{"key": <job/schedule id>, "slot": <intended time, epoch s>,
"start": <start of the function, epoch s>, "pid": <process>}``. Every system's slots lie on a
grid of ``period`` seconds per key (a fixed rate from its first slot, or whole seconds for a
cron ``* * * * * *``); the grid's phase is read off the records.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["LagResult", "analyze", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclasses.dataclass
class LagResult:
    slots_expected: int
    """Grid slots inside the window, over every key."""
    executions: int
    """Executions of slots inside the window (duplicates included)."""
    distinct_slots: int
    duplicates: int
    skipped: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None
    min_ms: float | None
    keys: int
    per_process: dict[str, int]
    window_s: float
    lags_ms: list[float] = dataclasses.field(default_factory=list, repr=False)

    def as_dict(self, with_lags: bool = False) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not with_lags:
            data.pop("lags_ms")
        return data


def _phase(slots: Iterable[float], period: float) -> float:
    """The grid's offset in [0, period): the median of each slot's remainder (robust to a
    stray slot off the grid)."""
    remainders = [s % period for s in slots]
    # remainders near 0 and near period are the same phase: unwrap around the first one
    ref = remainders[0]
    unwrapped = [
        r if abs(r - ref) <= period / 2 else r - math.copysign(period, r - ref) for r in remainders
    ]
    return statistics.median(unwrapped) % period


def analyze(
    records: Sequence[dict[str, Any]],
    period: float,
    window: tuple[float, float],
    keys: Sequence[str] | None = None,
) -> LagResult:
    """Lag, duplicates and skipped slots of the slots whose intended time is in ``window``.

    ``keys``: every job expected to run (a job that never ran counts all its slots as skipped);
    default: the keys seen in ``records``.
    """
    start, end = window
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("slot") is not None:
            by_key[str(record["key"])].append(record)
    all_keys = list(keys) if keys is not None else sorted(by_key)
    lags: list[float] = []
    expected = executions = distinct = duplicates = 0
    per_process: Counter[str] = Counter()
    for key in all_keys:
        runs = by_key.get(key, [])
        phase = _phase([r["slot"] for r in runs], period) if runs else 0.0
        first = math.ceil((start - phase) / period - 1e-9)
        last = math.floor((end - phase) / period + 1e-9)
        grid = set(range(first, last + 1))
        expected += len(grid)
        counts: Counter[int] = Counter()
        for run in runs:
            index = round((run["slot"] - phase) / period)
            if index not in grid:
                continue
            counts[index] += 1
            executions += 1
            lags.append((run["start"] - run["slot"]) * 1000.0)
            per_process[str(run.get("pid", "?"))] += 1
        distinct += len(counts)
        duplicates += sum(c - 1 for c in counts.values())
    return LagResult(
        slots_expected=expected,
        executions=executions,
        distinct_slots=distinct,
        duplicates=duplicates,
        skipped=expected - distinct,
        p50_ms=percentile(lags, 50),
        p99_ms=percentile(lags, 99),
        max_ms=max(lags) if lags else None,
        mean_ms=statistics.fmean(lags) if lags else None,
        min_ms=min(lags) if lags else None,
        keys=len(all_keys),
        per_process=dict(per_process),
        window_s=end - start,
        lags_ms=lags,
    )
