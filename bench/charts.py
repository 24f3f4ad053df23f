"""PNG charts for docs/benchmarks/ from run_all.py's results JSON, history_growth.py's, or
a file of measured figures (``docs/benchmarks/cost-round2.json``). Needs matplotlib: run it
with the peers' environment, ``bench/.venv-peers/bin/python bench/charts.py RESULTS OUTDIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OURS = "ekbatan-fastapi"
COLORS = {
    OURS: "#1f77b4",
    "pgqueuer": "#ff7f0e",
    "procrastinate": "#2ca02c",
    "apscheduler": "#d62728",
}


def throughput_chart(results: dict[str, Any], out: Path) -> Path | None:
    rows: list[tuple[str, int, float]] = []
    for s in results.get("ours_throughput", {}).get("summary", []):
        if s.get("median"):
            rows.append((f"{OURS}\n{s['strategy']}", s["processes"], s["median"]))
    peer_rates: dict[tuple[str, int], list[float]] = {}
    for p in results.get("peers_throughput", []) or []:
        if isinstance(p, dict) and p.get("ok") and p.get("rate"):
            peer_rates.setdefault((p["system"], p["processes"]), []).append(p["rate"])
    for (system, k), rates in peer_rates.items():  # the median of the repeats
        rows.append((system, k, sorted(rates)[(len(rates) - 1) // 2]))
    if not rows:
        return None
    systems = list(dict.fromkeys(r[0] for r in rows))
    ks = sorted({r[1] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        xs, ys = [], []
        for j, system in enumerate(systems):
            for r in rows:
                if r[0] == system and r[1] == k:
                    xs.append(j + i * width)
                    ys.append(r[2])
        bars = ax.bar(xs, ys, width, label=f"{k} process{'es' if k > 1 else ''}")
        ax.bar_label(bars, labels=[f"{y:,.0f}" for y in ys], fontsize=7, rotation=90, padding=2)
    limits = results.get("db_limit", {}).get("summary", [])
    for s in limits:
        if s.get("strategy") == "lock-and-fetch" and not s.get("history") and s.get("median"):
            ax.axhline(s["median"], linestyle="--", linewidth=1, color="grey")
            va = "bottom" if s["clients"] > 1 else "top"
            ax.text(
                len(systems) - 0.5,
                s["median"],
                f"DB limit, lock-and-fetch, {s['clients']} client(s)",
                fontsize=7,
                ha="right",
                va=va,
            )
    ax.set_xticks([j + width * (len(ks) - 1) / 2 for j in range(len(systems))])
    ax.set_xticklabels(systems, fontsize=8)
    ax.set_ylabel("no-op executions per second")
    ax.set_yscale("log")
    ax.set_title("Throughput: 20,000 no-op jobs (same database, same run)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lag_chart(results: dict[str, Any], out: Path) -> Path | None:
    runs = [r for r in results.get("slot_lag", []) if r.get("result")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [r["system"] for r in runs]
    width = 0.25
    for i, (key, name) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max"))):
        ys = [max(r["result"][key] or 0.01, 0.01) for r in runs]
        bars = ax.bar([j + i * width for j in range(len(runs))], ys, width, label=name)
        ax.bar_label(bars, labels=[f"{y:,.1f}" for y in ys], fontsize=7, padding=2)
    ax.axhline(20, linestyle="--", linewidth=1, color="grey")
    ax.text(len(runs) - 0.6, 20, "goal p99 20 ms", fontsize=7, va="bottom")
    ax.set_xticks([j + width for j in range(len(runs))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("lag, ms (start of the function - the slot's time)")
    ax.set_title("Slot lag: 1-second schedules, 2 processes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "slot-lag.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def failover_chart(results: dict[str, Any], out: Path) -> Path | None:
    failover = results.get("failover") or {}
    trials = [t for t in failover.get("trials", []) if t.get("failover_s") is not None]
    if not trials:
        return None
    summary = failover.get("summary", {})
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t["index"] + 1 for t in trials], [t["failover_s"] for t in trials], "o-")
    if summary.get("goal_s"):
        ax.axhline(summary["goal_s"], linestyle="--", color="red", linewidth=1)
        ax.text(1, summary["goal_s"], f"goal {summary['goal_s']:.1f} s", fontsize=8, va="bottom")
    if summary.get("dead_after_s"):
        ax.axhline(summary["dead_after_s"], linestyle=":", color="grey", linewidth=1)
        ax.text(1, summary["dead_after_s"], "dead window", fontsize=8, va="bottom")
    ax.set_xlabel("trial")
    ax.set_ylabel("seconds from SIGKILL to the restart")
    ax.set_ylim(0, max(6.0, max(t["failover_s"] for t in trials) + 0.5))
    ax.set_title("Failover after SIGKILL (heartbeat 1 s x 4)")
    fig.tight_layout()
    path = out / "failover.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def history_growth_chart(results: dict[str, Any], out: Path) -> Path | None:
    """``bench/history_growth.py --json``'s results: the drain rates without and during
    retention, the retention statements' p99 and max against the 1 s bound, the history
    page's p99 per case."""
    if "retention" not in results or "rounds" not in results:
        return None
    fig, (rates, statements, pages) = plt.subplots(1, 3, figsize=(15, 4.6))
    colors = {"alone": "#1f77b4", "during retention": "#d62728", "after": "#2ca02c"}
    rounds = results["rounds"]
    rates.bar(
        range(len(rounds)),
        [r["rate"] for r in rounds],
        color=[colors.get(r["phase"], "#7f7f7f") for r in rounds],
    )
    rates.set_xticks(range(len(rounds)))
    short = {"alone": "before", "during retention": "during", "after": "after"}
    rates.set_xticklabels(
        [short.get(r["phase"], "ended\nduring") for r in rounds], fontsize=7, rotation=60
    )
    rates.set_ylabel("executions/s (drain of due rows)")
    rates.set_title("Claim/complete rate before, during and after retention", fontsize=9)
    ret = results["retention"]
    kinds = ["edge read", "range delete", "batch"]
    xs = list(range(len(kinds)))
    statements.bar([x - 0.2 for x in xs], [ret[k]["p99_ms"] or 0 for k in kinds], 0.4, label="p99")
    statements.bar([x + 0.2 for x in xs], [ret[k]["max_ms"] or 0 for k in kinds], 0.4, label="max")
    statements.axhline(1000, color="#d62728", linestyle="--", linewidth=1, label="1 s bound")
    statements.set_xticks(xs)
    statements.set_xticklabels(kinds, fontsize=8)
    statements.set_yscale("log")
    statements.set_ylabel("ms")
    statements.set_title(
        f"Retention: {ret['pruned']:,} records, {ret['batches']} batches", fontsize=9
    )
    statements.legend(fontsize=7)
    shown = results["pages"]
    labels = [
        f"{r['case'].replace(', first page', '')}, {r['statement']}, {r['plan']}" for r in shown
    ]
    ys = [max(r["p99_ms"], 0.01) for r in shown]
    bars = pages.barh(
        range(len(shown)),
        ys,
        color=["#1f77b4" if r["statement"] == "now" else "#ff7f0e" for r in shown],
    )
    pages.bar_label(bars, labels=[f"{y:,.1f}" for y in ys], fontsize=6, padding=2)
    pages.axvline(50, color="#d62728", linestyle="--", linewidth=1)
    pages.set_yticks(range(len(shown)))
    pages.set_yticklabels(labels, fontsize=6)
    pages.set_xscale("log")
    pages.set_xlabel("history page p99, ms (goal 50 ms)")
    pages.set_title(f"/jobs/{{name}}/history at {results['rows']:,} records", fontsize=9)
    fig.tight_layout()
    server = results["info"].get("server", "").lower()
    generic = any(r["plan"] == "generic" for r in results["pages"])  # PostgreSQL's alone
    dialect = "mariadb" if "maria" in server else "postgresql" if generic else "mysql"
    path = out / f"history-growth-{dialect}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_COST_PANELS = (
    ("cpu_per_execution_us", "worker CPU per no-op execution, us", "goal <= {goal}"),
    ("efficiency", "ours / the database's limit", "goal >= {goal}"),
    ("sixteen_processes", "16 processes / the best rate", "goal >= {goal}"),
    ("burst_p99_ms", "1,000 jobs in one second: lag p99, ms", "goal <= {goal}"),
)


def cost_chart(results: dict[str, Any], out: Path) -> Path | None:
    """A file of ``{"cost": {panel: {"goal": g, "runs": [{"label", "value"}]}}}``: one bar
    panel per figure of issue #17's targets, with the goal as a line; drawn to the file's
    ``"chart"`` name (default ``cost-round2.png``). A panel's ``"title"`` replaces its usual
    one."""
    cost = results.get("cost")
    if not isinstance(cost, dict):
        return None
    panels = [(key, title, goal) for key, title, goal in _COST_PANELS if key in cost]
    bars_most = max(len(cost[key]["runs"]) for key, _, _ in panels)
    width = max(4.2, 0.95 * bars_most)  # per panel: room for each bar's two-line label
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.4))
    grid = list(getattr(axes, "flat", [axes]))
    for ax, (key, title, goal_text) in zip(grid, panels, strict=True):
        runs, goal = cost[key]["runs"], cost[key]["goal"]
        bars = ax.bar(range(len(runs)), [r["value"] for r in runs], color=COLORS[OURS])
        ax.bar_label(bars, labels=[f"{r['value']:g}" for r in runs], fontsize=7, padding=2)
        ax.axhline(goal, color="#d62728", linestyle="--", linewidth=1)
        ax.text(-0.4, goal, goal_text.format(goal=goal), fontsize=7, va="bottom", color="#d62728")
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([r["label"] for r in runs], fontsize=6)
        ax.set_title(cost[key].get("title", title), fontsize=9)
    fig.tight_layout()
    path = out / str(results.get("chart", "cost-round2.png"))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    results = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    made = [
        p
        for p in (
            throughput_chart(results, out),
            lag_chart(results, out),
            failover_chart(results, out),
            history_growth_chart(results, out),
            cost_chart(results, out),
        )
        if p is not None
    ]
    print(json.dumps([str(p) for p in made]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
