"""The example application: the app's own resources composed with ekbatan's lifespan."""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import APIKeyHeader, HTTPBasic, HTTPBasicCredentials
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ConnectionProvider, SchedulerBuilder, SchedulerClient, create_schema
from ekbatan_fastapi.settings import EkbatanSettings
from ekbatan_fastapi.web import (
    EkbatanState,
    create_ekbatan_lifespan,
    create_jobs_router,
    get_ekbatan,
    get_scheduler_client,
    install_exception_handlers,
)

from .config import ExampleSettings, get_example_settings
from .jobs import Note
from .services import DemoLedger, app_database_url, demo_metadata

log = logging.getLogger(__name__)


async def _create_tables(engine: AsyncEngine, *, jobs: bool) -> None:
    if jobs:
        await create_schema(engine)
    else:
        async with engine.begin() as conn:
            await conn.run_sync(demo_metadata.create_all)


async def prepare_database(engine: AsyncEngine, *, jobs: bool) -> None:
    """Create ``scheduled_tasks`` (``jobs=True``) or ``demo_runs`` if missing: the example's
    "migration". Two instances starting together may both try; the loser's error is retried
    and then finds the table there. If the database stays unreachable, the app starts anyway
    and ``/jobs`` tells what is wrong.
    """
    for attempt in range(5):
        try:
            await _create_tables(engine, jobs=jobs)
            return
        except (DBAPIError, OSError) as error:
            if attempt == 4:
                log.error("could not prepare the database; see /jobs: %s", error)
                return
            await asyncio.sleep(0.2 * (attempt + 1))


@asynccontextmanager
async def app_resources(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
    """The application's own lifespan: opens before the jobs start, closes after they stop."""
    settings = EkbatanSettings()
    # Built as the library builds its own pool, so that the app's engine works where the
    # jobs' does: behind PgBouncer's transaction pooling (EKBATAN_JOBS__POOLER), a multi-host
    # URL with a connect timeout per host, MySQL/MariaDB's session bounds.
    pooler = settings.jobs.pooler
    jobs_pool = ConnectionProvider.from_url(
        settings.jobs_datasource().sqlalchemy_url(), pool_size=1, pooler=pooler
    )
    try:
        await prepare_database(jobs_pool.engine, jobs=True)
    finally:
        await jobs_pool.dispose()
    pool = ConnectionProvider.from_url(app_database_url(settings), pool_size=2, pooler=pooler)
    await prepare_database(pool.engine, jobs=False)
    try:
        yield {"db": pool.engine}
    finally:
        await pool.dispose()


basic_auth = HTTPBasic(auto_error=False, realm="ekbatan-fastapi example")
# Declared as a security scheme (not a plain header), so the OpenAPI schema says that either
# one authorizes an admin route.
token_header = APIKeyHeader(name="X-Admin-Token", auto_error=False)


def _same(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())


def require_admin(
    settings: Annotated[ExampleSettings, Depends(get_example_settings)],
    x_admin_token: Annotated[str | None, Depends(token_header)],
    credentials: Annotated[HTTPBasicCredentials | None, Depends(basic_auth)],
) -> str:
    """The authorization dependency that mounts and guards the admin routes: the
    ``X-Admin-Token`` header (scripts), or HTTP basic auth with the token as password (the
    dashboard in a browser). Returns who acts; it is recorded as ``paused_by``."""
    expected = settings.admin_token.get_secret_value() if settings.admin_token else None
    if expected is None:
        raise HTTPException(403, detail="admin routes are disabled: set EXAMPLE_ADMIN_TOKEN")
    if x_admin_token is not None and _same(x_admin_token, expected):
        return "admin (token)"
    if credentials is not None and _same(credentials.password, expected):
        return credentials.username or "admin"
    raise HTTPException(
        401,
        detail="send the X-Admin-Token header, or sign in with any user and the token as password",
        headers={"WWW-Authenticate": 'Basic realm="ekbatan-fastapi example"'},
    )


def create_app(
    *,
    scheduler_name: str | None = None,
    customize: Callable[[SchedulerBuilder], object] | None = None,
) -> FastAPI:
    """The example app; ``scheduler_name`` names this instance in ``picked_by`` and logs,
    ``customize`` is applied to the scheduler's builder after that (e.g. an observer)."""

    def configure(b: SchedulerBuilder) -> None:
        if scheduler_name:
            b.scheduler_name(scheduler_name)
        if customize is not None:
            customize(b)

    lifespan = create_ekbatan_lifespan(
        modules=["example_app.jobs"],
        app_lifespan=app_resources,
        customize=configure,
    )
    app = FastAPI(title="ekbatan-fastapi example", lifespan=lifespan)
    app.include_router(create_jobs_router(admin_dependency=require_admin))
    # A route's DatabaseUnavailable / SchemaMissingError: 503 with a JSON body, not a 500.
    install_exception_handlers(app)

    @app.get("/")
    async def index(state: Annotated[EkbatanState, Depends(get_ekbatan)]) -> dict[str, Any]:
        return {
            "instance": state.registry.status().name,
            "jobs": sorted(state.jobs),
            "links": {
                "dashboard": "/jobs/-/ui",
                "jobs": "/jobs",
                "demo runs": "/demo/runs",
                "API docs": "/docs",
            },
        }

    @app.post("/demo/notes", status_code=202)
    async def add_note(
        note: Note, client: Annotated[SchedulerClient, Depends(get_scheduler_client)]
    ) -> dict[str, str]:
        """Schedule the one-time ``demo-note`` job (one run, on one instance). With the
        database down or its tables missing this answers 503, not 500."""
        instance = uuid.uuid4().hex
        await client.schedule("demo-note", instance, data=note)
        return {"scheduled": instance}

    @app.get("/demo/runs")
    async def demo_runs(
        request: Request, state: Annotated[EkbatanState, Depends(get_ekbatan)]
    ) -> dict[str, Any]:
        """Which instance ran each demo slot (and how many slots ran twice: 0)."""
        summary = await DemoLedger(request.state.db).summary()
        return {"answered_by": state.registry.status().name, **summary}

    return app
