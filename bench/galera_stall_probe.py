"""What a Galera node kill does to a heartbeat and to a peer's dead-execution check (issue 31).

    .venv/bin/python bench/galera_stall_probe.py

A 3-node cluster (``bench/galera.py``); one picked row with a heartbeat. g3 is SIGKILLed; 0.1 s
later an owner on g2 heartbeats the row (``last_heartbeat = NOW(6)``, as the scheduler does),
and 1 s after the kill a peer on g1 finds the row's committed heartbeat older than a 0.8 s dead
window and unpicks it (a guarded ``UPDATE``, as a revival does), then once more if that failed
(as the write-conflict retry does). Prints when each statement was sent and answered, what it
answered, and the heartbeat value the owner's stalled statement stored.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncmy

from bench.galera import galera_cluster

DEAD_US = 800_000


async def _connect(port: int) -> Any:
    return await asyncmy.connect(host="127.0.0.1", port=port, user="root", database="test")


async def probe(ports: list[int], kill: Any) -> list[str]:
    g1, g2 = await _connect(ports[0]), await _connect(ports[1])
    async with g1.cursor() as c:
        await c.execute(
            "CREATE TABLE hb (id INT PRIMARY KEY, picked BOOL, last_heartbeat DATETIME(6),"
            " version INT)"
        )
        await c.execute("INSERT INTO hb VALUES (1, TRUE, NOW(6), 1)")
    await g1.commit()
    await asyncio.sleep(0.5)
    events: list[str] = []
    t0 = time.time()

    def at(what: str) -> None:
        events.append(f"+{time.time() - t0:6.3f} s  {what}")

    async def owner() -> None:
        await asyncio.sleep(0.1)
        at("owner (g2): heartbeat sent")
        try:
            async with g2.cursor() as c:
                await c.execute("UPDATE hb SET last_heartbeat = NOW(6) WHERE id = 1")
            await g2.commit()
            at("owner (g2): heartbeat committed")
        except Exception as error:
            at(f"owner (g2): heartbeat failed: {error}")

    async def revive(attempt: int) -> None:
        async with g1.cursor() as c:
            await c.execute(
                "SELECT UNIX_TIMESTAMP(NOW(6)) - UNIX_TIMESTAMP(last_heartbeat) FROM hb"
            )
            (age,) = await c.fetchone()
            at(f"peer (g1), attempt {attempt}: the committed heartbeat is {float(age):.3f} s old")
            at(f"peer (g1), attempt {attempt}: revival sent")
            await c.execute(
                "UPDATE hb SET picked = FALSE, version = version + 1 WHERE id = 1 AND picked "
                "AND last_heartbeat < NOW(6) - INTERVAL %s MICROSECOND",
                (DEAD_US,),
            )
            rows = c.rowcount
        await g1.commit()
        at(f"peer (g1), attempt {attempt}: revival committed, {rows} row(s) unpicked")

    at("SIGKILL g3")
    await asyncio.to_thread(kill)
    task = asyncio.create_task(owner())
    await asyncio.sleep(1.0)
    for attempt in (1, 2):
        try:
            await revive(attempt)
            break
        except Exception as error:
            at(f"peer (g1), attempt {attempt}: failed: {error}")
            await g1.rollback()
    await task
    async with g1.cursor() as c:
        await c.execute("SELECT picked, UNIX_TIMESTAMP(last_heartbeat), version FROM hb")
        picked, beat, version = await c.fetchone()
    at(
        f"row: picked={picked} version={version}; the heartbeat stored reads "
        f"+{float(beat) - t0:6.3f} s (when the owner's statement started)"
    )
    return events


def main() -> None:
    with galera_cluster() as cluster:
        ports = [n.port for n in cluster.nodes]
        print("\n".join(asyncio.run(probe(ports, lambda: cluster.kill(2)))))


if __name__ == "__main__":
    main()
