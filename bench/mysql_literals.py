"""Client CPU of writing values into MySQL/MariaDB statements: asyncmy's own escaping against
Ekbatan's mode-aware ``literals`` (docs/databases.md, "Every SQL mode"). No server: asyncmy's
``mogrify`` builds the statement text the driver would send, on an unconnected connection.

    .venv/bin/python bench/mysql_literals.py            # 20,000 rounds per figure, best of 5
    .venv/bin/python bench/mysql_literals.py --quick    # a smoke run

Prints, per value type, nanoseconds per value, and per statement shape (a claim's 100 key
pairs, its scalar parameters, one row of the task INSERT) microseconds per statement.
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from datetime import datetime
from typing import Any

from ekbatan_fastapi.store.mysql import literals

VALUES: dict[str, Any] = {
    "str": "job-00001",
    "bytes": b'{"a":1,"note":"some text here"}',
    "datetime": datetime(2026, 1, 1, 1, 1, 1, 123456),
    "bool": False,
    "int": 1,
    "None": None,
}
KEYS = tuple(v for i in range(100) for v in (f"job-{i:05d}", "recurring"))
SHAPES: dict[str, tuple[str, Any]] = {
    "100 key pairs": (", ".join(["(%s, %s)"] * 100), KEYS),
    "claim scalars": (
        "%(picked_by)s %(now)s %(limit)s",
        {"picked_by": "host-1234", "now": datetime(2026, 1, 1), "limit": 100},
    ),
    "one INSERT row": (
        "(%s,%s,%s,%s,%s,%s,%s)",
        ("job-1", "i-1", b'{"a":1}', datetime(2026, 1, 1), False, 1, 0),
    ),
}


def _best(fn: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


async def main(number: int, repeat: int) -> None:
    from asyncmy.connection import Connection

    make: Any = Connection
    plain, ours = make(host="127.0.0.1"), make(host="127.0.0.1")  # never connected
    literals.protect(ours)
    print(f"{'value':<16}{'asyncmy ns':>12}{'Ekbatan ns':>12}")
    for name, value in VALUES.items():
        a = _best(lambda v=value: plain.literal(v), number, repeat) * 1e9
        b = _best(lambda v=value: ours.literal(v), number, repeat) * 1e9
        print(f"{name:<16}{a:>12.0f}{b:>12.0f}")
    print(f"{'statement':<16}{'asyncmy us':>12}{'Ekbatan us':>12}")
    for name, (sql, args) in SHAPES.items():
        few = max(1, number // 20)
        a = _best(lambda q=sql, p=args: plain.cursor().mogrify(q, p), few, repeat) * 1e6
        b = _best(lambda q=sql, p=args: ours.cursor().mogrify(q, p), few, repeat) * 1e6
        print(f"{name:<16}{a:>12.1f}{b:>12.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    asyncio.run(main(200 if args.quick else 20_000, 1 if args.quick else 5))
