"""Keeps ``bench/db_limit_mysql.py`` (mysqlslap with our MySQL statements) working on MariaDB
(EKBATAN_TEST_MYSQL_URL); skipped without mysqlslap or the server."""

from __future__ import annotations

import shutil

import pytest

from bench import db_limit_mysql
from ekbatan_fastapi.store.mysql import statements as q

pytestmark = [
    pytest.mark.bench_smoke,
    pytest.mark.skipif(
        not (shutil.which("mariadb-slap") or shutil.which("mysqlslap")),
        reason="mysqlslap not installed (apt-get install mariadb-client)",
    ),
]


def test_script_is_built_from_the_statements_module() -> None:
    script = db_limit_mysql.build_script(50)
    locking = " ".join(q.lock_due_per_name("scheduled_tasks", "ekbatan_paused_tasks", 1).split())
    where = locking[locking.index(" FROM ") :].replace(":name_0", "'bench-noop'")
    assert script[2].endswith(where.replace(":limit", "50"))
    assert q.READ_COMMITTED in script
    assert script.count("COMMIT") == 2
    assert "WHERE (task_name, task_instance) IN '" in script[3]  # q.claim, keys spliced in


async def test_mysqlslap_drains_the_table(mysql_server_url: str) -> None:
    runs = await db_limit_mysql.measure(
        mysql_server_url, n=200, clients=(1, 2), repeat=1, verbose=False
    )
    assert [r.clients for r in runs] == [1, 2]
    for run in runs:
        assert run.error is None, run.error
        assert (run.rows_deleted, run.left) == (200, 0)
        assert run.rows_per_second and run.rows_per_second > 0
        assert run.per_batch["Com_commit"] >= 2  # two transactions per batch (others may add)
