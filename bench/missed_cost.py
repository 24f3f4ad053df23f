"""What recording missed slots (``record_missed_slots``) and the check-in observer
(``CheckIns``) cost: throughput of no-op one-time tasks and slot lag of recurring jobs, in
the same run, with and without each (issue 30).

    python bench/missed_cost.py                 # private PostgreSQL; about 6 minutes
    python bench/missed_cost.py --quick         # a smoke run
    python bench/missed_cost.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test

Variants, interleaved (repeat R times):

* ``default``: the library's defaults (missed slots recorded);
* ``no-missed``: ``record_missed_slots(False)``;
* ``checkins``: defaults plus a ``CheckIns`` observer for every job, pointed at a local
  HTTP stub (an asyncio server in this process on 127.0.0.1 answering 200 to everything): a
  ``/start`` ping and a success ping per execution.

Each variant runs, on the same server: bench/throughput.py's run (N due no-op one-time tasks,
K worker processes, lock-and-fetch; the check-in observer pings for every task) and two of
bench/slot_lag.py's runs (J jobs x 1 s, 2 processes, PT1S polling interval): one with every
slot on time (nothing missed: the common case), one whose runs last 1.5 periods (``--overlap``:
every run passes over a slot, named in the history when recording is on). The stub counts the
pings it answered. It is a benchmark, not a test: it prints, it never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from bench import common, slot_lag, throughput
except ImportError:  # run as a script: bench/ is on sys.path
    import common  # type: ignore[no-redef]
    import slot_lag  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

VARIANTS = ("default", "no-missed", "checkins")


class PingStub:
    """A plain asyncio HTTP/1.1 server answering ``200`` with an empty body (keep-alive)."""

    def __init__(self) -> None:
        self.answered = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/ping/bench"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                self.answered += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _variant(
    server: common.ServerInfo, variant: str, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    record = variant != "no-missed"
    checkin = url if variant == "checkins" else None
    options = throughput.BenchOptions(
        n=args.n,
        processes=(args.processes,),
        strategies=("lock-and-fetch",),
        repeat=1,
        retries=0,
        verbose=False,
        record_missed_slots=record,
        checkin_url=checkin,
    )
    runs, _ = await throughput.run_benchmark(options, server.url)
    rates = [r.rate for r in runs if r.ok and r.rate is not None]
    lags: dict[str, Any] = {}
    for overlap in (0.0, 1.5):
        run = await slot_lag.run_ours(
            server,
            processes=2,
            jobs=args.jobs,
            duration=args.duration,
            period=1.0,
            polling_interval=1.0,
            record_missed_slots=record,
            checkin_url=checkin,
            overlap=overlap,
        )
        lags["overlap" if overlap else "on-time"] = run.result
    return {"rate": rates[0] if rates else None, "lags": lags, "busy": runs[0].busy_during}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| variant | throughput (exec/s) | lag p50 / p99 ms, on time | lag p50 / p99 ms, "
        "runs of 1.5 periods | slots missed (1.5) |",
        "|---|---|---|---|---|",
    ]
    for variant, runs in results.items():
        rates = [r["rate"] for r in runs if r["rate"] is not None]
        rate = f"{statistics.median(rates):.0f}" if rates else "-"
        cells = []
        for kind in ("on-time", "overlap"):
            found = [r["lags"][kind] for r in runs if r["lags"].get(kind) is not None]
            p50 = (
                statistics.median(x.p50_ms for x in found if x.p50_ms is not None)
                if found
                else None
            )
            p99 = (
                statistics.median(x.p99_ms for x in found if x.p99_ms is not None)
                if found
                else None
            )
            cells.append(f"{_ms(p50)} / {_ms(p99)}")
        skipped = [r["lags"]["overlap"].skipped for r in runs if r["lags"].get("overlap")]
        lines.append(
            f"| {variant} | {rate} | {cells[0]} | {cells[1]} | "
            f"{statistics.median(skipped) if skipped else '-'} |"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> int:
    stub = PingStub()
    url = await stub.start()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        with common.private_postgres(args.url) as server:
            print(f"server: {server.kind}", flush=True)
            for repeat in range(1, args.repeat + 1):
                for variant in VARIANTS:
                    before = stub.answered
                    result = await _variant(server, variant, url, args)
                    result["pings"] = stub.answered - before
                    results[variant].append(result)
                    lags = result["lags"]
                    print(
                        f"repeat {repeat} {variant}: {_ms(result['rate'])} exec/s, lag p50 "
                        f"on time {_ms(lags['on-time'].p50_ms if lags['on-time'] else None)} "
                        f"ms, pings answered {result['pings']}",
                        flush=True,
                    )
    finally:
        await stub.stop()
    print(_table(results))
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.harness_parser(__doc__)
    p.add_argument("--n", type=int, default=5000, help="one-time tasks per throughput run")
    p.add_argument("-k", "--processes", type=int, default=2, help="throughput workers (2)")
    p.add_argument("--jobs", type=int, default=20, help="recurring jobs of the lag runs (20)")
    p.add_argument("--duration", type=float, default=20.0, help="lag window, seconds (20)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="N=1000, 5 jobs, 5 s, once")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.jobs, args.duration, args.repeat = 1000, 5, 5.0, 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(_main(_parse(argv)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
