"""The migrations ship inside the package (``ekbatan_fastapi/migrations``), so that
``ekbatan-jobs migrate`` finds them in a non-editable install; the repository's
``migrations/`` is a symlink to that folder, so the two can never differ."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.store.migrate import available_migrations

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ROOT / "ekbatan_fastapi" / "migrations"


def test_the_repository_folder_is_the_packaged_one() -> None:
    assert (ROOT / "migrations").is_symlink()
    assert (ROOT / "migrations").resolve() == PACKAGED.resolve()


@pytest.mark.parametrize(
    ("dialect", "folder"),
    [("postgresql", "postgresql"), ("mysql", "mysql"), ("mysql5", "mysql"), ("mariadb", "mysql")],
)
def test_every_dialect_has_its_migrations(dialect: str, folder: str) -> None:
    found = available_migrations(dialect)
    files = sorted(p.name for p in (PACKAGED / folder).glob("V*.sql"))
    assert [f"V{m.version:04d}__{m.description.replace(' ', '_')}.sql" for m in found] == files
    assert found[0].tables == ["scheduled_tasks"]
    assert found[1].tables == [
        "ekbatan_execution_history",
        "ekbatan_paused_tasks",
        "ekbatan_scheduler_instances",
    ]
    assert found[2].tables == ["ekbatan_jobs"]
    assert found[4].tables == ["ekbatan_trace_context"]
    with pytest.raises(ConfigurationError, match="dialect 'oracle' is not supported"):
        available_migrations("oracle")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_wheel_contains_the_migrations_and_the_console_script(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "ekbatan_fastapi", source / "ekbatan_fastapi", ignore=ignore)
    subprocess.run(
        # build isolation: pyproject's build-system (setuptools>=68), as `pip install .` does
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for folder in ("postgresql", "mysql"):
        for file in (PACKAGED / folder).glob("V*.sql"):
            assert f"ekbatan_fastapi/migrations/{folder}/{file.name}" in names
    assert "ekbatan-jobs = ekbatan_fastapi.cli:main" in scripts
