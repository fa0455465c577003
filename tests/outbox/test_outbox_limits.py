"""Outbox input no backend can store is refused before the database sees it, and an outbox on a database
without its tables says to run `dibs init`, on PostgreSQL, SQLite and MariaDB."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import outbox as outbox_table
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.outbox.support import OutboxDatabase
from tests.queue.support import drop_everything

EVENT = {"aggregate_type": "order", "aggregate_id": "42", "event_type": "order.placed", "payload": {"total": 1}}

BAD_EVENTS: list[tuple[str, dict[str, Any], str]] = [
    ("aggregate-type-nul", {"aggregate_type": "order\x00"}, "aggregate_type must not contain NUL"),
    ("aggregate-id-nul", {"aggregate_id": "4\x002"}, "aggregate_id must not contain NUL"),
    ("event-type-nul", {"event_type": "order.\x00placed"}, "event_type must not contain NUL"),
    ("target-nul", {"target": "redis\x00"}, "target must not contain NUL"),
    ("event-type-surrogate", {"event_type": "order.\udc00"}, "event_type must be valid Unicode"),
    ("target-too-long", {"target": "t" * 101}, "target must be a string of 1 to 100 characters"),
    (
        "header-70-kb",
        {"headers": {"trace": "x" * 70_000}},
        "headers take 70,012 bytes as JSON, over the limit of 65,535",
    ),
    ("header-nul", {"headers": {"trace": "a\x00b"}}, "header 'trace' must not contain NUL"),
]


@pytest.mark.parametrize(("change", "message"), [case[1:] for case in BAD_EVENTS], ids=[c[0] for c in BAD_EVENTS])
def test_an_event_out_of_range_is_refused_and_the_business_transaction_goes_on(
    odb: OutboxDatabase, change: dict[str, Any], message: str
) -> None:
    outbox = odb.outbox()
    event = {**EVENT, **change}
    with odb.engine.begin() as conn:
        with pytest.raises(dibs.InvalidArgument, match=message):
            outbox.add(conn, **event)
        with pytest.raises(dibs.InvalidArgument, match=message):
            outbox.add_many(conn, [EVENT, event])
        good = outbox.add(conn, **EVENT)  # the transaction is still usable (PostgreSQL's would be aborted)

    async def add_async() -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(with_driver(odb.url, ASYNC_DRIVERS[odb.family]))
        try:
            async with engine.begin() as conn:
                with pytest.raises(dibs.InvalidArgument, match=message):
                    await outbox.aadd(conn, **event)
        finally:
            await engine.dispose()

    asyncio.run(add_async())
    assert [row.id for row in odb.rows()] == [good]


def test_the_largest_headers_and_names_are_stored_whole_on_every_backend(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    headers = {"trace": "x" * (65_535 - len('{"trace":""}'))}
    names = {"aggregate_type": "a" * 200, "aggregate_id": "i" * 200, "event_type": "e" * 200, "target": "t" * 100}
    with odb.engine.begin() as conn:
        event_id = outbox.add(conn, **{**EVENT, **names}, headers=headers)
    stored = outbox.get(event_id)
    assert stored.headers == headers
    assert (stored.aggregate_type, stored.aggregate_id, stored.event_type, stored.target) == tuple(names.values())
    assert outbox.events(target="t" * 100, aggregate_type="a" * 200, aggregate_id="i" * 200)[0].id == event_id
    for bad in ({"target": "t\x00"}, {"aggregate_type": "a\x00"}, {"aggregate_id": "a\x00"}, {"limit": 2**31}):
        with pytest.raises(dibs.InvalidArgument):
            outbox.events(**bad)


def outbox_calls(odb: OutboxDatabase, outbox: dibs.Outbox) -> dict[str, Callable[[], Any]]:
    """Every Outbox call that reads or writes the table, by name."""

    def add(many: bool) -> Callable[[], Any]:
        def call() -> Any:
            with odb.engine.begin() as conn:
                return outbox.add_many(conn, [EVENT]) if many else outbox.add(conn, **EVENT)

        return call

    async def aadd() -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(with_driver(odb.url, ASYNC_DRIVERS[odb.family]))
        try:
            async with engine.begin() as conn:
                await outbox.aadd(conn, **EVENT)
        finally:
            await engine.dispose()

    return {
        "add": add(many=False),
        "add_many": add(many=True),
        "add on an engine": lambda: outbox.add(odb.engine, **EVENT),  # type: ignore[arg-type]
        "aadd": lambda: asyncio.run(aadd()),
        "get": lambda: outbox.get(1),
        "events": outbox.events,
        "status": outbox.status,
        "requeue": outbox.requeue,
        "requeue ids": lambda: outbox.requeue([1]),
        "discard": lambda: outbox.discard([1]),
        "purge": outbox.purge,
        "purgeable": outbox.purgeable,
        "relay": lambda: odb.relay(outbox, "log://", burst=True).run(),
    }


@pytest.mark.parametrize("missing", ["every dibs table", "the outbox table"])
def test_every_outbox_call_on_a_database_without_its_table_says_to_run_dibs_init(
    odb: OutboxDatabase, missing: str
) -> None:
    if missing == "every dibs table":
        drop_everything(odb.url)
    else:
        outbox_table.drop(odb.engine)
    outbox = odb.outbox()
    for name, call in outbox_calls(odb, outbox).items():
        with pytest.raises(dibs.SchemaMissing, match=r"run `dibs --db URL init`") as caught:
            call()
        assert isinstance(caught.value.__cause__, sa.exc.DBAPIError) or name == "relay", name
    outbox.init()
    assert outbox.status() == []
