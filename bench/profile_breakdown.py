"""Where a throughput worker's CPU goes, per execution: a cProfile of its timed part
(``throughput.py --cprofile-dir DIR``) grouped into parts and scaled to the CPU per execution
the same harness measured without the profiler.

    python bench/throughput.py -k 1 --strategy lock-and-fetch --repeat 1 --cprofile-dir /tmp/cprof
    python bench/profile_breakdown.py /tmp/cprof --us-per-exec 29

The profiler itself slows every Python call, so its seconds are not the worker's; their
shares are what this prints (time waiting in ``epoll`` left out), times ``--us-per-exec``.
An estimate: cProfile charges the C work of asyncpg's protocol to the Python frame that called
it, and a run on a loaded machine charges waits for the CPU to whatever was running.
"""

from __future__ import annotations

import argparse
import collections
import pstats
import sys
from collections.abc import Sequence
from pathlib import Path

PARTS = (
    ("asyncpg array element checks (collections.abc isinstance)", ("<frozen abc>", "_abc")),
    ("asyncpg (encode, send, receive, decode)", ("asyncpg",)),
    ("asyncio (tasks, handles, the loop)", ("asyncio", "_asyncio", "create_task")),
    (
        "scheduler: launch and run (executor, execution, context, logs, running)",
        ("engine/executor", "engine/execution", "domain/context", "domain/logs", "engine/running"),
    ),
    ("scheduler: completer (records, batches)", ("engine/completer", "domain/records")),
    ("store (statement parameters, rows)", ("store/",)),
    ("scheduler: other (clock, link, poller, rows)", ("domain/", "engine/")),
    ("builtins (dict, list, isinstance, datetime, socket)", ("~",)),
)


def part_of(file: str, name: str) -> str | None:
    """The part a function belongs to (None: waiting in ``epoll``)."""
    if "epoll" in name:
        return None
    for part, markers in PARTS:
        if any(m in file or m in name for m in markers):
            return part
    return "other"


def breakdown(files: Sequence[Path], us_per_exec: float) -> tuple[list[tuple[str, float]], float]:
    """(part, microseconds per execution) by size, and the profiled busy seconds."""
    stats = pstats.Stats(*(str(f) for f in files)).stats  # type: ignore[attr-defined]
    by_part: collections.Counter[str] = collections.Counter()
    for (file, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        part = part_of(file, name)
        if part is not None:
            by_part[part] += tottime
    busy = sum(by_part.values())
    if busy <= 0:
        return [], 0.0
    return [(p, t / busy * us_per_exec) for p, t in by_part.most_common()], busy


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("profiles", type=Path, help="a .pstats file or a folder of them")
    p.add_argument("--us-per-exec", type=float, required=True, help="measured without profiler")
    args = p.parse_args(argv)
    path: Path = args.profiles
    files = sorted(path.glob("*.pstats")) if path.is_dir() else [path]
    if not files:
        print(f"no .pstats files in {path}", file=sys.stderr)
        return 2
    parts, busy = breakdown(files, args.us_per_exec)
    print(f"profiled busy time {busy:.3f} s, {len(files)} file(s), scaled to {args.us_per_exec} us")
    print("| part | us per execution |")
    print("| --- | ---: |")
    for part, us in parts:
        print(f"| {part} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
