"""``SchedulingTraces``: the caller's trace context, kept with the one-time tasks a client
schedules (``ekbatan_trace_context``, migration V0005), written in the same transaction as
their rows so that the two commit or roll back together (``ekbatan_fastapi.otel``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from ..store.dialects import Store
from ..store.external import Caller
from ..store.traces import TraceContext

__all__ = ["Carrier", "SchedulingTraces"]

Carrier = Callable[[], Mapping[str, str] | None]
"""The caller's context to keep with a scheduled task (W3C ``traceparent``/``tracestate``)."""


class SchedulingTraces:
    """What a client keeps of the scheduling trace (nothing without a ``carrier``)."""

    def __init__(self, store: Store, carrier: Carrier | None) -> None:
        self._store = store
        self._carrier = carrier

    async def contexts(self, keys: Sequence[tuple[str, str]]) -> list[TraceContext]:
        """The caller's trace context for each key being scheduled (none: no carrier, no
        active trace, or no ``ekbatan_trace_context`` table: migration V0005 not applied)."""
        if self._carrier is None:
            return []
        carrier = self._carrier()
        parent = carrier.get("traceparent") if carrier else None
        if not carrier or not parent or not await self._store.traces.look():
            return []
        state = carrier.get("tracestate")
        return [TraceContext(name, instance, parent, state) for name, instance in keys]

    @contextlib.asynccontextmanager
    async def transaction(
        self, connection: Any, wrap: Callable[[Any], Caller]
    ) -> AsyncIterator[Caller]:
        """The caller's ``connection`` (its transaction), or a transaction of our own."""
        if connection is not None:
            yield wrap(connection)
            return
        async with self._store.db.connect(begin=True) as conn:
            yield wrap(conn)

    async def save(
        self, caller: Caller, traced: list[TraceContext], created: Sequence[tuple[str, str]]
    ) -> None:
        """The contexts of the rows this transaction wrote (existing ones keep theirs)."""
        keys = set(created)
        mine = [c for c in traced if (c.task_name, c.task_instance) in keys]
        await self._store.traces.save_on(caller, mine)
