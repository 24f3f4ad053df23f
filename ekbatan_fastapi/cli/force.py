"""``run-now --force`` on a paused task, from outside the application.

The CLI runs no job code, so some running instance has to claim the run: the pause is lifted,
the row made due now (a notification wakes PostgreSQL instances at once), and the pause is put
back, with its original who / when / why, as soon as the row's version shows a claim, or after
``--wait`` seconds when no instance claimed it. The pause is put back whatever happens,
including Ctrl-C.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from ..operations.models import PauseInfo
from .commands import EXIT, CliError, make_due

if TYPE_CHECKING:
    from .commands import Context

__all__ = ["forced_run"]

_POLL = 0.05


async def forced_run(ctx: Context, name: str, instance: str, pause: PauseInfo) -> str:
    """Let one instance claim ``name/instance`` while the task stays paused; who claimed it."""
    wait: float = ctx.args.wait
    await ctx.ops.resume(name)
    try:
        version = await make_due(ctx, name, instance)
        claimed_by = await _claimed(ctx, name, instance, version, wait)
    finally:
        await asyncio.shield(_restore(ctx, pause))
    if claimed_by is None:
        raise CliError(
            EXIT.FAILED,
            f"no instance claimed {name}/{instance} within {wait:g} s (is an application "
            "with this job running?); it stays paused, and due now: it runs when resumed",
        )
    return claimed_by


async def _claimed(ctx: Context, name: str, instance: str, version: int, wait: float) -> str | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while loop.time() < deadline:
        row = await ctx.repo.get(name, instance)
        if row is None:
            return "an instance (the run already finished)"  # a one-time instance is deleted
        if row.version != version:
            return row.picked_by or "an instance (the run already finished)"
        await asyncio.sleep(_POLL)
    return None


async def _restore(ctx: Context, pause: PauseInfo) -> None:
    values = {
        "task_name": pause.task_name,
        "paused_by": pause.paused_by,
        "paused_at": pause.paused_at,
        "reason": pause.reason,
    }
    try:
        async with ctx.repo.tx_engine.begin() as conn:
            await conn.execute(insert(ctx.ops.tables.paused).values(values))
    except IntegrityError:
        pass  # paused again meanwhile (by someone else): that pause stands
