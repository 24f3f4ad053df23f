"""Typed task data: ``OneTimeJob[InvoiceData]`` validates at ``schedule()``, hands the model to
``execute``, and parks a row whose stored data no longer fits (once, shown on ``/jobs``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import (
    ConfigurationError,
    ExecutionContext,
    JobRegistry,
    OneTimeJob,
    Outcome,
    RetryLater,
    Schedules,
    TaskDataInvalid,
    distributed_job,
)
from ekbatan_fastapi.domain.failure import FailureHandler
from ekbatan_fastapi.domain.job import is_distributed_job
from ekbatan_fastapi.domain.rows import PARKED_TIME
from ekbatan_fastapi.web import create_ekbatan_lifespan, jobs_router

from .fastapi_helpers import fast_settings, running
from .helpers import CountingJob, RecordingJob, RegistryFactory, wait_until

HOUR = timedelta(hours=1)


class InvoiceData(BaseModel):
    invoice_id: int
    amount: Decimal = Field(gt=0)
    due: datetime | None = None


@distributed_job
class SendInvoice(OneTimeJob[InvoiceData]):
    """The README's example, typed."""

    def __init__(self) -> None:
        self.seen: list[InvoiceData] = []
        self.ran = asyncio.Event()

    def name(self) -> str:
        return "send-invoice"

    def failure_handler(self) -> FailureHandler:
        return RetryLater(timedelta(milliseconds=50))  # a retry would come at once

    async def execute(self, ctx: ExecutionContext[InvoiceData]) -> None:
        self.seen.append(ctx.data)
        self.ran.set()


class OldSendInvoice(OneTimeJob):
    """The previous deploy's untyped job of the same name: it wrote ``{"invoice": 42}``."""

    def name(self) -> str:
        return "send-invoice"

    async def execute(self, ctx: ExecutionContext) -> None:
        pass


def test_the_model_is_found_and_plain_one_time_jobs_stay_untyped() -> None:
    assert SendInvoice.data_model is not None
    assert SendInvoice.data_model.annotation is InvoiceData
    assert OldSendInvoice.data_model is None
    assert CountingJob.data_model is None
    assert is_distributed_job(SendInvoice)

    class Resent(SendInvoice):  # inherits its parent's model
        pass

    assert Resent.data_model is SendInvoice.data_model


async def test_schedule_refuses_data_that_does_not_fit_naming_the_field(
    any_registries: RegistryFactory,
) -> None:
    job = SendInvoice()
    registry = any_registries.build(job)
    client = registry.client
    later = datetime.now(UTC) + HOUR
    with pytest.raises(TaskDataInvalid) as refused:
        await client.schedule("send-invoice", "inv-1", later, {"invoice_id": "x", "amount": 5})
    message = str(refused.value)
    assert "send-invoice/inv-1" in message and "InvoiceData" in message
    assert "invoice_id" in message and "'x'" in message
    assert refused.value.fields == ["invoice_id"]
    with pytest.raises(TaskDataInvalid, match=r"amount: Input should be greater than 0"):
        await client.schedule("send-invoice", "inv-2", later, {"invoice_id": 2, "amount": -1})
    with pytest.raises(TaskDataInvalid, match=r"invoice_id: Field required"):
        await client.schedule_many("send-invoice", [("inv-3", later, {"amount": 1})])
    with pytest.raises(TaskDataInvalid, match="the data itself"):
        await client.schedule("send-invoice", "inv-4", later)  # no data at all
    assert await client.list("send-invoice") == []  # nothing was written

    await client.schedule("send-invoice", "inv-5", later, {"invoice_id": 5, "amount": "9.50"})
    with pytest.raises(TaskDataInvalid, match="invoice_id"):
        await client.reschedule("send-invoice", "inv-5", later, data={"invoice_id": None})
    stored = await client.get("send-invoice", "inv-5")
    assert stored is not None and stored.data == {"invoice_id": 5, "amount": "9.50", "due": None}


async def test_execute_gets_the_model_instance_stored_as_its_json_form(
    any_registries: RegistryFactory,
) -> None:
    job = SendInvoice()
    registry = await any_registries.start(job)
    client = registry.client
    due = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = datetime.now(UTC) + HOUR
    await client.schedule(
        "send-invoice", "waits", later, InvoiceData(invoice_id=1, amount=Decimal(2))
    )
    waiting = await client.get("send-invoice", "waits")
    assert waiting is not None
    assert waiting.data == {"invoice_id": 1, "amount": "2", "due": None}  # model_dump(mode=json)

    await client.schedule("send-invoice", "inv-7", None, {"invoice_id": 7, "amount": "1.25"})
    await client.schedule_many(
        "send-invoice", [("inv-8", None, InvoiceData(invoice_id=8, amount=Decimal(3), due=due))]
    )
    await wait_until(lambda: len(job.seen) == 2, what="both typed executions")
    by_id = {d.invoice_id: d for d in job.seen}
    assert all(isinstance(d, InvoiceData) for d in job.seen)
    assert by_id[7].amount == Decimal("1.25")
    assert by_id[8].due == due


async def test_an_untyped_one_time_job_is_unchanged(any_registries: RegistryFactory) -> None:
    job = CountingJob()
    registry = await any_registries.start(job)
    client = registry.client
    await client.schedule("count", "plain", None, {"anything": [1, "two", None]})
    await client.schedule("count", "model", None, InvoiceData(invoice_id=3, amount=Decimal(4)))
    await client.schedule("count", "nothing", None)
    await wait_until(lambda: len(job.data) == 3, what="three untyped executions")
    assert job.data == {
        "plain": {"anything": [1, "two", None]},
        "model": {"invoice_id": 3, "amount": "4", "due": None},  # a model is stored as JSON
        "nothing": None,
    }


async def _outcomes(registry: JobRegistry, instance: str) -> list[str]:
    history = await registry.client.history("send-invoice")
    return [r.outcome for r in history if r.task_instance == instance]


async def test_a_row_whose_data_no_longer_fits_is_parked_once_and_shown_on_jobs(
    any_registries: RegistryFactory, any_engine: AsyncEngine
) -> None:
    old = any_registries.build(OldSendInvoice())  # the previous deploy's client: no scheduler
    await old.client.schedule("send-invoice", "old-shape", None, {"invoice": 42})
    await old.client.schedule("send-invoice", "to-drop", None, {"invoice": 43})
    async with any_engine.begin() as conn:  # bytes this library never writes
        await conn.execute(
            text("UPDATE scheduled_tasks SET task_data = :raw WHERE task_instance = 'to-drop'"),
            {"raw": b"\xac\xed\x00\x05sr"},
        )
    job = SendInvoice()
    ticks = RecordingJob("tick", Schedules.fixed_delay(timedelta(milliseconds=100)))
    registry = any_registries.build(job, ticks)
    app = FastAPI(lifespan=create_ekbatan_lifespan(registry=registry, settings=fast_settings("")))
    app.include_router(jobs_router)
    async with running(app) as http:
        await wait_until(lambda: _parked(registry, "old-shape", "to-drop"), what="both rows parked")
        seen = len(ticks.slots)
        await wait_until(lambda: len(ticks.slots) >= seen + 5, what="five more polls")
        assert job.seen == []  # execute() was never called
        assert await _outcomes(registry, "old-shape") == [Outcome.PARKED]  # once, not retried
        assert await _outcomes(registry, "to-drop") == [Outcome.PARKED]

        parked = await registry.client.get("send-invoice", "old-shape")
        assert parked is not None and parked.parked and not parked.picked
        assert parked.execution_time == PARKED_TIME
        assert parked.consecutive_failures == 1 and parked.last_failure is not None
        assert parked.data == {"invoice": 42}  # kept as it was, for a fix

        tasks = {t["instance"]: t for t in (await http.get("/jobs/send-invoice")).json()["tasks"]}
        assert tasks["old-shape"]["state"] == "parked"
        assert tasks["to-drop"]["state"] == "parked"
        history = (await http.get("/jobs/send-invoice/history")).json()["records"]
        record = next(r for r in history if r["task_instance"] == "old-shape")
        assert record["outcome"] == "parked"
        assert record["error_class"] == "TaskDataInvalid"
        assert "does not fit InvoiceData" in record["error_message"]
        assert "invoice_id: Field required" in record["error_message"]
        assert "reschedule" in record["error_message"]

        page = (await http.get("/jobs/-/ui")).text  # the dashboard: badge, and why
        assert 'badge st-parked">parked' in page and "does not fit InvoiceData" in page

        # The fix: new data (checked against the model) and due now; or the row is dropped.
        await registry.client.reschedule(
            "send-invoice", "old-shape", None, data={"invoice_id": 42, "amount": 10}
        )
        await registry.client.run_now("send-invoice", "to-drop")  # as it is: parked again
        await wait_until(
            lambda: _parked_twice(registry, "to-drop"), what="to-drop parked a second time"
        )
        await registry.client.cancel("send-invoice", "to-drop")
        await wait_until(lambda: len(job.seen) == 1, what="the fixed row ran")
        assert job.seen[0].invoice_id == 42
        await wait_until(lambda: _gone(registry, "old-shape", "to-drop"), what="both rows gone")


async def _parked(registry: JobRegistry, *instances: str) -> bool:
    for instance in instances:
        if Outcome.PARKED not in await _outcomes(registry, instance):
            return False
    return True


async def _parked_twice(registry: JobRegistry, instance: str) -> bool:
    return await _outcomes(registry, instance) == [Outcome.PARKED, Outcome.PARKED]


async def _gone(registry: JobRegistry, *instances: str) -> bool:
    rows = {t.task_instance for t in await registry.client.list("send-invoice")}
    return not rows.intersection(instances)


def test_a_type_pydantic_cannot_validate_is_refused_at_class_creation() -> None:
    class Opaque:
        pass

    with pytest.raises(ConfigurationError, match=r"declares its task data as Opaque"):

        class Broken(OneTimeJob[Opaque]):
            def name(self) -> str:
                return "broken"

            async def execute(self, ctx: ExecutionContext[Any]) -> None:
                pass
