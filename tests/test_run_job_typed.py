"""``run_job`` on a typed one-time job (issue 33 part 3 item 1): the job gets the model
instance, from a dict of its fields or from the model, validated as ``client.schedule``
validates it and decoded by the same code as in production and under the TimeMachine."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from ekbatan_fastapi import ExecutionContext, OneTimeJob, TaskDataInvalid
from ekbatan_fastapi.testing import TimeMachine, run_job


class Reminder(BaseModel):
    user_id: int
    times: int = Field(ge=1)
    amount: Decimal = Decimal("0")


class Remind(OneTimeJob[Reminder]):
    def __init__(self) -> None:
        self.seen: list[Reminder] = []

    def name(self) -> str:
        return "remind"

    async def execute(self, ctx: ExecutionContext[Reminder]) -> None:
        self.seen.append(ctx.data)
        assert ctx.data.times >= 1  # AttributeError on a dict, as the issue reported


@pytest.mark.parametrize(
    "data",
    [
        {"user_id": 7, "times": 2, "amount": "1.50"},
        {"user_id": "7", "times": "2", "amount": "1.50"},  # coerced as pydantic does
        Reminder(user_id=7, times=2, amount=Decimal("1.50")),
    ],
)
async def test_run_job_hands_a_typed_job_its_model(data: object) -> None:
    job = Remind()
    ctx = await run_job(job, data=data)
    assert job.seen == [Reminder(user_id=7, times=2, amount=Decimal("1.50"))]
    assert ctx.data is job.seen[0]
    assert ctx.task_data == b'{"user_id":7,"times":2,"amount":"1.50"}'  # the stored JSON form


async def test_run_job_refuses_data_that_does_not_fit_naming_the_fields() -> None:
    job = Remind()
    with pytest.raises(TaskDataInvalid) as raised:
        await run_job(job, data={"user_id": "x", "times": 0})
    assert raised.value.fields == ["user_id", "times"]
    assert "data for remind/test does not fit Reminder" in str(raised.value)
    assert job.seen == []


async def test_run_job_with_a_database_and_the_time_machine_give_the_same_model(
    database_url: str, engine: AsyncEngine
) -> None:
    job = Remind()
    await run_job(job, data={"user_id": 1, "times": 3}, database=database_url, instance="r-1")
    start = datetime(2030, 1, 1, tzinfo=UTC)
    async with TimeMachine([job], database_url, start=start, create_tables=False) as tm:
        await tm.schedule("remind", "r-2", start, {"user_id": 1, "times": 3})
        await tm.run_due()
    assert job.seen == [Reminder(user_id=1, times=3)] * 2
