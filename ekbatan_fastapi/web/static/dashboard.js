(() => {
  "use strict";
  const body = document.body;
  const refresh = Number(body.dataset.refresh || "0");
  const flash = document.getElementById("flash");
  let busy = false;

  // The page is {prefix}/-/ui: a task's routes are {prefix}/{name}/...
  const seg = (name) => "../" + encodeURIComponent(name);
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
