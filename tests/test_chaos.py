"""The chaos scenarios of ``bench/chaos.py``, short versions: real scheduler processes (plain
registry processes and uvicorn processes of the example app) behind loopback proxies, real
faults (SIGKILL, SIGSTOP, cut or silent connections, a locked table, a blocked event loop,
SIGTERM, wrong clocks), and an audit of the ledger every execution wrote.

Each scenario checks that no slot was lost, that every slot run twice is explained by a
revival after a fault (or a release at shutdown), and its own promises (recovery times, the
answers of ``/jobs``). The long versions run by hand (``python bench/chaos.py all``); their
figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import SCENARIOS, run_scenario

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_chaos_scenario_keeps_its_promises(
    name: str, database_url: str, tmp_path: Path
) -> None:
    result = await run_scenario(
        name, short=True, database_url=database_url, run_dir=tmp_path, verbose=False
    )
    assert result.ok, result.table
