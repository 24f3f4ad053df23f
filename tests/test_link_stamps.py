"""``DatabaseLink``'s status times stay in order while its estimate of the database clock moves
(each answer sets a new offset)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ekbatan_fastapi.engine.observer import ObserverDispatch
from ekbatan_fastapi.engine.poller import DatabaseLink
from ekbatan_fastapi.testing import ManualClock


def test_a_recovery_right_after_an_error_is_not_dated_before_it() -> None:
    """An error stamped with an estimate 50 ms ahead, then an answer 5 ms later that brings
    the estimate back: ``ok`` since the error, not 45 ms before it (a loaded CI machine showed
    ``last_error_at`` after ``condition_since``)."""
    start = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    clock = ManualClock(start)
    link = DatabaseLink("node-a", clock, ObserverDispatch([], "node-a"))
    link.offset = timedelta(milliseconds=50)
    link.failed(OSError("the database is away"), "recording results")
    assert link.condition == "unreachable"
    clock.set(start + timedelta(milliseconds=5))
    link.observed(start + timedelta(milliseconds=5), sent=start + timedelta(milliseconds=5))
    assert link.condition == "ok"
    assert link.last_error_at is not None and link.condition_since is not None
    assert link.last_error_at <= link.condition_since
    clock.set(start + timedelta(seconds=1))  # later times follow the clock again
    link.report("unreachable", "a crashed loop")
    assert link.condition_since == start + timedelta(seconds=1)
