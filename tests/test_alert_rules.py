"""The shipped Prometheus alert rules (issue 30, item 6): valid, unit-tested with promtool, and
every metric they name is one EkbatanMetrics exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.metrics import ALERT_RULES, EkbatanMetrics, longest_gap

TESTS = Path(__file__).parent / "alerts" / "ekbatan-alerts.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: apt-get install prometheus (.ci/run does)"
)


def test_the_rules_ship_in_the_package() -> None:
    assert ALERT_RULES.is_file()
    assert "EkbatanJobNotSucceeding" in ALERT_RULES.read_text()


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert PROMTOOL is not None
    for args in (["check", "rules", str(ALERT_RULES)], ["test", "rules", str(TESTS)]):
        done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_rules_name_is_exported() -> None:
    rules = "\n".join(line for line in ALERT_RULES.read_text().splitlines() if "#" not in line)
    named = set(re.findall(r"\bekbatan_[a-z_]+", rules))
    metrics = EkbatanMetrics()
    exported = set()
    for family in metrics.registry.collect():
        exported.add(family.name)
        exported.update(f"{family.name}{suffix}" for suffix in ("_total", "_seconds"))
    assert named <= exported, named - exported


def test_the_interval_is_the_longest_gap_of_the_next_slots() -> None:
    monday = datetime(2026, 12, 7, 12, tzinfo=UTC)
    weekdays = Schedules.cron("0 8 * * 1-5", zone="UTC")
    assert longest_gap(weekdays, monday) == timedelta(days=3).total_seconds()  # the weekend
    assert longest_gap(Schedules.fixed_delay(timedelta(minutes=10)), monday) == 600.0
    assert longest_gap(Schedules.daily(datetime(2026, 1, 1, 7).time()), monday) == 86400.0
