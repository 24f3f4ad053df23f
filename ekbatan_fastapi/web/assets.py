"""The dashboard's stylesheet and script, shipped as package data (``web/static/``) and inlined
into the page: no CDN, fonts or external files.

The script reads everything it needs from ``data-*`` attributes and builds the history with
``textContent``, so no value is ever interpreted as HTML. Its URLs are relative to the page
(``/jobs/-/ui`` -> ``/jobs/{name}/...``), so it works under any prefix or proxy path.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["SCRIPT", "STYLE"]


def _asset(name: str) -> str:
    return (
        resources.files(__package__ or "ekbatan_fastapi.web")
        .joinpath("static", name)
        .read_text(encoding="utf-8")
    )


STYLE = _asset("dashboard.css")
SCRIPT = _asset("dashboard.js")
