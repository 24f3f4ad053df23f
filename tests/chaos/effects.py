"""The exactly-once scenarios: a one-time job writes one effect row per execution, inside
``ctx.transaction()`` (the effect commits with the slot's completion) and, for comparison, on
a connection of its own (committed at once); each execution is hit mid-block by a fault. After
the run the effects table is counted per slot, next to the ledger's starts.

``effects``: SIGSTOP past the dead window, SIGKILL, a partition of the holder, an outage of
every process, each mid-block, with and without ``ctx.transaction()``.
``effects-held-lock``: the holder is stopped between its completion statement and its COMMIT
(it holds the slot's row locked): the other process goes on, the server ends the stopped
transaction after the dead window (the commit guard), and the slot runs once elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.chaos.audit import Audit
from tests.chaos.cluster import Node
from tests.chaos.jobs import EFFECTS_TABLE, SETTLE
from tests.chaos.scenarios import Run, Scenario

__all__ = ["EFFECT_SCENARIOS", "create_effects_table", "effects_per_slot"]

_meta = MetaData()
effects = Table(
    EFFECTS_TABLE,
    _meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_instance", String(100), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", BigInteger, nullable=False),
)

_FAULTS = ("stop", "kill", "partition", "outage")


async def create_effects_table(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_meta.create_all)


async def effects_per_slot(engine: AsyncEngine) -> dict[str, int]:
    """How many effect rows each instance (each slot) left."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(effects.c.task_instance, func.count()).group_by(effects.c.task_instance)
        )
        return {str(instance): int(count) for instance, count in rows}


async def _wait_record(
    run: Run, instance: str, event: str, *, count: int = 1, timeout: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = run.records(SETTLE, instance, event)
        if len(found) >= count:
            return found[count - 1]
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{SETTLE}/{instance}: no {event!r} record in {timeout:g}s")


async def _wait_done(run: Run, instance: str, timeout: float = 60.0) -> None:
    """Until the one-time row is gone (its slot completed somewhere)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with run.engine.connect() as conn:
            left = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM scheduled_tasks WHERE task_name = :t "
                        "AND task_instance = :i"
                    ),
                    {"t": SETTLE, "i": instance},
                )
            ).scalar_one()
        if not left:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{SETTLE}/{instance} was not completed in {timeout:g}s")


async def _hit(run: Run, node: Node, fault: str) -> None:
    c = run.cluster
    dead = run.knobs.dead_after
    if fault == "stop":
        await c.stop(node, dead + 1.5)
    elif fault == "kill":
        await c.kill(node)
        await c.restart(node)
    elif fault == "partition":
        await c.partition([node], dead + 1.5)
    else:
        await c.partition(c.live(), dead * 0.75)


async def _effects(run: Run) -> None:
    c = run.cluster
    hold = run.knobs.dead_after + 1.0
    await c.start_plain("p1", extras=("settle",))
    await c.start_plain("p2", extras=("settle",))
    run.processes = "2 plain registry processes (p1, p2), both with the chaos-settle job"
    run.load = (
        f"{c.recurring} recurring jobs; chaos-settle instances that write one effect row and "
        f"hold {hold:g} s, inside ctx.transaction() (tx) or on their own connection (plain)"
    )
    run.begin = time.time()
    rounds = int(run.pick(1, 3))
    # the plain variant is the comparison (effects without ctx.transaction() may repeat):
    # only the long version runs it, the short one checks what is promised
    variants = ("tx",) if run.short else ("tx", "plain")
    instances = []
    for n in range(rounds):
        for fault in _FAULTS:
            for variant in variants:
                instance = f"{fault}-{variant}" + (f"-{n}" if rounds > 1 else "")
                instances.append(instance)
                await run.schedule(SETTLE, instance, hold=hold, tx=variant == "tx")
                held = await _wait_record(run, instance, "in-block")
                await asyncio.sleep(0.2)
                await _hit(run, run.node_of(held["pid"]), fault)
                await _wait_done(run, instance)
    await run.settle()
    await _note_effects(run, instances)


async def _note_effects(run: Run, instances: list[str]) -> None:
    counts = await effects_per_slot(run.engine)
    starts = {i: len(run.starts(SETTLE, i)) for i in instances}
    run.facts["effects"] = {i: counts.get(i, 0) for i in instances}
    run.facts["starts"] = starts
    run.notes.append(
        "effects per slot (starts): "
        + ", ".join(f"{i} {counts.get(i, 0)} ({starts[i]})" for i in instances)
    )


def _effects_checks(run: Run, audit: Audit) -> list[str]:
    problems = []
    effects_seen: dict[str, int] = run.facts.get("effects", {})
    starts: dict[str, int] = run.facts.get("starts", {})
    for instance, count in effects_seen.items():
        if "-tx" in instance and count != 1:
            problems.append(f"{instance}: {count} effects with ctx.transaction() (expected 1)")
    for instance, count in starts.items():
        if "-tx" in instance and count < 2:
            problems.append(f"{instance} ran {count} time(s): the fault did not hit mid-block")
    return problems


async def _held_lock(run: Run) -> None:
    c = run.cluster
    dead = run.knobs.dead_after
    await c.start_plain("p1", extras=("settle",))
    await c.start_plain("p2", extras=("settle",))
    run.processes = "2 plain registry processes (p1, p2), both with the chaos-settle job"
    run.load = (
        f"{c.recurring} recurring jobs; one chaos-settle instance whose process is stopped "
        "after its ctx.transaction() completion statement, before its COMMIT"
    )
    run.begin = time.time()
    instances = [f"held-tx-{n}" for n in range(int(run.pick(1, 3)))]
    for instance in instances:
        await run.schedule(SETTLE, instance, hold=0.0, tx=True, stop_at_commit=1.0)
        completing = await _wait_record(run, instance, "completing")
        node = run.node_of(completing["pid"])
        # Stopped for longer than the commit guard (the dead window): the server ends the
        # stopped transaction, the lock goes, and the other process revives and runs the slot.
        await c.stop(node, dead + 3.0)
        await _wait_done(run, instance)
    await run.settle()
    await _note_effects(run, instances)


EFFECT_SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "effects",
            "Effects inside ctx.transaction() (and without, for comparison), hit mid-block "
            "by a stop, a kill, a partition and an outage",
            10,
            _effects,
            _effects_checks,
        ),
        Scenario(
            "effects-held-lock",
            "A process stopped between its completion statement and its COMMIT",
            10,
            _held_lock,
            _effects_checks,
        ),
    )
}
