"""The core never imports FastAPI; only ``ekbatan_fastapi.integration`` does."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ekbatan_fastapi"


def test_importing_the_core_does_not_import_fastapi() -> None:
    code = (
        "import sys, ekbatan_fastapi, ekbatan_fastapi.settings; "
        "assert 'fastapi' not in sys.modules and 'starlette' not in sys.modules; "
        "from ekbatan_fastapi import ekbatan_lifespan; assert 'fastapi' in sys.modules"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)


def test_only_the_integration_package_imports_fastapi() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "integration" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            if any(n.split(".")[0] in ("fastapi", "starlette") for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
