"""Rolling deploys: which schedule of a recurring job wins when instances of two application
versions disagree, decided from the definition stored in ``ekbatan_jobs``.

The rule: the stored definition carries the schedule's fingerprint and the application version
(``jobs.app-version``) that wrote it. A newer version applies its schedule once (it writes its
definition, then moves the row); an older one adopts the stored schedule and never writes, so
the row is never moved back. Versions compare naturally: runs of digits as numbers, the rest as
text (``1.10`` > ``1.9``, ``2026.12.01-2`` > ``2026.12.01-1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .rows import JobDefinition

__all__ = ["Decision", "compare_versions", "decide"]

_CHUNKS = re.compile(r"(\d+)")


def _key(version: str) -> list[tuple[int, int | str]]:
    return [
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _CHUNKS.split(version.strip().lower())
        if part
    ]


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is older than, the same as or newer than ``b``."""
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


@dataclass(frozen=True, slots=True)
class Decision:
    """Whose definition of one job holds."""

    ours: bool
    """This instance's definition holds (it writes it); False: the stored one (adopted)."""
    changed: bool
    """The holding schedule differs from the stored one: the row moves to it (once)."""
    write: bool
    """Write this instance's definition."""
    reason: str
    warning: str | None = None


def decide(ours: JobDefinition, stored: JobDefinition | None) -> Decision:
    """Whose definition holds, this instance's (``ours``) or the stored one."""
    if stored is None:
        return Decision(True, True, True, "first registration")
    newer = _newer(ours.app_version, stored.app_version)
    if ours.fingerprint == stored.fingerprint:
        return Decision(True, False, newer >= 0, "same schedule")
    if ours.app_version is None:
        return Decision(
            True,
            True,
            True,
            "no application version here",
            f"the schedule of {ours.task_name} changed ({stored.schedule} -> {ours.schedule}) "
            "and jobs.app-version is not set: applied, but during a rolling deploy old and new "
            "instances may move it back and forth; set jobs.app-version (EKBATAN_JOBS__APP_"
            "VERSION) to the application's version",
        )
    if newer > 0:
        stamp = stored.app_version or "none"
        return Decision(True, True, True, f"newer version ({ours.app_version} > {stamp})")
    if newer < 0:
        return Decision(
            False, False, False, f"older version ({ours.app_version} < {stored.app_version})"
        )
    return Decision(
        False,
        False,
        False,
        "same version, another schedule",
        f"two instances of version {ours.app_version} disagree on the schedule of "
        f"{ours.task_name}: stored {stored.schedule} (written by {stored.written_by}), here "
        f"{ours.schedule}; the stored one holds. Deploy a changed schedule with a new "
        "jobs.app-version",
    )


def _newer(ours: str | None, stored: str | None) -> int:
    """How ``ours`` compares with ``stored``; a version beats none."""
    if ours is None or stored is None:
        return (ours is not None) - (stored is not None)
    return compare_versions(ours, stored)
