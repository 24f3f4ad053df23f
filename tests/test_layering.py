"""The structure holds: the core never imports FastAPI, no runtime import cycle. The layer
contract itself is ``lint-imports`` ([tool.importlinter] in pyproject.toml) and the complexity
gate is ruff's C901 ([tool.ruff.lint.mccabe]), which ``.ci/run`` runs beside mypy."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_core_does_not_import_fastapi() -> None:
    code = (
        "import sys, ekbatan_fastapi, ekbatan_fastapi.settings, ekbatan_fastapi.cli; "
        "assert 'fastapi' not in sys.modules and 'starlette' not in sys.modules; "
        "from ekbatan_fastapi import ekbatan_lifespan; assert 'fastapi' in sys.modules"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)


def test_no_runtime_import_cycle() -> None:
    graph = grimp.build_graph("ekbatan_fastapi", exclude_type_checking_imports=True)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            path = graph.find_shortest_chain(importer=imported, imported=module)
            if path is not None and imported != module:
                cycles.append(" -> ".join((module, *path)))
    assert cycles == []


def test_the_complexity_gate_is_ruffs_c901_at_15() -> None:
    """No cap on lines: ``ruff check`` (in ``.ci/run``) refuses a function whose McCabe
    complexity is above 15, everywhere it checks (docs/architecture.md, "Size and
    complexity")."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert "C901" in config["lint"]["select"]
    assert config["lint"]["mccabe"]["max-complexity"] == 15
    assert "ruff check ." in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
