"""HeartbeatState follows db-scheduler's definitions (time passed in through a fake clock)."""

from __future__ import annotations

from datetime import timedelta

from ekbatan_fastapi import HeartbeatState


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(ticks: Ticks) -> HeartbeatState:
    return HeartbeatState(
        heartbeat_interval=timedelta(seconds=10),
        dead_after=timedelta(seconds=60),
        monotonic=ticks,
        last_success=ticks(),
    )


def test_fresh_state_is_healthy() -> None:
    state = make(Ticks())
    assert state.fraction_dead == 0.0
    assert not state.has_stale_heartbeat and state.failed_heartbeats == 0


def test_fraction_dead_rises_to_one_at_the_dead_window() -> None:
    ticks = Ticks()
    state = make(ticks)
    ticks.now += 30
    assert state.fraction_dead == 0.5
    ticks.now += 30
    assert state.fraction_dead == 1.0


def test_stale_after_interval_plus_a_quarter_or_on_any_failure() -> None:
    ticks = Ticks()
    state = make(ticks)
    ticks.now += 12.5
    assert not state.has_stale_heartbeat
    ticks.now += 0.1
    assert state.has_stale_heartbeat
    state.record_success()
    assert not state.has_stale_heartbeat and state.fraction_dead == 0.0
    state.record_failure()
    state.record_failure()
    assert state.has_stale_heartbeat and state.failed_heartbeats == 2
    state.record_success()
    assert state.failed_heartbeats == 0
