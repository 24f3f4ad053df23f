"""``StoreProbe``: a process-wide hook on what the stores write, for audits and benchmarks.

The scheduler's own events are ``SchedulerObserver``'s; a probe sees one level lower: every
poll and what it claimed, every batch of results the completer sent (and which of them the
database recorded, or that the statement failed and may have committed all the same), every
revival of dead executions, every ``ctx.transaction()`` completion, and every statement sent
to the driver directly, past SQLAlchemy (PostgreSQL's hot path; SQLAlchemy's
``before_cursor_execute`` event sees all the others). The benchmarks build on it:
``bench/chaos.py`` its ledger, ``bench/idle_cost.py`` its statement counts,
``bench/throughput.py`` and ``bench/slot_lag.py`` their poll and completion timings.
Probes are called inline on the event loop: keep them cheap, never block. An exception in a
probe propagates (a probe is test equipment).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..domain.rows import Finish, PollResult, TaskKey, TaskRow

__all__ = ["StoreProbe", "add_probe", "probes", "remove_probe"]


class StoreProbe:
    """Base class: every hook is a no-op; override the ones you need."""

    def statement(self, name: str, sql: str) -> None:
        """A statement ``name`` (``poll``, ``claim``, ``finish``, ``heartbeat``) is being sent
        to the driver directly, past SQLAlchemy."""

    def polled(self, result: PollResult, started: float, seconds: float) -> None:
        """A poll answered: sent at wall-clock time ``started`` (``time.time()``), it took
        ``seconds`` and claimed ``result.claimed``."""

    def finished(
        self,
        items: Sequence[Finish],
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        """A batch of results was written in ``seconds``: ``recorded`` holds the keys the
        database took. On ``error`` (``recorded`` None) the statement may still have
        committed."""

    def revived(self, rows: Sequence[TaskRow]) -> None:
        """Dead executions were revived (the rows as they were, ``picked_by`` the old owner)."""

    def transaction_completing(self, finish: Finish) -> None:
        """``ctx.transaction()`` wrote this slot's completion and is about to commit (the
        row is locked by the transaction until then). The chaos harness stops a process
        here."""

    def transaction_committed(self, finish: Finish) -> None:
        """``ctx.transaction()`` committed this slot's completion with its effects."""


class _Probes:
    """The registered probes; ``active`` is false when there are none (callers skip)."""

    def __init__(self) -> None:
        self._probes: tuple[StoreProbe, ...] = ()
        self.active = False

    def add(self, probe: StoreProbe) -> None:
        self._probes = (*self._probes, probe)
        self.active = True

    def remove(self, probe: StoreProbe) -> None:
        self._probes = tuple(p for p in self._probes if p is not probe)
        self.active = bool(self._probes)

    def statement(self, name: str, sql: str) -> None:
        for probe in self._probes:
            probe.statement(name, sql)

    def polled(self, result: PollResult, started: float, seconds: float) -> None:
        for probe in self._probes:
            probe.polled(result, started, seconds)

    def finished(
        self,
        items: Sequence[Finish],
        recorded: set[TaskKey] | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        for probe in self._probes:
            probe.finished(items, recorded, error, seconds)

    def revived(self, rows: Sequence[TaskRow]) -> None:
        for probe in self._probes:
            probe.revived(rows)

    def transaction_completing(self, finish: Finish) -> None:
        for probe in self._probes:
            probe.transaction_completing(finish)

    def transaction_committed(self, finish: Finish) -> None:
        for probe in self._probes:
            probe.transaction_committed(finish)


probes = _Probes()
"""The process's probes (the stores call them)."""


def add_probe(probe: StoreProbe) -> None:
    """Register ``probe`` for every store of this process."""
    if not isinstance(probe, StoreProbe):
        raise TypeError(f"add_probe takes a StoreProbe, got {probe!r}")
    probes.add(probe)


def remove_probe(probe: StoreProbe) -> None:
    probes.remove(probe)
