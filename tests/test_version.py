"""The version is written once (ekbatan_fastapi/domain/version.py): the package metadata,
``ekbatan_fastapi.__version__`` and CHANGELOG.md agree (CHANGELOG.md, "Version policy")."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import ekbatan_fastapi
from ekbatan_fastapi.domain.version import VERSION

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_the_installed_package_metadata() -> None:
    assert ekbatan_fastapi.__version__ == VERSION
    assert importlib.metadata.version("ekbatan-fastapi") == VERSION, (
        "the installed metadata is older than ekbatan_fastapi/domain/version.py: "
        'reinstall (pip install -e ".[dev]")'
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", VERSION)


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "ekbatan_fastapi.domain.version.VERSION"


def test_the_changelog_has_a_section_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## Version policy" in changelog
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - ", changelog, re.MULTILINE), (
        f"CHANGELOG.md has no '## [{VERSION}] - <date>' section"
    )
