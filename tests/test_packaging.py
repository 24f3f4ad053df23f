"""What ``pip install ekbatan-fastapi`` gets: ``python -m build`` makes the sdist and, from it,
the wheel; the wheel installs into a fresh virtual environment and imports there (no checkout on
the path); ``example_app`` stays in the repository; httpx is no runtime dependency; the README
renders as the package's long description, as PyPI renders it (readme_renderer)."""

from __future__ import annotations

import email
import email.message
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from readme_renderer.markdown import render

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel of a copy of the checkout (the build writes egg-info beside
    the sources: not into the working tree)."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("ekbatan_fastapi", "example_app", "tests"):
        shutil.copytree(ROOT / folder, source / folder, ignore=IGNORE)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return base / "dist"


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("ekbatan_fastapi-*-py3-none-any.whl")
    return wheel


def _metadata(dist: Path) -> email.message.Message:
    with zipfile.ZipFile(_wheel(dist)) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_holds_the_library_and_not_the_example_app(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"ekbatan_fastapi", next(t for t in tops if t.endswith(".dist-info"))}
    for packaged in (
        "ekbatan_fastapi/py.typed",
        "ekbatan_fastapi/migrations/postgresql/V0001__create_scheduled_tasks.sql",
        "ekbatan_fastapi/migrations/mysql/V0004__ekbatan_task_name_index.sql",
        "ekbatan_fastapi/alembic.py",
    ):
        assert packaged in names
    assert any(n.startswith("ekbatan_fastapi/web/static/") for n in names)


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    (sdist,) = dist.glob("ekbatan_fastapi-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "PKG-INFO"} <= names
    assert "ekbatan_fastapi/migrations/mysql/V0003__ekbatan_jobs.sql" in names
    assert not any(name.startswith("example_app/") for name in names)


def test_runtime_dependencies_are_what_the_library_imports(dist: Path) -> None:
    requires = _metadata(dist).get_all("Requires-Dist") or []
    runtime = {r.split(">")[0].split("[")[0].strip().lower() for r in requires if "extra" not in r}
    # pydantic (typed task data, settings) and typing-extensions (TypeVar defaults) are
    # imported by the library itself, so they are declared, not left to fastapi's.
    assert runtime == {
        "fastapi",
        "sqlalchemy",
        "asyncpg",
        "pydantic-settings",
        "croniter",
        "pydantic",
        "typing-extensions",
        "httpx",
    }
    # httpx: the check-ins (ekbatan_fastapi/checkin.py), and only they, import it
    users = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "ekbatan_fastapi").rglob("*.py")
        if "import httpx" in p.read_text() or "from httpx" in p.read_text()
    ]
    assert users == ["ekbatan_fastapi/checkin.py"]


def test_the_readme_renders_as_the_long_description(dist: Path) -> None:
    metadata = _metadata(dist)
    assert metadata["Description-Content-Type"] == "text/markdown"
    description = metadata.get_payload()
    assert isinstance(description, str)
    assert description.strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    html = render(description)  # None when PyPI could not render it
    assert html is not None
    assert "<h1" in html and "ekbatan-fastapi" in html
    assert "example_app" in html and "<table>" in html


def test_the_wheel_installs_and_imports_in_a_fresh_environment(dist: Path, tmp_path: Path) -> None:
    """A fresh venv gets the wheel (no dependencies resolved: those of this test run are made
    visible by a .pth line, whose own .pth files, like the checkout's editable install, are not
    processed), then imports it from a directory outside the checkout."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (purelib / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(_wheel(dist))],
        capture_output=True, text=True, env=clean,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    check = (
        "import importlib.util, pathlib, sys\n"
        "import ekbatan_fastapi, ekbatan_fastapi.web, ekbatan_fastapi.alembic\n"
        "from ekbatan_fastapi.store.migrate import available_migrations\n"
        f"assert pathlib.Path(ekbatan_fastapi.__file__).is_relative_to({str(purelib)!r})\n"
        "assert importlib.util.find_spec('example_app') is None\n"
        "assert len(available_migrations('postgresql')) >= 4\n"
        "print(ekbatan_fastapi.__version__)\n"
    )
    imported = subprocess.run(
        [python, "-c", check], cwd=tmp_path, capture_output=True, text=True, env=clean
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == _metadata(dist)["Version"]
    cli = subprocess.run(
        [env_dir / "bin" / "ekbatan-jobs", "--help"], capture_output=True, text=True, env=clean
    )
    assert cli.returncode == 0 and "migrate" in cli.stdout, cli.stderr
