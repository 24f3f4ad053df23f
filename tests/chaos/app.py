"""An app node of the chaos harness: ``python -m tests.chaos.app --port N [...]`` serves the
example app (``python -m example_app``, same options) with the chaos ledger's observer
registered on its scheduler; the chaos jobs come by discovery (``EKBATAN_JOBS__MODULES``)."""

from __future__ import annotations

import sys

from ekbatan_fastapi import SchedulerBuilder


def main(argv: list[str] | None = None) -> int:
    # Imported here: it configures itself from CHAOS_* (ledger, watchdog).
    from example_app.__main__ import main as serve
    from tests.chaos import jobs as chaos_jobs

    observer = chaos_jobs.ledger_observer()

    def customize(b: SchedulerBuilder) -> None:
        if observer is not None:
            b.observer(observer)

    return serve(argv, customize=customize)


if __name__ == "__main__":
    sys.exit(main())
