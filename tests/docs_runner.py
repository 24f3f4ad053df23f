"""Run every Python code block of one documentation page, in order, as a reader would.

    python -m tests.docs_runner docs/tutorial.md      # EKBATAN_DATABASE_URL names the database

Used by tests/test_docs_examples.py, one process per page: a page's job classes, settings and
logging stay in its own process (the lifespan discovers every ``@distributed_job`` class
imported, so pages must not see each other's, nor the test modules').

The blocks of a page share one namespace, a module named ``app`` (the tutorial's file is
``app.py``), and one event loop: a block may ``await`` at top level, and what one block defines
the next can use. Sybil finds the blocks; the evaluator below compiles each with top-level
``await`` allowed.

Not run: code blocks in other languages (``bash``, ``yaml``, ``text``: shown, never executed),
and a ``python`` block right after ``<!-- skip: next "the reason" -->``, an opt-out that must
say why (another library's code on the migration pages, a file for a different process).
After the blocks, a page may have a check of its own here (``CHECKS``): the tutorial's app (and
the README's) is started and used, as the reader does with uvicorn.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import sys
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import SkipTest

from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent


class AwaitingEvaluator:
    """Sybil's Python evaluation, with top-level ``await`` run on the page's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, example: Example) -> None:
        source = pad(example.parsed, example.line + example.parsed.line_offset)
        code = compile(
            source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
        result = eval(code, example.namespace)
        if inspect.iscoroutine(result):
            self.loop.run_until_complete(result)


async def _wait_for(what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"the tutorial's app: {what} did not happen in {timeout} s")
        await asyncio.sleep(0.05)


async def check_tutorial(namespace: dict[str, Any]) -> None:
    """What the reader does with the running app: sign up, see the welcome sent once, see the
    recurring job's slots, each once."""
    import httpx
    from asgi_lifespan import LifespanManager
    from sqlalchemy import func, select

    app, engine = namespace["app"], namespace["engine"]
    signups, signup_stats = namespace["signups"], namespace["signup_stats"]
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            created = await http.post("/signups", params={"email": "ada@example.com"})
            assert created.status_code == 201, created.text
            signup_id = created.json()["id"]

            async def welcomed() -> bool:
                async with engine.connect() as conn:
                    query = select(signups.c.welcomed_at).where(signups.c.id == signup_id)
                    return (await conn.execute(query)).scalar_one() is not None

            async def counted() -> bool:
                async with engine.connect() as conn:
                    query = select(func.count()).select_from(signup_stats)
                    return bool((await conn.execute(query)).scalar_one())

            await _wait_for("the welcome", welcomed)
            await _wait_for("a count-signups slot", counted)
            stats = (await http.get("/stats")).json()
            assert stats["slots"] and stats["slots counted twice"] == 0, stats
            jobs = await http.get("/jobs")
            assert jobs.status_code == 200, jobs.text


async def check_readme(namespace: dict[str, Any]) -> None:
    """The README's app: a sign-up's welcome runs (the history records it)."""
    import httpx
    from asgi_lifespan import LifespanManager

    app = namespace["app"]
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answer = await http.post("/signups", params={"email": "ada@example.com"})
            assert answer.status_code == 200, answer.text
            client = app.state.ekbatan.client

            async def welcomed() -> bool:
                records = await client.history("send-welcome")
                return any(r.task_instance == "welcome-ada@example.com" for r in records)

            await _wait_for("the welcome", welcomed)
            assert (await http.get("/jobs")).status_code == 200


CHECKS: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
    "tutorial.md": check_tutorial,
    "README.md": check_readme,
}


def run(page: Path) -> int:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    sybil = Sybil(
        parsers=[
            CodeBlockParser(language="python", evaluator=AwaitingEvaluator(loop)),
            SkipParser(),
        ],
    )
    document = sybil.parse(page)
    module = types.ModuleType("app")
    module.__file__ = str(page)
    sys.modules["app"] = module
    document.namespace = module.__dict__
    ran = skipped = 0
    try:
        for example in document:
            if isinstance(example.region.evaluator, Skipper):
                action, reason = example.parsed
                if action == "next" and not (reason and reason.strip().startswith('"')):
                    raise SystemExit(
                        f'{page}, line {example.line}: write the reason: <!-- skip: next "why" -->'
                    )
            try:
                example.evaluate()
            except SkipTest as skip:
                skipped += 1
                print(f"line {example.line}: not run: {skip}")
                continue
            if not isinstance(example.region.evaluator, Skipper):
                ran += 1
        check = CHECKS.get(page.name)
        if check is not None:
            loop.run_until_complete(check(document.namespace))
    finally:
        engine = document.namespace.get("engine")
        if engine is not None and hasattr(engine, "dispose"):
            loop.run_until_complete(engine.dispose())
        loop.close()
    print(f"{page}: {ran} code blocks run, {skipped} not run")
    if ran == 0:
        raise SystemExit(f"{page}: no code block ran")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(run(Path(sys.argv[1])))
