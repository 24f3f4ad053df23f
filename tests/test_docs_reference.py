"""The site's generated reference (docs/_hooks/reference.py, run by ``mkdocs build``) covers
what the code has: every setting with its environment variable, every CLI command, every HTTP
route, every exported name. ``mkdocs build --strict`` (in .ci/run) checks the links."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

import ekbatan_fastapi
from ekbatan_fastapi.settings import EkbatanSettings, settings_reference
from ekbatan_fastapi.settings.datasource import DataSourceConfig
from ekbatan_fastapi.settings.model import JobOverrideSettings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs/_hooks/reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_reference"] = module
    spec.loader.exec_module(module)
    return module


def test_every_setting_is_in_the_settings_reference(hook: ModuleType) -> None:
    text = hook.settings_markdown()
    jobs = EkbatanSettings.model_fields["jobs"].annotation
    assert isinstance(jobs, type) and issubclass(jobs, BaseModel)
    names = [f"EKBATAN_JOBS__{name.upper()}" for name in jobs.model_fields if name != "overrides"]
    slot = "EKBATAN_SHARDING__GROUPS__0__MEMBERS__0__CONFIGS__JOBS_CONFIG"
    names += [f"{slot}__{name.upper()}" for name in DataSourceConfig.model_fields]
    names += [
        f"EKBATAN_JOBS__OVERRIDES__<JOB>__{n.upper()}" for n in JobOverrideSettings.model_fields
    ]
    assert "EKBATAN_JOBS__POLLING_INTERVAL" in names
    for env in names:
        assert f"`{env}`" in text, f"{env} is missing from the settings reference"
    for env in ("EKBATAN_DATABASE_URL", "EKBATAN_CONFIG_FILE"):
        assert env in text
    for row in settings_reference():  # the library's own list, builder-only settings too
        assert (f"`jobs.{row.key}`" if row.key else f"`b.{row.name}(...)`") in text
    facts = "environment `EKBATAN_JOBS__POLLING_INTERVAL` · duration (ISO-8601) · default `PT10S`"
    assert facts in text


def test_every_cli_command_is_in_the_cli_reference(hook: ModuleType) -> None:
    import argparse

    from ekbatan_fastapi.cli.args import parser

    text = hook.cli_markdown()
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in commands.choices:
        assert f"## `ekbatan-jobs {name}`" in text
        assert f"usage: ekbatan-jobs {name}" in text


def test_every_route_is_in_the_http_reference(hook: ModuleType) -> None:
    text = hook.http_markdown()
    for path, operations in hook._schema()["paths"].items():
        for method in operations:
            assert f"## `{method.upper()} {path}`" in text
    assert "## `GET /jobs`" in text and "## `POST /jobs/{name}/pause`" in text


def test_every_exported_name_is_in_the_api_reference(hook: ModuleType) -> None:
    text = hook.api_markdown()
    for name in ekbatan_fastapi.__all__:
        assert f"::: ekbatan_fastapi.{name}\n" in text
    testing = hook.testing_api_markdown()
    assert "::: ekbatan_fastapi.testing.run_job" in testing


def test_a_setting_without_a_docstring_stops_the_build(hook: ModuleType) -> None:
    class Undocumented(BaseModel):
        knob: int = 1

    with pytest.raises(SystemExit, match="has no docstring"):
        list(hook._rows(Undocumented, "ekbatan.x", "EKBATAN_X", {}))


def test_the_home_page_shows_the_readmes_comparison(hook: ModuleType) -> None:
    section = hook.readme_section("How it compares")
    assert "| **ekbatan-fastapi** |" in section and "](docs/" not in section
    assert "<!-- ekbatan:readme-section How it compares -->" in (ROOT / "docs/index.md").read_text()
    with pytest.raises(SystemExit, match="no section"):
        hook.readme_section("No such section")


def test_every_page_under_docs_is_in_the_sites_nav() -> None:
    """``mkdocs build --strict`` (.ci/run) refuses a page left out of the nav; this says so
    in the suite, early, naming the page."""
    nav = (ROOT / "mkdocs.yml").read_text()
    docs = ROOT / "docs"
    for page in sorted(docs.rglob("*.md")):
        name = page.relative_to(docs).as_posix()
        if not name.startswith("_"):
            assert f" {name}\n" in nav, f"docs/{name} is not in mkdocs.yml's nav: add it"
