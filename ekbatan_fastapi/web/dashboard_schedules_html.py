"""Rendering the dashboard's schedules page of one ``PersistentScheduleJob`` (``GET
{prefix}/-/ui/schedules/{name}``): a pure function of a page of schedules (no I/O).

Every value goes through ``html.escape``: schedule ids and data come from users (an id
``<script>`` is text). The forms are plain HTML; the page's script (``static/dashboard.js``)
sends them to the admin routes as JSON, reading each row's values from ``data-*`` attributes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from ..client.schedules import MAX_SEARCH, SCHEDULE_STATES, ScheduleInfo
from ..domain.text import MAX_NAME_LENGTH
from .assets import SCRIPT
from .dashboard_html import _badge as badge
from .dashboard_html import _banner as banner
from .dashboard_html import _e as escaped
from .dashboard_html import _table as table
from .dashboard_html import _td as cell
from .dashboard_html import _time as when
from .dashboard_html import page_head

__all__ = ["DATA_EDITABLE", "DATA_SHOWN", "SchedulesView", "render_schedules"]

DATA_SHOWN = 120
"""Characters of a schedule's data (as JSON) the table shows; the rest is cut with an ellipsis."""
DATA_EDITABLE = 64 * 1024
"""Characters of data (as JSON) the page carries for its edit form; larger data is edited with
the client or the CLI (the form then changes the schedule only)."""


@dataclass(frozen=True)
class SchedulesView:
    """What the schedules page shows."""

    job: str
    schedules: Sequence[ScheduleInfo] = ()
    now: datetime | None = None
    """The database's clock (None: unknown)."""
    limit: int = 50
    offset: int = 0
    state: str | None = None
    search: str = ""
    admin_mounted: bool = False
    admin: bool = False
    """The authorization dependency accepts this request: show the forms and buttons."""
    show_data: bool = False
    """Show each schedule's data (it lives in ``task_data``): to admins, and to everyone when
    the router was made with ``include_task_data=True``."""
    problems: list[str] = field(default_factory=list)
    version: str = ""


def data_text(data: Any) -> str:
    """A schedule's data as compact JSON (``null`` when it has none)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _shortened(text: str) -> str:
    return text if len(text) <= DATA_SHOWN else text[: DATA_SHOWN - 1] + "\u2026"


def _query(view: SchedulesView, offset: int) -> str:
    params: dict[str, str | int] = {"limit": view.limit, "offset": offset}
    if view.state:
        params["state"] = view.state
    if view.search:
        params["search"] = view.search
    return "?" + urlencode(params)


def _api(view: SchedulesView) -> str:
    """The JSON route of this page, relative to ``{prefix}/-/ui/schedules/{job}``."""
    return f"../../../{quote(view.job, safe='')}/schedules{_query(view, view.offset)}"


def _state_cell(info: ScheduleInfo, now: datetime | None) -> str:
    text = badge(info.state, f"st-{info.state}")
    paused = info.paused or {}
    if info.state == "paused" or paused:
        who = f"by {escaped(paused['by'])}" if paused.get("by") else ""
        text += f'<span class="sub">{who}</span>' if who else ""
        if paused.get("reason"):
            text += f'<span class="sub reason">{escaped(paused["reason"])}</span>'
    if info.task is not None and info.task.picked_by and info.state == "running":
        text += f'<span class="sub">on {escaped(info.task.picked_by)}</span>'
    if info.error:
        text += f'<div class="error">{escaped(info.error)}</div>'
    return text


def _row(view: SchedulesView, info: ScheduleInfo) -> str:
    shown = data_text(info.data)
    schedule = (
        f"<code>{escaped(info.schedule)}</code>"
        if info.schedule
        else '<span class="meta">unreadable</span>'
    )
    cells = [
        cell("Id", f'<span class="sid">{escaped(info.instance_id)}</span>', "name"),
        cell("State", _state_cell(info, view.now)),
        cell("Schedule", schedule),
        cell("Next slot", when(info.next_time, view.now, never="-")),
        cell(
            "Runs",
            escaped(info.runs if info.max_runs is None else f"{info.runs} / {info.max_runs}"),
        ),
        cell(
            "Data",
            f'<code class="data">{escaped(_shortened(shown))}</code>'
            if info.data is not None and view.show_data
            else f'<span class="meta">{"none" if info.data is None else "hidden"}</span>',
        ),
    ]
    attributes = f'data-id="{escaped(info.instance_id)}"'
    if view.admin:
        cells.append(
            cell(
                "Actions",
                '<button type="button" class="act" data-edit="1">Edit</button>'
                '<button type="button" class="act danger" data-delete="1">Delete</button>',
            )
        )
        attributes += f' data-schedule="{escaped(info.schedule or "")}"'
        if len(shown) <= DATA_EDITABLE:
            attributes += f' data-json="{escaped(shown)}"'
    return f'<tr class="schedule" {attributes}>' + "".join(cells) + "</tr>"


def _search_form(view: SchedulesView) -> str:
    options = '<option value="">any</option>' + "".join(
        f'<option value="{s}"{" selected" if s == view.state else ""}>{s}</option>'
        for s in SCHEDULE_STATES
    )
    return (
        '<form class="search" method="get" role="search">'
        f'<label>Id contains <input type="search" name="search" maxlength="{MAX_SEARCH}" '
        f'value="{escaped(view.search)}" placeholder="user-4"></label> '
        f'<label>State <select name="state">{options}</select></label> '
        f'<input type="hidden" name="limit" value="{view.limit}">'
        '<button type="submit" class="act">Search</button>'
        "</form>"
    )


def _pager(view: SchedulesView) -> str:
    shown = len(view.schedules)
    links = []
    if view.offset > 0:
        previous = max(0, view.offset - view.limit)
        links.append(f'<a rel="prev" href="{escaped(_query(view, previous))}">Previous</a>')
    if shown:
        where = f"{view.offset + 1}-{view.offset + shown}"
        links.append(f'<span class="meta">{escaped(where)}</span>')
    if shown == view.limit:
        following = _query(view, view.offset + view.limit)
        links.append(f'<a rel="next" href="{escaped(following)}">Next</a>')
    if view.search or view.state:
        links.append(f'<a href="?limit={view.limit}">all schedules</a>')
    return '<nav class="pager">' + " ".join(links) + "</nav>" if links else ""


def _editor() -> str:
    """The create/edit form (admins only); the script fills it to edit a row."""
    return (
        '<section class="editor"><h2 id="editor-title">New schedule</h2>'
        '<form id="schedule-form" class="editor" method="post" data-mode="create">'
        f'<label>Id <input name="instance_id" required maxlength="{MAX_NAME_LENGTH}" '
        'placeholder="user-42" autocomplete="off"></label>'
        '<label>Schedule <input name="schedule" required maxlength="1000" '
        'placeholder="CRON|0 8 * * 1-5|Europe/Berlin" autocomplete="off"></label>'
        '<label>Data (JSON) <textarea name="data" rows="3" placeholder=\'{"user_id": 42}\'>'
        "</textarea></label>"
        '<div><button type="submit" class="act">Create</button>'
        '<button type="button" class="act" id="cancel-edit" hidden>Cancel</button></div>'
        '<p class="meta">Schedules: <code>CRON|0 8 * * 1-5|Europe/Berlin</code>, '
        "<code>DAILY|07:30|Europe/Berlin</code>, <code>FIXED_DELAY|PT1H</code>. A change "
        "takes effect from the next slot; a running slot finishes.</p>"
        "<noscript><p>The forms need JavaScript.</p></noscript>"
        "</form></section>"
    )


def render_schedules(view: SchedulesView, *, nonce: str) -> str:
    """The whole page. ``nonce`` is the Content-Security-Policy nonce of its style and script."""
    headers = ["Id", "State", "Schedule", "Next slot", "Runs", "Data"]
    if view.admin:
        headers.append("Actions")
    if view.schedules:
        listing = table(headers, (_row(view, s) for s in view.schedules), "schedules")
    elif view.search or view.state:
        listing = '<p class="meta">No schedule matches.</p>'
    else:
        listing = '<p class="meta">No schedules here.</p>'
    sign_in = (
        f' &middot; <a href="{escaped(_query(view, view.offset))}&amp;sign_in=1">sign in to '
        "create, edit and delete</a>"
        if view.admin_mounted and not view.admin
        else ""
    )
    return f"""{page_head(f"Schedules of {view.job}", nonce)}
<body data-refresh="0" data-job="{escaped(view.job)}" data-admin="{"1" if view.admin else "0"}">
<header>
<h1>Schedules of <span class="sid">{escaped(view.job)}</span></h1>
<span class="meta"><a href="../../ui">all jobs</a>
&middot; database time {when(view.now, None, never="unknown")}{sign_in}</span>
</header>
<main>
<div id="flash" role="status" aria-live="polite"></div>
{banner(view.problems, "bad", "Problems")}
<section><h2>Schedules</h2>{_search_form(view)}{listing}{_pager(view)}</section>
{_editor() if view.admin else ""}
</main>
<footer>ekbatan-fastapi {escaped(view.version)} &middot; by next slot &middot;
<a href="{escaped(_api(view))}">JSON</a></footer>
<script nonce="{escaped(nonce)}">{SCRIPT}</script>
</body>
</html>
"""
