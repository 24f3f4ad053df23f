"""The chaos scenarios of ``tests/chaos/run.py``, short versions: real scheduler processes (plain
registry processes and uvicorn processes of the example app) behind loopback proxies, real
faults (SIGKILL, SIGSTOP, cut or silent connections, a locked table, a blocked event loop,
SIGTERM, wrong clocks), and an audit of the ledger every execution wrote.

Each scenario checks that no slot was lost, that every slot run twice is explained by a
revival after a fault (or a release at shutdown), and its own promises (recovery times, the
answers of ``/jobs``). The long versions run by hand (``python -m tests.chaos all``); their
figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.servers import have_pg15, have_pgbouncer
from tests.chaos.run import DEPLOYMENTS, SCENARIOS, run_scenario

from .conftest import fresh_mysql_database

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]  # one worker, one by one


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_chaos_scenario_keeps_its_promises(
    name: str, database_url: str, tmp_path: Path
) -> None:
    result = await run_scenario(
        name, short=True, database_url=database_url, run_dir=tmp_path, verbose=False
    )
    assert result.ok, result.table


@pytest.mark.parametrize("name", [n for n in DEPLOYMENTS if n != "mariadb-orphan"])
async def test_deployment_scenario_keeps_its_promises(
    name: str, database_url: str, tmp_path: Path
) -> None:
    """PgBouncer's transaction pooling, a primary failover (stopped, frozen, fenced) and a claim
    answered late: the real components (``tests/chaos/deploy.py``)."""
    if name == "pgbouncer-transaction" and not have_pgbouncer():
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    if name in ("failover", "failover-frozen", "fence-read-only") and not have_pg15():
        pytest.skip("needs PostgreSQL 15's binaries in /usr/lib/postgresql/15/bin")
    result = await run_scenario(
        name, short=True, database_url=database_url, run_dir=tmp_path, verbose=False
    )
    assert result.ok, result.table


async def test_mariadb_orphan_scenario_keeps_its_promises(
    mysql_server_url: str, tmp_path: Path
) -> None:
    async with fresh_mysql_database(mysql_server_url) as url:
        result = await run_scenario(
            "mariadb-orphan", short=True, database_url=url, run_dir=tmp_path, verbose=False
        )
    assert result.ok, result.table
