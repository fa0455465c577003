"""Typed arguments: dataclasses and pydantic models checked and stored as JSON at enqueue, rebuilt in the worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pydantic
import pytest

import dibs
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.queue.database import QueueDatabase
from tests.queue.support import job_count, job_rows


class Customer(pydantic.BaseModel):
    name: str
    vip: bool = False


class Order(pydantic.BaseModel):
    id: int
    customer: Customer
    cents: int


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int = 1


@dataclass(frozen=True)
class Parcel:
    lines: list[Line]
    note: str | None = None
    tags: dict[str, int] = field(default_factory=dict)


def typed_app(qdb: QueueDatabase, seen: list[Any]) -> tuple[dibs.App, dibs.Task, dibs.Task]:
    app = qdb.app()

    @app.task(name="shop.ship")
    def ship(order: Order, parcel: Parcel, carrier: str, backups: list[Line] | None = None) -> int:
        seen.append((order, parcel, carrier, backups))
        return order.cents

    @app.task(name="shop.ship_async")
    async def ship_async(order: Order, parcel: Parcel | None = None) -> str:
        await asyncio.sleep(0)
        seen.append((order, parcel))
        return order.customer.name

    return app, ship, ship_async


ORDER = Order(id=7, customer=Customer(name="Ada"), cents=1200)


def test_models_and_dataclasses_are_stored_as_json_and_rebuilt_for_the_function(qdb: QueueDatabase) -> None:
    seen: list[Any] = []
    app, ship, _ = typed_app(qdb, seen)

    from_instances = ship.enqueue(
        {"order": ORDER, "parcel": Parcel([Line("tea", 2)], tags={"fragile": 1}), "carrier": "post"}
    )
    from_dicts = app.enqueue(
        ship,
        {
            "order": {"id": "8", "customer": {"name": "Bo", "vip": True}, "cents": 5},
            "parcel": {"lines": [{"sku": "cup"}]},
            "carrier": "van",
            "backups": [Line("mug")],
        },
    )
    stored = {row.id: json.loads(row.args) for row in job_rows(qdb.engine)}
    assert stored[from_instances.id] == {
        "order": {"id": 7, "customer": {"name": "Ada", "vip": False}, "cents": 1200},
        "parcel": {"lines": [{"sku": "tea", "quantity": 2}], "note": None, "tags": {"fragile": 1}},
        "carrier": "post",
    }
    assert stored[from_dicts.id]["order"] == {"id": 8, "customer": {"name": "Bo", "vip": True}, "cents": 5}
    assert stored[from_dicts.id]["backups"] == [{"sku": "mug", "quantity": 1}]
    assert from_instances.args == stored[from_instances.id]

    qdb.drain(app)
    assert from_instances.result(timeout=5) == 1200
    assert sorted(seen, key=lambda call: call[0].id) == [
        (ORDER, Parcel([Line("tea", 2)], tags={"fragile": 1}), "post", None),
        (Order(id=8, customer=Customer(name="Bo", vip=True), cents=5), Parcel([Line("cup")]), "van", [Line("mug")]),
    ]


def test_an_argument_of_the_wrong_type_is_refused_naming_task_and_parameter(qdb: QueueDatabase) -> None:
    seen: list[Any] = []
    app, ship, _ = typed_app(qdb, seen)
    parcel = {"lines": []}

    with pytest.raises(dibs.InvalidArgument, match=r"argument 'order' of a 'shop.ship' job .* cents: Input should be"):
        ship.enqueue(
            {"order": {"id": 1, "customer": {"name": "Ada"}, "cents": "lots"}, "parcel": parcel, "carrier": "x"}
        )
    with pytest.raises(dibs.InvalidArgument, match=r"argument 'parcel' of a 'shop.ship' job .* lines: \[0\]: quantity"):
        ship.enqueue({"order": ORDER, "parcel": {"lines": [{"sku": "tea", "quantity": "2"}]}, "carrier": "x"})
    with pytest.raises(
        dibs.InvalidArgument, match=r"'parcel' .*Parcel takes the fields lines, note, tags: no field 'size'"
    ):
        ship.enqueue({"order": ORDER, "parcel": {"lines": [], "size": 3}, "carrier": "x"})
    with pytest.raises(dibs.InvalidArgument, match=r"argument 'backups' .* expected a list, got Line"):
        ship.enqueue({"order": ORDER, "parcel": parcel, "carrier": "x", "backups": Line("tea")})
    with pytest.raises(dibs.InvalidArgument, match=r"argument 'parcel' .* expected a Parcel or a dict of its fields"):
        ship.enqueue({"order": ORDER, "parcel": Line("tea"), "carrier": "x"})

    good = {"order": ORDER, "parcel": parcel, "carrier": "x"}
    bad = {**good, "order": {"id": 2}}
    with pytest.raises(dibs.InvalidArgument, match=r"argument 'order' of a 'shop.ship' job"):
        app.enqueue_many(ship, [good, good, bad])
    with qdb.engine.begin() as conn, pytest.raises(dibs.InvalidArgument, match="argument 'order'"):
        ship.enqueue(bad, conn=conn)
    assert job_count(qdb.engine) == 0


def test_async_tasks_and_aenqueue_in_the_callers_transaction(qdb: QueueDatabase) -> None:
    seen: list[Any] = []
    app, _, ship_async = typed_app(qdb, seen)
    engine = dibs.create_async_engine(with_driver(qdb.url, ASYNC_DRIVERS[qdb.family]))

    async def scenario() -> list[dibs.Job]:
        try:
            async with engine.begin() as conn:
                first = await ship_async.aenqueue({"order": ORDER}, conn=conn)
                many = await app.aenqueue_many(
                    ship_async, [{"order": ORDER.model_dump(), "parcel": {"lines": [{"sku": "pen"}]}}], conn=conn
                )
            with contextlib.suppress(dibs.InvalidArgument):
                async with engine.begin() as conn:
                    await ship_async.aenqueue({"order": ORDER}, conn=conn)
                    await app.aenqueue_many(ship_async, [{"order": ORDER}, {"order": {"id": "x"}}], conn=conn)
            return [first, *many]
        finally:
            await engine.dispose()

    jobs = asyncio.run(scenario())
    assert job_count(qdb.engine) == 2
    qdb.drain(app)
    assert [job.result(timeout=5) for job in jobs] == ["Ada", "Ada"]
    assert sorted(seen, key=lambda call: call[1] is not None) == [(ORDER, None), (ORDER, Parcel([Line("pen")]))]


def test_a_stored_argument_that_no_longer_fits_buries_the_job_at_once(qdb: QueueDatabase) -> None:
    before = qdb.app()

    @before.task(name="shop.refund")
    def refund_before(order: dict[str, Any]) -> None: ...

    job = refund_before.enqueue({"order": {"id": 3}})
    after = qdb.app()

    @after.task(name="shop.refund", max_attempts=3)
    def refund(order: Order) -> None:
        raise AssertionError("never called")

    qdb.drain(after)
    dead = after.get(job.id)
    assert dead.status == "dead"
    assert dead.attempts == 1
    assert f"the arguments of job {job.id} do not fit task 'shop.refund': argument 'order'" in (dead.last_error or "")
    assert "customer: Field required" in (dead.last_error or "")


class Refund(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)

    order: uuid.UUID
    at: datetime


def test_a_strict_model_is_rebuilt_from_its_stored_json(qdb: QueueDatabase) -> None:
    """A strict model refuses an ISO date or a UUID as a Python string: the worker validates the stored JSON."""
    app = qdb.app()
    seen: list[Refund] = []

    @app.task(name="shop.refund")
    def refund(refund: Refund) -> None:
        seen.append(refund)

    wanted = Refund(order=uuid.uuid4(), at=datetime(2026, 11, 26, 23, 0, tzinfo=timezone.utc))
    job = refund.enqueue({"refund": wanted})
    qdb.drain(app)
    assert app.get(job.id).status == "succeeded"
    assert seen == [wanted]
