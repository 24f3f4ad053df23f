"""Every Python code block of the tutorial, the how-to guides, the home page and the README
runs against the embedded PostgreSQL, one process per page (tests/docs_runner.py has the rules
and the opt-out)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from ekbatan_fastapi import create_schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDES = [
    "tutorial.md",
    *sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "how-to").glob("*.md")),
]
PAGES = [*(f"docs/{page}" for page in GUIDES), "docs/index.md", "README.md"]


def test_every_how_to_guide_is_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in GUIDES:
        assert f" {page}\n" in nav, f"{page} is not in mkdocs.yml's nav"


@pytest.mark.multiprocess  # a process per page: in the full matrix (.ci/run), not the fast set
@pytest.mark.parametrize("page", PAGES)
async def test_the_code_blocks_of_the_page_run(page: str, database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        await create_schema(engine)  # what `ekbatan-jobs migrate` does for the reader
    finally:
        await engine.dispose()
    env = {**os.environ, "EKBATAN_DATABASE_URL": database_url, "PYTHONWARNINGS": "error"}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.docs_runner", str(ROOT / page)),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    stdout, stderr = out.decode(), err.decode()
    assert process.returncode == 0, f"{page}:\n{stdout[-4000:]}\n{stderr[-6000:]}"
    assert "code blocks run" in stdout
