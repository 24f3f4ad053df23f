(() => {
  "use strict";
  const body = document.body;
  const refresh = Number(body.dataset.refresh || "0");
  const flash = document.getElementById("flash");
  let busy = false;

  // The page is {prefix}/-/ui: a task's routes are {prefix}/{name}/... A segment "." or
  // ".." (also written %2e) is a step of the path, not a name: "../.." + "/run" would post to
  // the application's root. encodeURIComponent leaves dots alone, so such names (refused by
  // the library, but a row may be written by other means) are refused here too.
  const part = (name, what) => {
    const encoded = encodeURIComponent(name);
    if (/^(?:\.|%2e){1,2}$/i.test(encoded)) {
      throw new RangeError("the " + what + " " + JSON.stringify(name) + " cannot be part of " +
        "a URL; use ekbatan-jobs (the CLI) or the client for it");
    }
    return encoded;
  };
  const seg = (name) => "../" + part(name, "task name");
  function say(text, bad) {
    flash.textContent = text;
    flash.className = bad ? "bad" : "";
  }
  function detail(data, response) {
    if (data && typeof data.detail === "string") return data.detail;
    if (data && Array.isArray(data.detail)) {  // a 422: name each refused field
      return data.detail.map((d) => {
        const where = (d.loc || []).filter((p) => p !== "body").join(".");
        return (where ? where + ": " : "") + d.msg;
      }).join("; ");
    }
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
    let url;
    try {
      url = seg(name);
    } catch (error) {
      say(error.message, true);
      return;
    }
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
    } else if (action === "cancel") {
      const reason = prompt("Stop the running execution of " + name + " (wherever it runs). Reason:", "");
      if (reason === null) return;
      url += "/cancel?instance=" + encodeURIComponent(instance);
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

  // The schedules page ({prefix}/-/ui/schedules/{job}): the forms call the admin routes
  // {prefix}/{job}/schedules/{id} ("../../" + seg(job) from here) with JSON bodies.
  const form = document.getElementById("schedule-form");
  if (!form) return;
  const job = body.dataset.job;
  const title = document.getElementById("editor-title");
  const submit = form.querySelector('button[type="submit"]');
  const cancel = document.getElementById("cancel-edit");
  const field = (name) => form.elements.namedItem(name);
  let editing = null;

  function scheduleUrl(id) {
    if (id.includes("/")) {
      throw new RangeError("the id " + JSON.stringify(id) + " holds a '/', which a URL path " +
        "cannot address; use ekbatan-jobs (the CLI) or the client for it");
    }
    return "../../" + seg(job) + "/schedules/" + part(id, "schedule id");
  }

  function edit(row) {
    editing = {
      id: row.dataset.id,
      schedule: row.dataset.schedule || "",
      data: row.dataset.json,
    };
    title.textContent = "Edit " + editing.id;
    field("instance_id").value = editing.id;
    field("instance_id").readOnly = true;
    field("schedule").value = editing.schedule;
    const data = field("data");
    data.disabled = editing.data === undefined;
    data.value = editing.data === undefined ? "" : editing.data;
    data.placeholder = data.disabled ? "too large to edit here: use ekbatan-jobs" : "";
    submit.textContent = "Save";
    cancel.hidden = false;
    form.dataset.mode = "edit";
    field("schedule").focus();
  }

  function reset() {
    editing = null;
    form.reset();
    title.textContent = "New schedule";
    field("instance_id").readOnly = false;
    field("data").disabled = false;
    submit.textContent = "Create";
    cancel.hidden = true;
    form.dataset.mode = "create";
  }

  async function send(method, id, payload, query, button) {
    let url;
    try {
      url = scheduleUrl(id) + query;
    } catch (error) {
      say(error.message, true);
      return;
    }
    busy = true;
    button.disabled = true;
    try {
      const response = await fetch(url, {
        method: method,
        credentials: "same-origin",
        headers: payload === null ? {} : { "Content-Type": "application/json" },
        body: payload === null ? null : JSON.stringify(payload),
      });
      const data = await response.json().catch(() => null);
      if (!response.ok) {
        say(id + ": " + detail(data, response), true);
        return;
      }
      say(id + ": " + ((data && data.detail) || "deleted"), false);
      setTimeout(() => location.reload(), 400);
    } catch (error) {
      say(id + ": " + error, true);
    } finally {
      busy = false;
      button.disabled = false;
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = editing ? editing.id : field("instance_id").value;
    const schedule = field("schedule").value;
    const text = field("data").value;
    let data = null;
    if (text.trim() !== "") {
      try {
        data = JSON.parse(text);
      } catch (error) {
        say("data: not JSON (" + error.message + ")", true);
        field("data").focus();
        return;
      }
    }
    if (!editing) {
      send("PUT", id, { schedule: schedule, data: data }, "?replace=false", submit);
      return;
    }
    const changes = {};
    if (schedule !== editing.schedule) changes.schedule = schedule;
    if (editing.data !== undefined && text !== editing.data) changes.data = data;
    if (!Object.keys(changes).length) {
      say(id + ": nothing changed", false);
      return;
    }
    send("PATCH", id, changes, "", submit);
  });
  cancel.addEventListener("click", reset);

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    const row = button && button.closest("tr.schedule");
    if (!row) return;
    if (button.dataset.edit) {
      edit(row);
    } else if (button.dataset.delete) {
      const id = row.dataset.id;
      if (!confirm("Delete the schedule " + id + " of " + job + "? A running slot finishes.")) {
        return;
      }
      send("DELETE", id, null, "", button);
    }
  });
})();
