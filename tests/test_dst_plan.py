"""The DST fire plan in docs/schedules.md: generated from the library's schedules, current,
and the cases it shows held here too."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, date, datetime
from pathlib import Path
from types import ModuleType
from zoneinfo import ZoneInfo

import pytest

from ekbatan_fastapi import Schedules

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _plan() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dst_plan", DOCS / "dst_plan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dst_plan"] = module
    spec.loader.exec_module(module)
    return module


def test_the_published_plan_is_current() -> None:
    assert _plan().main(["--check"]) == 0, "run python docs/dst_plan.py"


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("zone", "day", "spec", "fires"),
    [
        # spring forward, 02:00-03:00 does not exist: 02:30 runs at 03:00
        ("Europe/Berlin", date(2026, 3, 29), "DAILY|02:30", [_utc(2026, 3, 29, 1, 0)]),
        (
            "Europe/Berlin",
            date(2027, 3, 28),
            "CRON|30 1-3 * * *",
            [
                _utc(2027, 3, 28, 0, 30),
                _utc(2027, 3, 28, 1, 0),
                _utc(2027, 3, 28, 1, 30),
            ],
        ),
        # fall back, 02:00-03:00 twice: 02:30 once, the first time (CEST)
        ("Europe/Berlin", date(2026, 10, 25), "DAILY|02:30", [_utc(2026, 10, 25, 0, 30)]),
        ("America/New_York", date(2026, 3, 8), "DAILY|02:30", [_utc(2026, 3, 8, 7, 0)]),
        # fall back, 01:00-02:00 twice: 01:30 once (EDT); 02:30 an ordinary time
        (
            "America/New_York",
            date(2026, 11, 1),
            "CRON|30 1-3 * * *",
            [
                _utc(2026, 11, 1, 5, 30),
                _utc(2026, 11, 1, 7, 30),
                _utc(2026, 11, 1, 8, 30),
            ],
        ),
        # Lord Howe's 30-minute shifts: 01:30-02:00 twice in April, 02:00-02:30 skipped in October
        (
            "Australia/Lord_Howe",
            date(2026, 4, 5),
            "CRON|30 1-3 * * *",
            [
                _utc(2026, 4, 4, 14, 30),
                _utc(2026, 4, 4, 16, 0),
                _utc(2026, 4, 4, 17, 0),
            ],
        ),
        ("Australia/Lord_Howe", date(2026, 10, 4), "DAILY|02:30", [_utc(2026, 10, 3, 15, 30)]),
        (
            "Australia/Lord_Howe",
            date(2027, 10, 3),
            "CRON|30 1-3 * * *",
            [
                _utc(2027, 10, 2, 15, 0),
                _utc(2027, 10, 2, 15, 30),
                _utc(2027, 10, 2, 16, 30),
            ],
        ),
    ],
)
def test_fires_across_transitions(zone: str, day: date, spec: str, fires: list[datetime]) -> None:
    plan = _plan()
    schedule = Schedules.parse_schedule(f"{spec}|{zone}")
    assert plan.ours(schedule, day, ZoneInfo(zone)) == fires


def test_croniter_alone_runs_a_repeated_wall_time_twice() -> None:
    plan = _plan()
    alone = plan.croniter_alone("30 2 * * *", date(2026, 10, 25), ZoneInfo("Europe/Berlin"))
    assert alone == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 25, 1, 30)]


def test_every_transition_of_the_plan_is_found() -> None:
    plan = _plan()
    found = {
        (t.zone, t.local_day, t.kind)
        for z in plan.ZONES
        for y in plan.YEARS
        for t in plan.transitions(z, y)
    }
    assert len(found) == 12
    assert ("Australia/Lord_Howe", date(2026, 10, 4), "gap") in found
    assert ("America/New_York", date(2027, 11, 7), "repeat") in found
