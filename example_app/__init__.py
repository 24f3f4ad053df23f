"""The ekbatan-fastapi example: ``python -m example_app [--port 8001]``.

Runs Ekbatan's example ``DailyReportJob`` and ``HourlyCleanupJob`` (their services come from
FastAPI-style providers) and a demo job every few seconds that records which instance ran
each slot. Start a second instance on another port: both share one database, and each slot
runs on one of them. See docs/fastapi.md.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
