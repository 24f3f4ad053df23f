"""One operator read model (issue 28 item 5): ``GET /jobs``, its history and
``ekbatan-jobs ... --json`` show the same cluster with the same names and the same values
(``ekbatan_fastapi/client/read_model.py``), and the metrics count running executions as
``/jobs`` does."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import Schedules
from ekbatan_fastapi.cli import EXIT, parser, run
from ekbatan_fastapi.cli.output import Output
from ekbatan_fastapi.client.read_model import running_here

from .helpers import RecordingJob, wait_until
from .test_jobs_routes import serving

HOUR = timedelta(hours=1)

_SAME_TASK_FIELDS = (
    "name",
    "instance",
    "kind",
    "schedule",
    "state",
    "paused",
    "execution_time",
    "picked",
    "picked_by",
    "last_heartbeat",
    "heartbeat_age_seconds",
    "fraction_dead",
    "last_success",
    "last_failure",
    "consecutive_failures",
    "priority",
    "version",
    "task_data",
)
_SAME_JOB_FIELDS = (
    "name",
    "kind",
    "schedule",
    "timeout",
    "max_concurrency",
    "per_key",
    "running",
    "timed_out_last_day",
    "app_version",
    "written_by",
    "written_at",
    "catch_up",
    "missed_slots",
    "caught_up_slots",
    "skipped_slots",
    "backfill_pending",
)


async def _cli(*argv: str) -> Any:
    out, err = io.StringIO(), io.StringIO()
    args = parser().parse_args([*argv, "--json"])
    code = await run(args, Output(json_mode=True, stdout=out, stderr=err))
    assert code == EXIT.OK, err.getvalue()
    return json.loads(out.getvalue())


async def test_the_cli_and_jobs_show_the_same_views_with_the_same_names(
    engine: AsyncEngine, database_url: str
) -> None:
    ok = RecordingJob("ok-job", Schedules.fixed_delay(HOUR))
    bad = RecordingJob("bad-job", Schedules.fixed_delay(HOUR), fail=True)
    async with serving(database_url, ok, bad) as (client, state):
        await wait_until(lambda: bool(ok.slots and bad.slots), what="the first runs")

        async def recorded() -> bool:
            return len(await state.client.history()) == 2

        await wait_until(recorded, what="two history records")
        await state.client.pause("ok-job", "maintenance", paused_by="alice")
        url = ("--url", database_url)

        report = (await client.get("/jobs")).json()
        listed = await _cli(*url, "list")
        # list: the fields of /jobs's names, each task a TaskView with the same values
        assert {k: report[k] for k in listed} == listed | {"database_time": report["database_time"]}
        web_tasks = {t["name"]: t for t in report["tasks"]}
        cli_tasks = {t["name"]: t for t in listed["tasks"]}
        assert web_tasks.keys() == cli_tasks.keys() == {"ok-job", "bad-job"}
        for name, task in cli_tasks.items():
            assert task.keys() == web_tasks[name].keys()
            same = {f: web_tasks[name][f] for f in _SAME_TASK_FIELDS}
            assert {f: task[f] for f in _SAME_TASK_FIELDS} == same, name
        assert cli_tasks["ok-job"]["state"] == "paused"
        assert cli_tasks["ok-job"]["paused"]["paused_by"] == "alice"
        assert cli_tasks["bad-job"]["state"] == "failing"
        assert listed["paused"] == report["paused"]

        # jobs: the cluster's jobs, as /jobs lists them
        jobs = await _cli(*url, "jobs")
        web_jobs = {j["name"]: j for j in report["jobs"]}
        for job in jobs["jobs"]:
            assert job.keys() == web_jobs[job["name"]].keys()
            same = {f: web_jobs[job["name"]][f] for f in _SAME_JOB_FIELDS}
            assert {f: job[f] for f in _SAME_JOB_FIELDS} == same
            assert job["registered_here"] is False and web_jobs[job["name"]]["registered_here"]
        assert [j["name"] for j in jobs["jobs"]] == ["bad-job", "ok-job"]

        # instances: the same, but the CLI is none of them
        instances = await _cli(*url, "instances")
        assert [i["name"] for i in instances["instances"]] == [
            i["name"] for i in report["instances"]
        ]
        assert instances["instances"][0].keys() == report["instances"][0].keys()
        assert not any(i["this_instance"] for i in instances["instances"])

        # history: the page of GET /jobs/{name}/history, value for value
        page = (await client.get("/jobs/bad-job/history", params={"limit": 1})).json()
        assert await _cli(*url, "history", "bad-job", "--limit", "1") == page
        assert page["records"][0]["outcome"] == "failed"

        # metrics: running executions counted as the report counts them
        counts = running_here(state.registry.scheduler)
        assert counts == {"ok-job": 0, "bad-job": 0}
        assert report["scheduler"]["running"] == []
