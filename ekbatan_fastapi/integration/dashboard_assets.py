"""The dashboard's inline stylesheet and script (no CDN, fonts or external files).

The script reads everything it needs from ``data-*`` attributes and builds the history with
``textContent``, so no value is ever interpreted as HTML. Its URLs are relative to the page
(``/jobs/ui`` -> ``/jobs/{name}/...``), so it works under any prefix or proxy path.
"""

from __future__ import annotations

__all__ = ["SCRIPT", "STYLE"]

STYLE = """
:root { color-scheme: light; --fg: #1f2328; --muted: #59636e; --line: #d1d9e0;
  --bg: #f6f8fa; --card: #fff; --link: #0969da; }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: baseline;
  padding: .75rem 1rem; background: var(--card); border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.15rem; margin: 0; }
main { padding: .75rem 1rem 2rem; max-width: 1400px; }
section { margin: 0 0 1.25rem; }
h2 { font-size: 1rem; margin: 1rem 0 .5rem; }
.meta, .sub { color: var(--muted); font-size: .85em; }
.sub { display: block; }
.banner { border-radius: 6px; padding: .5rem .75rem; margin: .5rem 0; }
.banner ul { margin: .25rem 0 0; padding-left: 1.25rem; }
.banner.bad { background: #ffebe9; border: 1px solid #ff8182; }
.banner.warn { background: #fff8c5; border: 1px solid #d4a72c; }
#flash:empty { display: none; }
#flash { position: sticky; top: 0; z-index: 2; background: #ddf4ff; border: 1px solid #54aeff;
  border-radius: 6px; padding: .5rem .75rem; margin: .5rem 0; }
#flash.bad { background: #ffebe9; border-color: #ff8182; }
table { width: 100%; border-collapse: collapse; background: var(--card);
  border: 1px solid var(--line); border-radius: 6px; }
.scroll { overflow-x: auto; }
th, td { text-align: left; vertical-align: top; padding: .45rem .6rem;
  border-bottom: 1px solid var(--line); overflow-wrap: break-word; }
th { font-size: .8em; text-transform: uppercase; letter-spacing: .03em; color: var(--muted);
  background: var(--bg); white-space: nowrap; }
td.name { min-width: 10rem; }
td.error-cell { min-width: 12rem; }
.nowrap { white-space: nowrap; }
tr.history > td { background: var(--bg); }
.badge { display: inline-block; padding: .05rem .5rem; border-radius: 999px; font-weight: 600;
  font-size: .85em; border: 1px solid transparent; white-space: nowrap; }
.badge::before { content: "\\25CF\\00a0"; }
.st-scheduled, .st-succeeded, .ok, .alive { color: #116329; background: #dafbe1;
  border-color: #4ac26b; }
.st-running { color: #0550ae; background: #ddf4ff; border-color: #54aeff; }
.st-failing, .st-failed { color: #a40e26; background: #fff1e5; border-color: #fb8f44; }
.st-overdue, .st-superseded { color: #7d4e00; background: #fff8c5; border-color: #d4a72c; }
.st-dead, .bad-badge { color: #fff; background: #cf222e; border-color: #a40e26; }
.st-unresolved, .st-cancelled, .gone { color: #424a53; background: #eaeef2;
  border-color: #afb8c1; }
.st-paused { color: #6639ba; background: #fbefff; border-color: #c297ff; }
.error { margin-top: .25rem; padding: .25rem .4rem; border-left: 3px solid #cf222e;
  background: #ffebe9; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: .85em; white-space: pre-wrap; overflow-wrap: anywhere; }
.num-bad { color: #cf222e; font-weight: 700; }
button { font: inherit; cursor: pointer; }
button.act { margin: 0 .25rem .25rem 0; padding: .2rem .6rem; border-radius: 6px;
  border: 1px solid var(--line); background: var(--card); white-space: nowrap; }
button.act:hover { background: var(--bg); }
button.act.danger { color: #a40e26; }
button.history-toggle { border: 0; padding: 0; background: none; color: var(--link);
  font-weight: 600; text-align: left; overflow-wrap: anywhere; }
.reason { font-style: italic; }
button.history-toggle::after { content: " \\25B8"; color: var(--muted); }
button.history-toggle[aria-expanded="true"]::after { content: " \\25BE"; }
button:disabled { opacity: .5; cursor: wait; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem;
  margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: .6rem .8rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
a { color: var(--link); }
footer { padding: 0 1rem 1.5rem; color: var(--muted); font-size: .85em; }
@media (max-width: 760px) {
  main { padding: .5rem; }
  table, thead, tbody, tr, th, td { display: block; width: 100%; }
  table { border: 0; background: none; }
  .scroll { overflow-x: visible; }
  td.name, td.error-cell { min-width: 0; }
  thead { display: none; }
  tr { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
    margin: 0 0 .6rem; }
  td { display: grid; grid-template-columns: 7.5rem minmax(0, 1fr); gap: .5rem;
    border-bottom: 1px solid var(--bg); }
  td::before { content: attr(data-label); color: var(--muted); font-size: .8em;
    text-transform: uppercase; }
  td.empty { display: none; }
  tr.history > td { display: block; }
  tr.history > td::before { content: none; }
  dl.facts { grid-template-columns: 1fr; }
  dl.facts dd { margin-bottom: .35rem; }
}
"""

SCRIPT = """
(() => {
  "use strict";
  const body = document.body;
  const refresh = Number(body.dataset.refresh || "0");
  const flash = document.getElementById("flash");
  let busy = false;

  const seg = (name) => encodeURIComponent(name);
  function say(text, bad) {
    flash.textContent = text;
    flash.className = bad ? "bad" : "";
  }
  function detail(data, response) {
    if (data && typeof data.detail === "string") return data.detail;
    if (data && data.detail) return JSON.stringify(data.detail);
    return response.status + " " + response.statusText;
  }

  function tick() {
    const reading = document.querySelector("tr.history:not([hidden])");
    if (busy || reading) { setTimeout(tick, refresh * 1000); return; }
    location.reload();
  }
  if (refresh > 0) setTimeout(tick, refresh * 1000);

  function cell(tr, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  }

  async function loadHistory(name, target) {
    target.textContent = "Loading the history...";
    let response, data;
    try {
      response = await fetch(seg(name) + "/history?limit=20", { credentials: "same-origin" });
      data = await response.json();
    } catch (error) {
      target.textContent = "Could not load the history: " + error;
      return;
    }
    if (!response.ok) { target.textContent = detail(data, response); return; }
    if (!data.records.length) { target.textContent = "No executions recorded yet."; return; }
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const title of ["Started", "Outcome", "Duration", "Instance", "Ran on", "Error"]) {
      const th = document.createElement("th");
      th.textContent = title;
      head.appendChild(th);
    }
    const rows = table.createTBody();
    for (const r of data.records) {
      const tr = rows.insertRow();
      tr.className = "record";
      const labels = ["Started", "Outcome", "Duration", "Instance", "Ran on", "Error"];
      const started = cell(tr, new Date(r.started_at).toLocaleString());
      started.title = r.started_at;
      const outcome = cell(tr, "");
      const badge = document.createElement("span");
      badge.className = "badge st-" + r.outcome;
      badge.textContent = r.outcome;
      outcome.appendChild(badge);
      cell(tr, r.duration_seconds.toFixed(3) + " s");
      cell(tr, r.task_instance);
      cell(tr, r.picked_by || "");
      const error = cell(tr, "");
      if (r.error_class || r.error_message) {
        const box = document.createElement("div");
        box.className = "error";
        box.textContent = (r.error_class || "") + ": " + (r.error_message || "");
        error.appendChild(box);
      } else {
        error.className = "empty";
      }
      tr.querySelectorAll("td").forEach((td, i) => { td.dataset.label = labels[i]; });
    }
    target.replaceChildren(table);
    if (data.next_before_id !== null) {
      const more = document.createElement("a");
      more.href = seg(name) + "/history?limit=200&before_id=" + data.next_before_id;
      more.textContent = "Older executions (JSON)";
      target.appendChild(more);
    }
  }

  async function act(button, row) {
    const name = row.dataset.name;
    const instance = row.dataset.instance;
    const action = button.dataset.action;
    let url = seg(name);
    let payload = null;
    if (action === "run") {
      url += "/run?instance=" + encodeURIComponent(instance);
    } else if (action === "force") {
      if (!confirm("Run the paused task " + name + " once anyway?")) return;
      url += "/run?force=true&instance=" + encodeURIComponent(instance);
    } else if (action === "pause") {
      const reason = prompt("Pause " + name + " on every instance. Reason:", "");
      if (reason === null) return;
      url += "/pause";
      payload = JSON.stringify({ reason: reason || null });
    } else if (action === "resume" || action === "resume-skip") {
      url += "/resume" + (action === "resume-skip" ? "?skip_missed=true" : "");
    } else {
      return;
    }
    busy = true;
    button.disabled = true;
    try {
      const response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: payload ? { "Content-Type": "application/json" } : {},
        body: payload,
      });
      const data = await response.json().catch(() => null);
      if (!response.ok) {
        say(name + ": " + detail(data, response), true);
        return;
      }
      say(name + ": " + ((data && data.detail) || "done"), false);
      setTimeout(() => location.reload(), 400);
    } catch (error) {
      say(name + ": " + error, true);
    } finally {
      busy = false;
      button.disabled = false;
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    const row = button.closest("tr.task");
    if (!row) return;
    if (button.classList.contains("history-toggle")) {
      const panel = row.nextElementSibling;
      const open = panel.hidden;
      panel.hidden = !open;
      button.setAttribute("aria-expanded", String(open));
      if (open) loadHistory(row.dataset.name, panel.querySelector(".history-body"));
    } else if (button.dataset.action) {
      act(button, row);
    }
  });
})();
"""
