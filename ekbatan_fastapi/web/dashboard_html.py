"""Rendering the dashboard page: a pure function of the ``/jobs`` report (no I/O).

Every value goes through ``html.escape``: task names, reasons and error messages come from
users and other services and may contain quotes or markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from urllib.parse import quote

from ..client.views import (
    HistoryRecord,
    InstanceView,
    JobsReport,
    JobView,
    PauseView,
    SchedulerView,
    TaskView,
)
from .assets import SCRIPT, STYLE

__all__ = ["DashboardView", "page_head", "relative_time", "render_dashboard"]

_COLUMNS = (
    "Task",
    "State",
    "Schedule",
    "Next run",
    "Heartbeat",
    "Last success",
    "Last failure",
    "Failures",
    "Missed",
)


@dataclass(frozen=True)
class DashboardView:
    """What the page shows."""

    report: JobsReport
    last_errors: Mapping[tuple[str, str], HistoryRecord] = field(default_factory=dict)
    """The latest failed execution of each (task, instance), from the history."""
    admin_mounted: bool = False
    """The router has an authorization dependency (so admin routes exist)."""
    admin: bool = False
    """... and it accepts the current request: show the action buttons."""
    refresh: float = 5.0
    json_url: str = "/jobs"
    version: str = ""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def relative_time(at: datetime, now: datetime | None) -> str:
    """``in 4 s``, ``12 min ago``, ``now``; the ISO time when ``now`` is unknown."""
    if now is None:
        return at.isoformat(timespec="seconds")
    seconds = (at - now).total_seconds()
    if abs(seconds) < 0.5:
        return "just now"
    return f"in {_span(seconds)}" if seconds > 0 else f"{_span(-seconds)} ago"


def _time(at: datetime | None, now: datetime | None, *, never: str = "never") -> str:
    if at is None:
        return f'<span class="meta">{_e(never)}</span>'
    iso = at.isoformat()
    text = _e(relative_time(at, now))
    return f'<time class="nowrap" datetime="{_e(iso)}" title="{_e(iso)}">{text}</time>'


def _badge(text: str, css: str) -> str:
    return f'<span class="badge {_e(css)}">{_e(text)}</span>'


def _td(label: str, content: str, css: str = "") -> str:
    """A cell; its content sits in one ``div`` so the phone layout sees one value per cell."""
    cls = f' class="{_e(css)}"' if css else ""
    return f'<td data-label="{_e(label)}"{cls}><div>{content}</div></td>'


def _paused_note(pause: PauseView, now: datetime | None, *, say_paused: bool = False) -> str:
    by = f"by {_e(pause.paused_by)}, " if pause.paused_by else ""
    if say_paused:
        by = "paused " + by
    note = f'<span class="sub">{by}{_time(pause.paused_at, now)}</span>'
    if pause.reason:
        note += f'<span class="sub reason">{_e(pause.reason)}</span>'
    return note


def _actions(view: DashboardView, task: TaskView | None, pause: PauseView | None) -> str:
    buttons: list[tuple[str, str, str]] = []
    recurring = task is None or task.instance == "recurring"
    if task is not None and task.picked:
        buttons.append(("cancel", "Stop", "act danger"))
    if pause is None:
        if task is not None and not task.picked:
            buttons.append(("run", "Run now", "act"))
        buttons.append(("pause", "Pause", "act danger"))
    else:
        buttons.append(("resume", "Resume", "act"))
        if recurring:
            buttons.append(("resume-skip", "Resume, skip missed", "act"))
        if task is not None and not task.picked:
            buttons.append(("force", "Run once (forced)", "act"))
    return "".join(
        f'<button type="button" class="{css}" data-action="{action}">{_e(text)}</button>'
        for action, text, css in buttons
    )


def _history_row(width: int) -> str:
    return (
        f'<tr class="history" hidden><td colspan="{width}">'
        '<div class="history-body"></div></td></tr>'
    )


def _name_cell(task: TaskView) -> str:
    """The task's name (the history toggle) and what kind of task it is."""
    sub = [] if task.instance == "recurring" else [f"instance {task.instance}"]
    if task.kind == "unknown":
        sub.append("no job of this name here")
    elif task.kind == "one-time":
        sub.append("one-time")
    return (
        f'<button type="button" class="history-toggle" aria-expanded="false" '
        f'title="Show the history">{_e(task.name)}</button>'
        + "".join(f'<span class="sub">{_e(s)}</span>' for s in sub)
    )


def _state_cell(task: TaskView, now: datetime | None) -> str:
    """The derived state, who runs it, and its pause."""
    state = _badge(task.state, f"st-{task.state}")
    if task.picked and task.picked_by:
        state += f'<span class="sub">on {_e(task.picked_by)}</span>'
    if task.paused is not None:
        state += _paused_note(task.paused, now, say_paused=task.state != "paused")
    return state


def _heartbeat_cell(task: TaskView) -> str:
    if task.heartbeat_age_seconds is None:
        return '<span class="meta">-</span>'
    heartbeat = f"{task.heartbeat_age_seconds:.1f} s ago"
    if task.fraction_dead is not None:
        heartbeat += f'<span class="sub">{task.fraction_dead:.0%} of the dead window</span>'
    return heartbeat


def _failure_cells(view: DashboardView, task: TaskView, now: datetime | None) -> list[str]:
    """The last failure (with its error, when known) and the consecutive failures."""
    failure = _time(task.last_failure, now)
    error = view.last_errors.get((task.name, task.instance))
    if error is not None and task.last_failure is not None:
        failure += (
            f'<div class="error">{_e(error.error_class or "error")}: '
            f"{_e(error.error_message or '')}</div>"
        )
    failures = (
        f'<span class="num-bad">{task.consecutive_failures}</span>'
        if task.consecutive_failures
        else "0"
    )
    missed = (
        f'<span class="num-bad" title="slots in a row that passed without a run; the history '
        f'names each">{task.consecutive_missed_slots}</span>'
        if task.consecutive_missed_slots
        else "0"
    )
    return [
        _td("Last failure", failure, "error-cell" if error is not None else ""),
        _td("Failures", failures),
        _td("Missed", missed),
    ]


def _task_row(view: DashboardView, task: TaskView, now: datetime | None) -> str:
    parked = task.state == "parked"  # its time is a marker (PARKED_TIME), not a run
    cells = [
        _td("Task", _name_cell(task), "name"),
        _td("State", _state_cell(task, now)),
        _td("Schedule", _e(task.schedule) if task.schedule else '<span class="meta">-</span>'),
        _td("Next run", _time(None if parked else task.execution_time, now, never="parked")),
        _td("Heartbeat", _heartbeat_cell(task), "" if task.picked else "empty"),
        _td("Last success", _time(task.last_success, now)),
        *_failure_cells(view, task, now),
    ]
    if view.admin:
        cells.append(_td("Actions", _actions(view, task, task.paused)))
    return (
        f'<tr class="task" data-name="{_e(task.name)}" data-instance="{_e(task.instance)}" '
        f'data-state="{_e(task.state)}">' + "".join(cells) + "</tr>" + _history_row(len(cells))
    )


def _table(headers: Iterable[str], rows: Iterable[str], css: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(rows)
    return (
        f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _tasks_section(view: DashboardView) -> str:
    report = view.report
    now = report.database_time
    headers = [*_COLUMNS, "Actions"] if view.admin else list(_COLUMNS)
    if not report.tasks:
        body = '<p class="meta">No tasks in the table.</p>'
    else:
        body = _table(headers, (_task_row(view, t, now) for t in report.tasks), "tasks")
    with_rows = {t.name for t in report.tasks}
    extra = [p for p in report.paused if p.name not in with_rows]
    if extra:
        rows = []
        for pause in extra:
            cells = [
                _td(
                    "Task",
                    f'<button type="button" class="history-toggle" '
                    f'aria-expanded="false">{_e(pause.name)}</button>',
                ),
                _td("State", _badge("paused", "st-paused") + _paused_note(pause, now)),
            ]
            if view.admin:
                cells.append(_td("Actions", _actions(view, None, pause)))
            rows.append(
                f'<tr class="task" data-name="{_e(pause.name)}" data-instance="recurring" '
                f'data-state="paused">' + "".join(cells) + "</tr>" + _history_row(len(cells))
            )
        head = ["Task", "State", "Actions"] if view.admin else ["Task", "State"]
        body += "<h2>Paused, without rows in the table</h2>" + _table(head, rows, "paused")
    return f"<section><h2>Tasks ({len(report.tasks)})</h2>{body}</section>"


def _instance_row(instance: InstanceView, now: datetime | None) -> str:
    name = _e(instance.name) + (
        ' <span class="meta">(this page)</span>' if instance.this_instance else ""
    )
    status = _badge("alive", "alive") if instance.alive else _badge("not seen", "gone")
    return (
        "<tr>"
        + "".join(
            [
                _td("Instance", name),
                _td("Status", status),
                _td("Host", _e(instance.host)),
                _td("PID", _e(instance.pid)),
                _td("Started", _time(instance.started_at, now)),
                _td("Last seen", _time(instance.last_seen, now)),
                _td("Version", _e(instance.library_version)),
            ]
        )
        + "</tr>"
    )


def _instances_section(report: JobsReport) -> str:
    alive = sum(1 for i in report.instances if i.alive)
    if report.instances:
        headers = ["Instance", "Status", "Host", "PID", "Started", "Last seen", "Version"]
        rows = (_instance_row(i, report.database_time) for i in report.instances)
        body = _table(headers, rows, "instances")
    else:
        body = '<p class="meta">No instance has reported itself.</p>'
    title = f"Instances ({alive} alive of {len(report.instances)})"
    return f"<section><h2>{_e(title)}</h2>{body}</section>"


def _job_row(job: JobView) -> str:
    limit = "-" if job.max_concurrency is None else str(job.max_concurrency)
    if job.per_key and job.max_concurrency is not None:
        limit += " per key"
    running = f"{job.running} / {limit}" if job.max_concurrency is not None else str(job.running)
    timed_out = (
        _badge(f"{job.timed_out_last_day} timed out", "st-failed")
        if job.timed_out_last_day
        else '<span class="meta">0</span>'
    )
    here = "" if job.registered_here else ' <span class="meta">(another instance)</span>'
    schedule = _e(job.schedule or "-")
    if job.own_schedule:
        schedule += (
            f' <span class="meta">(a newer version\'s; its own: {_e(job.own_schedule)})</span>'
        )
    return (
        "<tr>"
        + "".join(
            [
                _td("Job", _e(job.name) + here, "name"),
                _td("Kind", _e(job.kind) + _schedules_link(job)),
                _td("Schedule", schedule),
                _td("Catch-up", _e(job.catch_up or "-")),
                _td("Overlap", _e(job.overlap or "-")),
                _td("Slots missed / caught up / skipped", _e(_slots(job))),
                _td("Timeout", _e(job.timeout or "-")),
                _td("Running / limit", _e(running)),
                _td("Timed out (24 h)", timed_out),
            ]
        )
        + "</tr>"
    )


def _schedules_link(job: JobView) -> str:
    """A ``PersistentScheduleJob``'s schedules: how many, and a link to their page (a name
    that a URL path cannot hold, ``/`` or a dot segment, gets the count only)."""
    if job.schedules is None:
        return ""
    count = sum(job.schedules.values())
    text = f"{count} schedule{'' if count == 1 else 's'}"
    if "/" in job.name or job.name in (".", ".."):
        return f'<span class="sub">{_e(text)}</span>'
    href = "ui/schedules/" + quote(job.name, safe="")
    return f'<span class="sub"><a class="schedules-link" href="{_e(href)}">{_e(text)}</a></span>'


def _slots(job: JobView) -> str:
    if job.kind != "recurring":
        return "-"
    counts = f"{job.missed_slots} / {job.caught_up_slots} / {job.skipped_slots}"
    return counts + (f", {job.backfill_pending} backfilling" if job.backfill_pending else "")


def _jobs_section(report: JobsReport) -> str:
    if not report.jobs:
        return ""
    headers = [
        "Job",
        "Kind",
        "Schedule",
        "Catch-up",
        "Overlap",
        "Slots missed / caught up / skipped",
        "Timeout",
        "Running / limit",
        "Timed out (24 h)",
    ]
    body = _table(headers, (_job_row(j) for j in report.jobs), "jobs")
    return f"<section><h2>Jobs ({len(report.jobs)})</h2>{body}</section>"


def _lag(s: SchedulerView, now: datetime | None) -> str:
    if not s.loop_lag_events:
        return "no stalls seen"
    times = "once" if s.loop_lag_events == 1 else f"{s.loop_lag_events} times"
    text = _e(f"blocked {times}, longest {s.max_loop_lag_seconds:.3f} s")
    if s.last_loop_lag_at is not None:
        text += f", last {_time(s.last_loop_lag_at, now)}"
    return text


def _scheduler_section(s: SchedulerView, now: datetime | None) -> str:
    reachable = {True: "yes", False: "no", None: "not tried yet"}[s.database_reachable]
    running = ", ".join(f"{r.task_name}/{r.task_instance}" for r in s.running) or "nothing"
    facts: list[tuple[str, str]] = [
        ("Name", _e(s.name)),
        ("Started", _time(s.started_at, now, never="not started")),
        ("Ready", "yes" if s.ready else "no"),
        ("Database reachable", _e(reachable)),
        ("Last successful poll", _time(s.last_successful_poll, now)),
        ("Polling", _e(f"{s.polling_strategy}, every {s.polling_interval}, batch {s.batch_size}")),
        ("Heartbeats", _e(f"every {s.heartbeat_interval}, dead after {s.dead_after}")),
        ("Loop restarts", _e(s.loop_restarts)),
        ("Event-loop lag", _lag(s, now)),
        ("Running here", _e(running)),
    ]
    if s.stopping:
        facts.append(("Stopping", "yes"))
    if s.last_error:
        facts.append(("Last error", f'<div class="error">{_e(s.last_error)}</div>'))
    items = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in facts)
    return f'<section><h2>This instance</h2><dl class="facts">{items}</dl></section>'


def _banner(lines: list[str], css: str, title: str) -> str:
    if not lines:
        return ""
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return (
        f'<div class="banner {css}" role="alert"><strong>{_e(title)}</strong><ul>{items}</ul></div>'
    )


def page_head(title: str, nonce: str, extra: str = "") -> str:
    """A dashboard page's start, up to its ``<body>``: ``title`` (text), its style under the
    Content-Security-Policy ``nonce``, and ``extra`` (HTML) in its head."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<link rel="icon" href="data:,">
<title>{_e(title)}</title>
<style nonce="{_e(nonce)}">{STYLE}</style>
{extra}</head>"""


def _summary(report: JobsReport) -> str:
    counts: dict[str, int] = {}
    for task in report.tasks:
        counts[task.state] = counts.get(task.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no tasks"


def render_dashboard(view: DashboardView, *, nonce: str) -> str:
    """The whole page. ``nonce`` is the Content-Security-Policy nonce of its style and script."""
    report = view.report
    health = _badge("healthy", "ok") if report.healthy else _badge("unhealthy", "bad-badge")
    refresh = f"refreshes every {view.refresh:g} s" if view.refresh > 0 else "automatic refresh off"
    if view.admin_mounted and not view.admin:
        sign_in = ' &middot; <a href="ui?sign_in=1">sign in for actions</a>'
    else:
        sign_in = ""
    noscript = (
        f'<noscript><meta http-equiv="refresh" content="{view.refresh:g}"></noscript>'
        if view.refresh > 0
        else ""
    )
    scheduler = report.scheduler
    admin = "1" if view.admin else "0"
    return f"""{page_head(f"Jobs - {scheduler.name}", nonce, noscript)}
<body data-refresh="{view.refresh:g}" data-admin="{admin}">
<header>
<h1>Jobs</h1> {health}
<span class="meta">{_e(_summary(report))} &middot; answered by {_e(scheduler.name)}
&middot; database time {_time(report.database_time, None, never="unknown")}
&middot; {_e(refresh)}{sign_in}</span>
</header>
<main>
<div id="flash" role="status" aria-live="polite"></div>
{_banner(report.problems, "bad", "Problems")}
{_banner(report.warnings, "warn", "Warnings")}
{_tasks_section(view)}
{_jobs_section(report)}
{_instances_section(report)}
{_scheduler_section(scheduler, report.database_time)}
</main>
<footer>ekbatan-fastapi {_e(view.version)} &middot; <a href="{_e(view.json_url)}">JSON</a>
&middot; click a task's name for its history</footer>
<script nonce="{_e(nonce)}">{SCRIPT}</script>
</body>
</html>
"""
