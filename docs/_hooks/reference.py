"""The generated parts of the documentation site (a MkDocs hook, ``hooks:`` in mkdocs.yml).

A page holds a marker on a line of its own; at build time it is replaced by Markdown made from
the library itself, so the reference cannot drift from the code:

* ``<!-- ekbatan:api -->`` and ``<!-- ekbatan:testing-api -->``: a mkdocstrings entry for every
  name of ``ekbatan_fastapi.__all__`` (grouped; a name no group lists lands in "Other", so
  none is ever left out) and of ``ekbatan_fastapi.testing.__all__``;
* ``<!-- ekbatan:settings -->``: every setting of ``EkbatanSettings``, walked from the pydantic
  model, with its YAML key, environment variable, type, default, bounds and meaning (the
  field's attribute docstring, read by griffe, mkdocstrings' own reader);
* ``<!-- ekbatan:cli -->``: ``ekbatan-jobs --help`` and each command's help, from its argparse
  parser;
* ``<!-- ekbatan:http -->``: the HTTP routes (``create_jobs_router`` with an admin dependency,
  and ``metrics_router``) from the OpenAPI schema FastAPI generates for them.

``python docs/_hooks/reference.py settings|cli|http`` prints one part.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_origin

MARKERS = {
    "<!-- ekbatan:api -->": "api",
    "<!-- ekbatan:testing-api -->": "testing-api",
    "<!-- ekbatan:settings -->": "settings",
    "<!-- ekbatan:cli -->": "cli",
    "<!-- ekbatan:http -->": "http",
}


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """MkDocs' hook: each marker line replaced by its generated Markdown, and links to the
    repository's files outside docs/ shown as their paths."""
    for marker, part in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate(part))
    markdown = _README_SECTION.sub(lambda m: readme_section(m["title"]), markdown)
    return repository_links(markdown, Path(page.file.abs_src_path), Path(config["docs_dir"]))


_README_SECTION = re.compile(r"<!-- ekbatan:readme-section (?P<title>[^>]+?) -->")


def readme_section(title: str) -> str:
    """The README's section ``## title`` (without its heading), its links made relative to
    docs/, so that the front page and the site's home say the same."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    parts = re.split(r"(?m)^## ", readme)
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        if heading.strip() == title:
            body = body.replace("](docs/", "](").replace("](SECURITY.md)", "](security.md)")
            return body.replace("](CHANGELOG.md)", "](changelog.md)").strip()
    raise SystemExit(f"docs: README.md has no section '## {title}'")


_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")


def repository_links(markdown: str, page: Path, docs_dir: Path) -> str:
    """A link to a file of the repository outside docs/ (``../bench/README.md``: it works on
    GitHub) becomes its path in the site, which has no such page; one to a missing file stops
    the build."""
    root = docs_dir.resolve().parent

    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("/", "mailto:")):
            return match[0]
        resolved = (page.parent / target).resolve()
        if resolved.is_relative_to(docs_dir.resolve()):
            return match[0]  # MkDocs checks these itself
        if not resolved.is_relative_to(root) or not resolved.exists():
            raise SystemExit(f"docs: {page.name} links to {target}, which does not exist")
        path = resolved.relative_to(root).as_posix()
        text = match["text"]
        if text.strip("`") in (path, path.rstrip("/") + "/") or text.strip("`").endswith(path):
            return f"`{path}`"
        return f"{text} (`{path}` in the repository)"

    return _LINK.sub(replace, markdown)


@cache
def generate(part: str) -> str:
    return {
        "api": api_markdown,
        "testing-api": testing_api_markdown,
        "settings": settings_markdown,
        "cli": cli_markdown,
        "http": http_markdown,
    }[part]()


# --- public API -------------------------------------------------------------------------------

API_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "FastAPI integration",
        (
            "ekbatan_lifespan",
            "create_ekbatan_lifespan",
            "EkbatanLifespan",
            "jobs_router",
            "create_jobs_router",
            "metrics_router",
            "create_metrics_router",
            "get_scheduler_client",
            "get_ekbatan",
            "get_ekbatan_settings",
            "EkbatanState",
            "EkbatanSettings",
            "JobsReport",
            "build_registry",
        ),
    ),
    (
        "Jobs",
        (
            "DistributedJob",
            "OneTimeJob",
            "Job",
            "distributed_job",
            "RECURRING_INSTANCE",
            "ExecutionContext",
            "HeartbeatState",
        ),
    ),
    ("Schedules", ("Schedules", "Schedule", "Jittered", "parse_schedule", "CatchUp")),
    ("Failures and retries", ("FailureHandler", "RetryLater", "ExponentialBackoff", "MaxRetries")),
    (
        "The client",
        (
            "SchedulerClient",
            "ScheduledTask",
            "BackfillResult",
            "ExecutionRecord",
            "Outcome",
            "PauseInfo",
            "InstanceInfo",
        ),
    ),
    (
        "Without FastAPI: the registry",
        (
            "job_registry",
            "JobRegistryBuilder",
            "SchedulerBuilder",
            "JobRegistry",
            "ConnectionProvider",
            "PollingStrategy",
            "Scheduler",
            "SchedulerConfig",
        ),
    ),
    ("The tables", ("create_schema", "metadata", "scheduled_tasks", "try_cluster_lock")),
    (
        "Observing",
        (
            "SchedulerObserver",
            "ExecutionFinished",
            "SchedulerStatus",
            "ExecutionStatus",
            "TaskLogFilter",
        ),
    ),
    ("Clocks", ("Clock", "SystemClock", "OffsetClock")),
)


def _entries(module: str, names: list[str]) -> list[str]:
    return [f"::: {module}.{name}\n" for name in names]


def api_markdown() -> str:
    import ekbatan_fastapi

    public = list(ekbatan_fastapi.__all__)
    listed = {name for _, names in API_GROUPS for name in names}
    unknown = listed - set(public)
    if unknown:
        raise SystemExit(f"docs: API_GROUPS lists names ekbatan_fastapi does not export: {unknown}")
    errors = [
        n
        for n in public
        if isinstance(getattr(ekbatan_fastapi, n), type)
        and issubclass(getattr(ekbatan_fastapi, n), BaseException)
    ]
    groups = [*API_GROUPS, ("Errors", tuple(errors))]
    grouped = {name for _, names in groups for name in names}
    other = tuple(n for n in public if n not in grouped)
    if other:
        groups.append(("Other", other))
    out: list[str] = []
    for title, names in groups:
        out += [f"## {title}", "", *_entries("ekbatan_fastapi", list(names))]
    return "\n".join(out)


def testing_api_markdown() -> str:
    import ekbatan_fastapi.testing

    names = [
        n
        for n in ekbatan_fastapi.testing.__all__
        if n not in {"ExecutionContext", "HeartbeatState"}
    ]
    return "\n".join(
        [*_entries("ekbatan_fastapi.testing", names), "::: ekbatan_fastapi.testing.pytest_plugin\n"]
    )


# --- settings ---------------------------------------------------------------------------------


def _docstrings(model: type) -> dict[str, str]:
    """The attribute docstrings of a pydantic model's fields (griffe reads the source)."""
    import griffe

    module = griffe.load(model.__module__, resolve_aliases=False)
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls.__module__ != model.__module__ or cls.__qualname__ not in module.members:
            continue
        for name, member in module[cls.__qualname__].members.items():
            if member.docstring is not None:
                found[name] = " ".join(member.docstring.value.split())
    return found


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    from pydantic import SecretStr

    origin = get_origin(annotation)
    args = [a for a in get_args(annotation) if a is not type(None)]
    if origin is not None and type(None) in get_args(annotation) and len(args) == 1:
        return _type_name(args[0])
    if get_origin(annotation) is not None and hasattr(annotation, "__metadata__"):
        return _type_name(get_args(annotation)[0])
    if annotation is timedelta:
        return "ISO-8601 duration"
    if annotation is SecretStr:
        return "secret text"
    if origin is list:
        return "list (comma-separated or JSON in the environment)"
    if isinstance(annotation, type):
        return {"str": "text", "int": "integer", "bool": "true / false"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    from ekbatan_fastapi.domain.durations import format_iso_duration

    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined or value is None:
        return "(none)"
    if isinstance(value, timedelta):
        return f"`{format_iso_duration(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | dict) and not value:
        return "(empty)"
    return f"`{value}`"


def _bounds(name: str, field: Any, durations: dict[str, Any]) -> str:
    from ekbatan_fastapi.domain.durations import format_iso_duration

    if name in durations:
        low, high = durations[name][:2]
        return f"`{format_iso_duration(low)}` to `{format_iso_duration(high)}`"
    low = high = None
    for item in field.metadata:
        low = getattr(item, "ge", low)
        high = getattr(item, "le", high)
    if low is not None and high is not None:
        return f"{low} to {high}"
    if low is not None:
        return f"at least {low}"
    return ""


def _rows(
    model: type, key: str, env: str, durations: dict[str, Any]
) -> Iterator[tuple[str, str, str, str, str, str]]:
    """One row per leaf setting of ``model`` (nested sections recursed)."""
    from pydantic import BaseModel

    from ekbatan_fastapi.settings.keys import display_key
    from ekbatan_fastapi.settings.model import JOBS_SLOT

    docs = _docstrings(model)
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        annotation = field.annotation
        inner = annotation
        while get_origin(inner) in (dict, list):
            inner = get_args(inner)[-1]
        sep = "" if env.endswith("_") else "__"  # the prefix ends with its own "_"
        child_key, child_env = f"{key}.{display_key(name)}", f"{env}{sep}{name.upper()}"
        if (
            get_origin(annotation) is list
            and isinstance(inner, type)
            and issubclass(inner, BaseModel)
        ):
            yield from _rows(inner, f"{child_key}[0]", f"{child_env}__0", durations)
            continue
        if (
            get_origin(annotation) is dict
            and isinstance(inner, type)
            and issubclass(inner, BaseModel)
        ):
            if name == "configs":
                slot_key, slot_env = display_key(JOBS_SLOT), JOBS_SLOT.upper()
            else:
                slot_key, slot_env = "<job>", "<JOB>"
            yield from _rows(inner, f"{child_key}.{slot_key}", f"{child_env}__{slot_env}", {})
            continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _rows(annotation, child_key, child_env, durations)
            continue
        meaning = docs.get(name)
        if not meaning:
            raise SystemExit(
                f"docs: the setting {child_key} ({model.__qualname__}.{name}) has no "
                "docstring; add one under the field (its meaning, for the settings reference)"
            )
        yield (
            f"`{child_key.removeprefix('ekbatan.')}`",
            f"`{child_env}`",
            _type_name(annotation),
            _default(field),
            _bounds(name, field, durations),
            _rst_to_md(meaning),
        )


def _bounds_text(shortest: str | None, longest: str | None) -> str:
    if shortest is not None and longest is not None:
        return f"from `{shortest}` to `{longest}`"
    if shortest is not None:
        return f"at least `{shortest}`"
    if longest is not None:
        return f"at most `{longest}`"
    return ""


def settings_markdown() -> str:
    """``settings_reference()`` (every setting of ``SchedulerConfig`` and the overrides: the
    library's own list) and the jobs database's slot (``DataSourceConfig``'s fields)."""
    from ekbatan_fastapi.settings import settings_reference
    from ekbatan_fastapi.settings.datasource import DataSourceConfig
    from ekbatan_fastapi.settings.keys import display_key
    from ekbatan_fastapi.settings.model import JOBS_SLOT
    from ekbatan_fastapi.settings.sources import CONFIG_FILE_ENV, DATABASE_URL_ENV, JOBS_SLOT_ENV

    Entry = tuple[str, str, str, str, str, str]  # key, environment, type, default, bounds, meaning
    scheduler: list[Entry] = []
    per_job: list[Entry] = []
    builder_only: list[Entry] = []
    for row in settings_reference():
        bounds = _bounds_text(row.shortest, row.longest)
        meaning = _rst_to_md(row.description).replace("\\|", "|")
        if not row.builder:
            meaning += " (the FastAPI integration's; not a builder method)"
        if row.key is None:
            builder_only.append(
                (f"`b.{row.name}(...)`", "", row.type, f"`{row.default}`", bounds, meaning)
            )
            continue
        entry = (
            f"`jobs.{row.key}`",
            f"`{row.environment}`",
            row.type,
            f"`{row.default}`",
            bounds,
            meaning,
        )
        (per_job if row.key.startswith("overrides.") else scheduler).append(entry)
    slot_key = f"ekbatan.sharding.groups[0].members[0].configs.{display_key(JOBS_SLOT)}"
    database: list[Entry] = list(_rows(DataSourceConfig, slot_key, JOBS_SLOT_ENV, {}))
    listed = scheduler + database + per_job
    lines = [
        "| key (`ekbatan.`) | environment | default |",
        "| --- | --- | --- |",
        *(
            f"| [{key}](#{_anchor(key)}) | {var} | {default} |"
            for key, var, _, default, _, _ in listed
        ),
        "",
        f"`{DATABASE_URL_ENV}` is the short name of `{JOBS_SLOT_ENV}__URL` (set either, or both "
        f"to the same URL). `{CONFIG_FILE_ENV}` names a YAML file with the same keys under "
        "`ekbatan:` (needs the `yaml` extra). `<job>` is a job's name, spelled like any key "
        "(`nightly-export` = `NIGHTLY_EXPORT`). Every setting of the scheduler is also a method "
        "of the builder by its name (`customize_scheduler(lambda b: b.claim_ahead(...))`).",
    ]
    for title, entries in (
        ("The scheduler: `ekbatan.jobs`", scheduler),
        ("The jobs database: the `jobs-config` slot", database),
        ("Per job: `ekbatan.jobs.overrides.<job>`", per_job),
        ("The builder's own (`customize_scheduler`, no key in the settings)", builder_only),
    ):
        lines += ["", f"## {title}"]
        for key, var, kind, default, bounds, meaning in entries:
            facts = ([f"environment {var}"] if var else []) + [kind, f"default {default}"]
            if bounds:
                facts.append(bounds)
            lines += ["", f"### {key} {{ #{_anchor(key)} }}", "", " · ".join(facts), "", meaning]
    return "\n".join(lines)


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", key.strip("`").lower()).strip("-")


# --- CLI --------------------------------------------------------------------------------------


def cli_markdown() -> str:
    import argparse

    from ekbatan_fastapi.cli.args import parser

    main = parser()
    main.formatter_class = argparse.RawDescriptionHelpFormatter
    parts = ["## `ekbatan-jobs`", "", "```text", _help(main), "```"]
    for action in main._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += ["", f"## `ekbatan-jobs {name}`", "", "```text", _help(sub), "```"]
    return "\n".join(parts)


def _help(parser: Any) -> str:
    import os

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    try:
        return str(parser.format_help()).rstrip()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


# --- HTTP -------------------------------------------------------------------------------------


def _routers() -> list[Any]:
    from ekbatan_fastapi import create_jobs_router, metrics_router

    def require_admin() -> str:
        """Your authorization dependency (it raises HTTPException 401/403 to refuse)."""
        return "admin"

    return [create_jobs_router(admin_dependency=require_admin), metrics_router]


def _schema() -> dict[str, Any]:
    from fastapi import FastAPI

    app = FastAPI(title="ekbatan-fastapi routes")
    for router in _routers():
        app.include_router(router)
    return app.openapi()


def _unlisted_routes() -> list[str]:
    """The routes the OpenAPI schema leaves out (the dashboard's page, ``/metrics``)."""
    out: list[str] = []
    for router in _routers():
        for route in router.routes:
            if getattr(route, "include_in_schema", True):
                continue
            methods = ", ".join(sorted(getattr(route, "methods", None) or {"GET"}))
            doc = route.description or (route.endpoint.__doc__ or "")
            out += [
                "",
                f"## `{methods} {route.path}`",
                "",
                " ".join(doc.split()).replace("``", "`"),
            ]
    return out


def _ref_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array":
        return f"list of {_ref_name(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_ref_name(s) for s in schema["anyOf"])
    return f"`{schema.get('type', 'any')}`"


def http_markdown() -> str:
    schema = _schema()
    out: list[str] = []
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            out += ["", f"## `{method.upper()} {path}`", ""]
            description = op.get("description") or op.get("summary") or ""
            if description:
                out += [_rst_to_md(description).replace("\\|", "|"), ""]
            params = op.get("parameters", [])
            if params:
                out += [
                    "| parameter | in | type | required | meaning |",
                    "| --- | --- | --- | --- | --- |",
                ]
                for p in params:
                    meaning = " ".join(str(p.get("description", "")).split())
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_ref_name(p.get('schema', {}))} | "
                        f"{'yes' if p.get('required') else 'no'} | {_rst_to_md(meaning)} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out += [f"Request body ({media}): {_ref_name(content.get('schema', {}))}", ""]
            out += ["| status | meaning | body |", "| --- | --- | --- |"]
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                shown = ", ".join(
                    f"{_ref_name(c.get('schema', {}))} ({m})" for m, c in content.items()
                )
                meaning = " ".join(str(response.get("description", "")).split())
                out.append(f"| {status} | {_rst_to_md(meaning)} | {shown} |")
    unlisted = _unlisted_routes()
    if unlisted:
        out += ["", "## Outside the OpenAPI schema", "", "Served, but not in `/openapi.json`:"]
        out += [
            line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in unlisted
        ]
    out += ["", "## Schemas", ""]
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        out += [f"### `{name}` {{ #{name.lower()} }}", ""]
        doc = " ".join(str(component.get("description", "")).split())
        if doc:
            out += [_rst_to_md(doc), ""]
        props = component.get("properties", {})
        if props:
            required = set(component.get("required", []))
            out += ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
            for field, spec in props.items():
                meaning = " ".join(str(spec.get("description", "")).split())
                out.append(
                    f"| `{field}` | {_ref_name(spec)} | {'yes' if field in required else 'no'} "
                    f"| {_rst_to_md(meaning)} |"
                )
            out.append("")
        elif "enum" in component:
            out += ["One of: " + ", ".join(f"`{v}`" for v in component["enum"]), ""]
    return "\n".join(out).strip() + "\n"


if __name__ == "__main__":
    print(generate(sys.argv[1] if len(sys.argv) > 1 else "settings"))
