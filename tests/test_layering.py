"""The structure holds: the core never imports FastAPI, no runtime import cycle, small modules
and functions. The layer contract itself is ``lint-imports`` ([tool.importlinter] in
pyproject.toml), which ``.ci/run`` runs beside ruff and mypy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parent.parent / "ekbatan_fastapi"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


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


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(PACKAGE))
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}: {node.name}() {lines} lines")
    assert too_long == []
