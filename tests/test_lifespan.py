"""ekbatan_lifespan: settings, discovery, FastAPI-style dependency injection, composition."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, Request
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    DistributedJob,
    ExecutionContext,
    Schedule,
    Schedules,
    distributed_job,
    job_registry,
)
from ekbatan_fastapi.domain.errors import ConfigurationError
from ekbatan_fastapi.web import (
    EkbatanState,
    create_ekbatan_lifespan,
    ekbatan_lifespan,
    jobs_router,
)

from .fastapi_helpers import FAST_JOBS, SLOT_ENV, fast_settings, running
from .helpers import wait_until

EVENTS: list[str] = []
"""Provider lifecycle, in order; reset before every test."""


@pytest.fixture(autouse=True)
def _reset_events() -> None:
    EVENTS.clear()


class Recorder:
    """A service the jobs share; records the slots they ran."""

    def __init__(self, label: str = "default") -> None:
        self.label = label
        self.runs: list[str] = []


def get_recorder() -> Recorder:
    EVENTS.append("recorder")
    return Recorder()


def get_sync_resource() -> Iterator[str]:
    EVENTS.append("sync open")
    yield "sync"
    EVENTS.append("sync close")


async def get_async_resource(
    sync: Annotated[str, Depends(get_sync_resource)],
) -> AsyncIterator[str]:
    EVENTS.append("async open")
    yield f"async({sync})"
    EVENTS.append("async close")


async def get_greeting(recorder: Annotated[Recorder, Depends(get_recorder)]) -> str:
    EVENTS.append("greeting")
    return f"hello from {recorder.label}"


@distributed_job
class TickJob(DistributedJob):
    """Every 50 ms; built from providers of every kind."""

    def __init__(
        self,
        recorder: Annotated[Recorder, Depends(get_recorder)],
        resource: Annotated[str, Depends(get_async_resource)],
        greeting: str = Depends(get_greeting),  # the pre-Annotated style
        unused: int = 7,
    ) -> None:
        self.recorder = recorder
        self.resource = resource
        self.greeting = greeting

    def name(self) -> str:
        return "lifespan-tick"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=50))

    async def execute(self, ctx: ExecutionContext) -> None:
        self.recorder.runs.append(f"tick@{ctx.picked_by}")


@distributed_job
class TockJob(DistributedJob):
    """Shares the Recorder singleton with TickJob; a plain ``def`` job."""

    def __init__(self, recorder: Annotated[Recorder, Depends(get_recorder)]) -> None:
        self.recorder = recorder

    def name(self) -> str:
        return "lifespan-tock"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(milliseconds=50))

    def execute(self, ctx: ExecutionContext) -> None:
        self.recorder.runs.append("tock")


class UnresolvableJob(DistributedJob):
    def __init__(self, mailer: object) -> None:
        self.mailer = mailer

    def name(self) -> str:
        return "unresolvable"

    def schedule(self) -> Schedule:
        return Schedules.fixed_delay(timedelta(seconds=1))

    def execute(self, ctx: ExecutionContext) -> None:
        pass


def get_request_bound(request: Request) -> str:
    return request.url.path


class RequestBoundJob(UnresolvableJob):
    def __init__(self, path: Annotated[str, Depends(get_request_bound)]) -> None:
        self.path = path


def cycle_a() -> str:
    return "a"


def cycle_b(a: Annotated[str, Depends(cycle_a)]) -> str:
    return a


def cycle_a_override(b: Annotated[str, Depends(cycle_b)]) -> str:
    """Overriding cycle_a with this closes the cycle cycle_b -> cycle_a -> cycle_b."""
    return b


PROBE: dict[str, Any] = {}


async def get_probe(resource: Annotated[str, Depends(get_async_resource)]) -> AsyncIterator[str]:
    yield resource
    EVENTS.append(
        f"probe close, scheduler stopped: {PROBE['state'].registry.scheduler.is_shutting_down}"
    )


class ProbeJob(TockJob):
    def __init__(self, probe: Annotated[str, Depends(get_probe)]) -> None:
        self.probe = probe

    def name(self) -> str:
        return "probe"


class CyclicJob(UnresolvableJob):
    def __init__(self, value: Annotated[str, Depends(cycle_b)]) -> None:
        self.value = value


def tick_app(
    database_url: str,
    jobs: tuple[type[DistributedJob] | DistributedJob, ...] = (TickJob, TockJob),
    **options: Any,
) -> FastAPI:
    options.setdefault("discover", False)
    lifespan = create_ekbatan_lifespan(settings=fast_settings(database_url), jobs=jobs, **options)
    app = FastAPI(lifespan=lifespan)
    app.include_router(jobs_router)
    return app


def state_of(app: FastAPI) -> EkbatanState:
    state = app.state.ekbatan
    assert isinstance(state, EkbatanState)
    return state


async def test_default_lifespan_reads_settings_from_the_environment(
    engine: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in FAST_JOBS.items():
        monkeypatch.setenv(f"EKBATAN_JOBS__{key.replace('-', '_').upper()}", value)
    monkeypatch.setenv(f"{SLOT_ENV}__URL", database_url)
    app = FastAPI(lifespan=ekbatan_lifespan)
    app.include_router(jobs_router)

    @app.get("/whoami")
    async def whoami(request: Request) -> dict[str, str]:
        return {"scheduler": request.state.ekbatan.registry.status().name}

    if "example_app.jobs" in sys.modules:
        # Discovered too when another test module imported the example app (a pytest-xdist
        # worker imports every module): its "demo" job runs at once and would fail, making
        # /jobs answer 503 whenever it ran before the request. Its table, then.
        from example_app.services import demo_metadata

        async with engine.begin() as conn:
            await conn.run_sync(demo_metadata.create_all)

    async with running(app) as client:
        state = state_of(app)
        assert state.settings.jobs.polling_interval == timedelta(milliseconds=100)
        assert {"lifespan-tick", "lifespan-tock"} <= set(state.jobs)  # discovered
        tick = state.jobs["lifespan-tick"]
        assert isinstance(tick, TickJob)
        await wait_until(lambda: len(tick.recorder.runs) >= 2, what="discovered jobs run")
        assert (await client.get("/whoami")).json()["scheduler"] == state.registry.status().name
        assert (await client.get("/jobs")).status_code == 200
    assert not hasattr(app.state, "ekbatan")
    assert state.registry.scheduler.is_shutting_down


async def test_providers_of_every_kind_are_resolved_once_per_application(
    engine: AsyncEngine, database_url: str
) -> None:
    app = tick_app(database_url)
    async with running(app):
        state = state_of(app)
        tick, tock = state.jobs["lifespan-tick"], state.jobs["lifespan-tock"]
        assert isinstance(tick, TickJob) and isinstance(tock, TockJob)
        assert tick.recorder is tock.recorder  # one instance per provider per application
        assert tick.resource == "async(sync)"  # nested Depends, generator providers
        assert tick.greeting == "hello from default"  # async provider, default-style Depends
        assert EVENTS.count("recorder") == 1
        await wait_until(
            lambda: {"tock", f"tick@{state.registry.status().name}"} <= set(tick.recorder.runs),
            what="both jobs ran",
        )
        assert "sync close" not in EVENTS


async def test_generator_teardown_runs_after_the_scheduler_stopped_in_reverse_order(
    engine: AsyncEngine, database_url: str
) -> None:
    app = tick_app(database_url, jobs=(ProbeJob,))
    async with running(app):
        PROBE["state"] = state_of(app)
        assert EVENTS == ["sync open", "async open"]
    assert EVENTS == [
        "sync open",
        "async open",
        "probe close, scheduler stopped: True",
        "async close",
        "sync close",
    ]


async def test_dependency_overrides_replace_providers_like_for_routes(
    engine: AsyncEngine, database_url: str
) -> None:
    special = Recorder("override")
    app = tick_app(database_url)
    app.dependency_overrides[get_recorder] = lambda: special
    app.dependency_overrides[get_sync_resource] = lambda: "fake"
    async with running(app):
        state = state_of(app)
        tick = state.jobs["lifespan-tick"]
        assert isinstance(tick, TickJob)
        assert tick.recorder is special
        assert tick.greeting == "hello from override"  # nested use sees the override too
        assert tick.resource == "async(fake)"
        assert "recorder" not in EVENTS and "sync open" not in EVENTS
        await wait_until(lambda: len(special.runs) >= 2, what="jobs use the override")


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (UnresolvableJob, r"parameter 'mailer' of job class .*UnresolvableJob.*Depends"),
        (RequestBoundJob, r"parameter 'request' of provider get_request_bound.*only during a"),
        (CyclicJob, r"dependency cycle"),
    ],
)
async def test_unresolvable_parameter_fails_startup_naming_class_and_parameter(
    database_url: str, job: type[DistributedJob], message: str
) -> None:
    app = FastAPI(
        lifespan=create_ekbatan_lifespan(
            settings=fast_settings(database_url), jobs=[job], discover=False
        )
    )
    if job is CyclicJob:
        app.dependency_overrides[cycle_a] = cycle_a_override
    with pytest.raises(ConfigurationError, match=message):
        async with running(app):
            pass


async def test_failing_provider_is_reported_with_the_job_and_parameter(database_url: str) -> None:
    def broken() -> Recorder:
        raise RuntimeError("no mail server")

    app = tick_app(database_url)
    app.dependency_overrides[get_recorder] = broken
    with pytest.raises(RuntimeError, match="no mail server") as caught:
        async with running(app):
            pass
    assert any("'recorder' of job class" in note for note in caught.value.__notes__)


async def test_startup_does_not_wait_for_an_unreachable_database() -> None:
    app = tick_app("postgresql+asyncpg://app:pw@127.0.0.1:1/app")
    started = time.monotonic()
    async with running(app) as client:
        assert time.monotonic() - started < 10  # a wait for the database would never end
        response = await client.get("/jobs")
        assert response.status_code == 503
        body = response.json()
        assert body["healthy"] is False
        assert body["problems"][0].startswith("database unreachable")
        await wait_until(
            lambda: state_of(app).registry.status().database_reachable is False,
            what="scheduler notices",
        )


async def test_no_database_configured_fails_startup_naming_the_key() -> None:
    app = FastAPI(lifespan=create_ekbatan_lifespan(jobs=[TickJob], discover=False))
    with pytest.raises(ConfigurationError, match=r"configs\.jobs-config\.url"):
        async with running(app):
            pass
    assert EVENTS == []  # no provider ran


async def test_jobs_modules_from_settings_are_imported_and_discovered(
    engine: AsyncEngine, database_url: str
) -> None:
    assert "tests.discoverable_jobs" not in sys.modules  # imported because settings list it
    settings = fast_settings(database_url, modules=["tests.discoverable_jobs"])
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=settings))
    async with running(app):
        job = state_of(app).jobs["discovered-by-settings"]
        assert type(job).__module__ == "tests.discoverable_jobs"
        assert job.settings is settings  # type: ignore[attr-defined]
        await wait_until(lambda: job.runs >= 1, what="discovered job ran")  # type: ignore[attr-defined]


async def test_unimportable_module_is_named(database_url: str) -> None:
    settings = fast_settings(database_url, modules=["tests.no_such_module_here"])
    app = FastAPI(lifespan=create_ekbatan_lifespan(settings=settings, discover=False))
    with pytest.raises(ConfigurationError, match=r"ekbatan\.jobs\.modules lists 'tests\.no_such"):
        async with running(app):
            pass


async def test_app_lifespan_opens_first_and_closes_last(
    engine: AsyncEngine, database_url: str
) -> None:
    @asynccontextmanager
    async def app_resources(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
        EVENTS.append("app open")
        yield {"db": "app-db"}
        EVENTS.append("app close")

    app = tick_app(database_url, app_lifespan=app_resources)

    @app.get("/state")
    async def read_state(request: Request) -> dict[str, Any]:
        return {"db": request.state.db, "jobs": sorted(request.state.ekbatan.jobs)}

    async with running(app) as client:
        assert EVENTS[0] == "app open"
        body = (await client.get("/state")).json()
        assert body == {"db": "app-db", "jobs": ["lifespan-tick", "lifespan-tock"]}
    assert EVENTS[-3:] == ["async close", "sync close", "app close"]


async def test_hand_composed_lifespan(engine: AsyncEngine, database_url: str) -> None:
    ekbatan = create_ekbatan_lifespan(
        settings=fast_settings(database_url), jobs=[TockJob], discover=False
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
        EVENTS.append("app open")
        async with ekbatan(app) as state:
            yield {**state, "mine": 1}
        EVENTS.append("app close")

    app = FastAPI(lifespan=lifespan)
    async with running(app):
        assert "lifespan-tock" in state_of(app).jobs
    assert EVENTS[0] == "app open" and EVENTS[-1] == "app close"


async def test_hand_wired_registry_is_started_and_stopped(
    engine: AsyncEngine, database_url: str
) -> None:
    tock = TockJob(Recorder("manual"))
    registry = (
        job_registry()
        .connection_provider(database_url)
        .with_job(tock)
        .poll_interval(timedelta(milliseconds=100))
        .heartbeat_interval(timedelta(milliseconds=100))
        .shutdown_max_wait(timedelta(seconds=2))
        .build()
    )
    app = FastAPI(lifespan=create_ekbatan_lifespan(registry=registry, settings=fast_settings("")))
    app.include_router(jobs_router)
    async with running(app) as client:
        assert state_of(app).registry is registry
        await wait_until(lambda: len(tock.recorder.runs) >= 1, what="hand-wired job ran")
        names = [t["name"] for t in (await client.get("/jobs")).json()["tasks"]]
        assert names == ["lifespan-tock"]
    assert registry.scheduler.is_shutting_down


async def test_job_instances_are_used_as_given(engine: AsyncEngine, database_url: str) -> None:
    mine = TockJob(Recorder("given"))
    app = tick_app(database_url, jobs=(mine, TickJob), discover=True)
    async with running(app):
        assert state_of(app).jobs["lifespan-tock"] is mine  # not built a second time
        assert EVENTS.count("recorder") == 1  # for TickJob only


def test_lifespan_rejects_registry_with_other_wiring() -> None:
    with pytest.raises(ConfigurationError, match="ready-made JobRegistry"):
        create_ekbatan_lifespan(registry=object(), jobs=[TockJob])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="job instances or job classes"):
        create_ekbatan_lifespan(jobs=["not a job"])  # type: ignore[list-item]


async def test_password_is_not_logged_at_startup(
    engine: AsyncEngine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "never-log-this-password"
    # Trust authentication accepts any password, so the app still reaches the database.
    url = make_url(database_url).set(password=secret).render_as_string(hide_password=False)
    caplog.set_level(logging.DEBUG)
    app = tick_app(url)
    async with running(app) as client:
        body = (await client.get("/jobs")).text
        await asyncio.sleep(0.2)
    assert secret not in body
    assert secret not in caplog.text
    assert "starting 2 jobs" in caplog.text
