"""Enqueue: in the caller's transaction or not at all, nothing written for bad input, and dedupe keys."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import dibs
from dibs.schema import jobs
from tests.helpers import wait_until
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.queue.database import QueueDatabase
from tests.queue.support import job_count, job_rows, orders, test_metadata


class Rollback(Exception):
    """Raised to roll a transaction back."""


def order_count(qdb: QueueDatabase) -> int:
    with qdb.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one())


def receipt_app(qdb: QueueDatabase) -> tuple[dibs.App, dibs.Task, list[int]]:
    app = qdb.app()
    sent: list[int] = []

    @app.task(name="shop.send_receipt")
    def send_receipt(order_id: int) -> None:
        sent.append(order_id)

    return app, send_receipt, sent


# -- transactional enqueue ---------------------------------------------------------------------------


def test_a_job_enqueued_in_a_rolled_back_transaction_never_exists(qdb: QueueDatabase) -> None:
    test_metadata.create_all(qdb.engine)
    app, send_receipt, sent = receipt_app(qdb)

    with contextlib.suppress(Rollback), qdb.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1, item="book"))
        job = app.enqueue(send_receipt, {"order_id": 1}, conn=conn)
        assert job.status == "queued"
        raise Rollback

    assert (job_count(qdb.engine), order_count(qdb)) == (0, 0)
    assert qdb.drain(app).claimed == 0
    assert sent == []

    with qdb.engine.begin() as conn:
        conn.execute(orders.insert().values(id=2, item="lamp"))
        committed = app.enqueue(send_receipt, {"order_id": 2}, conn=conn)
    assert (job_count(qdb.engine), order_count(qdb)) == (1, 1)
    assert app.get(committed.id).args == {"order_id": 2}
    qdb.drain(app)
    assert sent == [2]
    assert app.get(committed.id).status == "succeeded"


def test_enqueue_on_a_connection_without_a_transaction_joins_the_one_it_begins(qdb: QueueDatabase) -> None:
    """SQLAlchemy begins a transaction at the first statement: the job is part of it, so the caller's rollback
    takes it away with the business row, and the caller's commit keeps both."""
    test_metadata.create_all(qdb.engine)
    app, send_receipt, _ = receipt_app(qdb)
    with qdb.engine.connect() as conn:
        job = app.enqueue(send_receipt, {"order_id": 1}, conn=conn)
        conn.execute(orders.insert().values(id=1, item="book"))
        conn.rollback()
        assert (job_count(qdb.engine), order_count(qdb)) == (0, 0)
        with pytest.raises(dibs.JobNotFound):
            app.get(job.id)
        kept = app.enqueue(send_receipt, {"order_id": 2}, conn=conn)
        conn.execute(orders.insert().values(id=2, item="lamp"))
        conn.commit()
    assert (job_count(qdb.engine), order_count(qdb)) == (1, 1)
    assert app.get(kept.id).args == {"order_id": 2}


def test_a_job_in_an_open_transaction_is_invisible_to_others_until_commit(qdb: QueueDatabase) -> None:
    test_metadata.create_all(qdb.engine)
    app, send_receipt, sent = receipt_app(qdb)
    other = qdb.new_engine()

    with qdb.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1, item="book"))
        job = send_receipt.enqueue({"order_id": 1}, conn=conn)
        # Another connection reads without the job (SQLite too: in WAL mode readers see the last commit).
        assert job_count(other) == 0
        with pytest.raises(dibs.JobNotFound, match=f"no job {job.id}"):
            app.get(job.id)
        if qdb.family != "sqlite":  # SQLite has one writer at a time: a worker would wait for this transaction
            stats = qdb.drain(app)
            assert (stats.claimed, sent) == (0, [])
    assert [row.status for row in job_rows(other)] == ["queued"]
    qdb.drain(app)
    assert sent == [1]


def test_enqueue_with_an_orm_session_joins_its_transaction(qdb: QueueDatabase) -> None:
    test_metadata.create_all(qdb.engine)
    app, send_receipt, _ = receipt_app(qdb)

    with Session(qdb.engine) as session:
        session.execute(orders.insert().values(id=1, item="book"))
        app.enqueue(send_receipt, {"order_id": 1}, conn=session)
        session.rollback()
    assert (job_count(qdb.engine), order_count(qdb)) == (0, 0)

    with Session(qdb.engine) as session:
        session.execute(orders.insert().values(id=2, item="lamp"))
        enqueued = app.enqueue_many(send_receipt, [{"order_id": 2}, {"order_id": 3}], conn=session)
        assert job_count(qdb.new_engine()) == 0  # not committed yet
        session.commit()
    assert [(row.id, row.status) for row in job_rows(qdb.engine)] == [(job.id, "queued") for job in enqueued]
    assert order_count(qdb) == 1


def test_aenqueue_joins_an_async_connection_and_session_transaction(qdb: QueueDatabase) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    test_metadata.create_all(qdb.engine)
    app, send_receipt, sent = receipt_app(qdb)
    engine = dibs.create_async_engine(with_driver(qdb.url, ASYNC_DRIVERS[qdb.family]))

    async def scenario() -> list[int]:
        try:
            with contextlib.suppress(Rollback):
                async with engine.begin() as conn:
                    await conn.execute(orders.insert().values(id=1, item="book"))
                    await app.aenqueue(send_receipt, {"order_id": 1}, conn=conn)
                    raise Rollback
            assert job_count(qdb.engine) == 0

            async with engine.begin() as conn:
                await conn.execute(orders.insert().values(id=2, item="lamp"))
                job = await app.aenqueue(send_receipt, {"order_id": 2}, conn=conn)
            async with AsyncSession(engine) as session:
                await session.execute(orders.insert().values(id=3, item="pen"))
                await app.aenqueue_many(send_receipt, [{"order_id": 3}], conn=session)
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(orders.insert().values(id=4, item="cup"))
                many = await app.aenqueue_many(send_receipt, [{"order_id": 4}, {"order_id": 5}], conn=session)
            alone = await send_receipt.aenqueue({"order_id": 6})  # its own transaction, off the event loop
            return [job.id, *(job.id for job in many), alone.id]
        finally:
            await engine.dispose()

    ids = asyncio.run(scenario())
    assert [row.id for row in job_rows(qdb.engine)] == ids
    assert order_count(qdb) == 2
    qdb.drain(app)
    assert sorted(sent) == [2, 4, 5, 6]


# -- bad input writes nothing ------------------------------------------------------------------------

NOW = datetime.now(timezone.utc)

BAD_ENQUEUES: list[tuple[str, dict[str, Any], Any, str, type[Exception]]] = [
    ("not-json-datetime", {"when": NOW}, {}, "are not JSON .*turn other values", dibs.InvalidArgument),
    ("not-json-object", {"thing": object()}, {}, "are not JSON", dibs.InvalidArgument),
    ("not-json-nan", {"x": float("nan")}, {}, "are not JSON", dibs.InvalidArgument),
    ("args-not-a-dict", [1, 2], {}, "must be a dict of argument names", dibs.InvalidArgument),
    ("unknown-queue", {}, {"queue": "nowhere"}, "queue 'nowhere'.*known queues: default", dibs.UnknownQueue),
    ("negative-delay", {}, {"delay": -1}, "delay must not be negative", dibs.InvalidArgument),
    ("negative-timedelta", {}, {"delay": timedelta(seconds=-5)}, "must not be negative", dibs.InvalidArgument),
    ("naive-run-at", {}, {"run_at": datetime(2030, 1, 1)}, "run_at must be a timezone-aware", dibs.InvalidArgument),
    ("run-at-and-delay", {}, {"run_at": NOW, "delay": 1}, "run_at or delay, not both", dibs.InvalidArgument),
    ("oversize", {"blob": "x" * 200}, {}, "over the limit of 100", dibs.InvalidArgument),
    ("priority-too-high", {}, {"priority": 10**9}, "priority must be a whole number", dibs.InvalidArgument),
    ("priority-text", {}, {"priority": "high"}, "priority must be a whole number", dibs.InvalidArgument),
    ("max-attempts-zero", {}, {"max_attempts": 0}, "max_attempts must be a whole number >= 1", dibs.InvalidArgument),
    ("empty-dedupe-key", {}, {"dedupe_key": ""}, "dedupe_key must be a string", dibs.InvalidArgument),
    ("unknown-option", {}, {"prio": 3}, "enqueue options are queue, priority", dibs.InvalidArgument),
]


@pytest.mark.parametrize(
    ("args", "options", "message", "error"),
    [case[1:] for case in BAD_ENQUEUES],
    ids=[case[0] for case in BAD_ENQUEUES],
)
def test_a_bad_enqueue_raises_a_helpful_error_and_writes_nothing(
    qdb: QueueDatabase, args: Any, options: dict[str, Any], message: str, error: type[Exception]
) -> None:
    app = qdb.app(max_args_bytes=100)

    @app.task(name="shop.ship")
    def ship(**_: Any) -> None: ...

    with pytest.raises(error, match=message):
        app.enqueue(ship, args, **options)
    # Nor inside a caller's transaction.
    with pytest.raises(error, match=message), qdb.engine.begin() as conn:
        app.enqueue(ship, args, conn=conn, **options)
    assert job_count(qdb.engine) == 0


def test_an_unknown_task_raises_unknown_task_and_writes_nothing(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="shop.ship")
    def ship() -> None: ...

    with pytest.raises(
        dibs.UnknownTask, match=r"no task named 'shop\.shipp' is registered; registered tasks: shop\.ship"
    ):
        app.enqueue("shop.shipp")
    elsewhere = dibs.App(qdb.engine)
    with pytest.raises(dibs.UnknownTask, match="registered with another app"):
        elsewhere.enqueue(ship)
    assert isinstance(dibs.UnknownTask("x"), LookupError)
    assert job_count(qdb.engine) == 0


def test_enqueue_many_with_one_bad_item_writes_none(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="shop.ship", ordering_key="customer")
    def ship(customer: int) -> None: ...

    batches: list[list[Any]] = [
        [{"customer": 1}, {"customer": 2, "when": NOW}, {"customer": 3}],
        [{"customer": 1}, {"other": 2}],  # the second lacks its ordering key
        [{"customer": 1}, "customer=2"],
    ]
    for batch in batches:
        with pytest.raises(dibs.InvalidArgument):
            app.enqueue_many(ship, batch)
    with pytest.raises(dibs.InvalidArgument, match="takes a list of argument dicts"):
        app.enqueue_many(ship, {"customer": 1})  # type: ignore[arg-type]
    assert job_count(qdb.engine) == 0
    assert [job.ordering_key for job in app.enqueue_many(ship, [{"customer": 1}, {"customer": 2}])] == ["1", "2"]
    assert job_count(qdb.engine) == 2


# -- dedupe --------------------------------------------------------------------------------------------


def test_a_dedupe_key_returns_the_live_job_until_it_finishes(qdb: QueueDatabase) -> None:
    app = qdb.app()
    release = threading.Event()
    ran: list[int] = []

    @app.task(name="shop.reindex")
    def reindex(shop: int) -> None:
        ran.append(shop)
        release.wait(10)

    first = app.enqueue(reindex, {"shop": 1}, dedupe_key="reindex:1")
    again = app.enqueue(reindex, {"shop": 1}, dedupe_key="reindex:1")
    assert again.id == first.id
    # In one batch, and in a caller's transaction, the key still names one job.
    with qdb.engine.begin() as conn:
        batch = app.enqueue_many(reindex, [{"shop": 1}, {"shop": 1}], dedupe_key="reindex:1", conn=conn)
    assert [job.id for job in batch] == [first.id, first.id]
    other = app.enqueue(reindex, {"shop": 2}, dedupe_key="reindex:2")
    assert other.id != first.id
    assert job_count(qdb.engine) == 2

    running = qdb.start(app, burst=True)
    try:
        wait_until(lambda: app.get(first.id).status == "running", what="the first job to start")
        assert app.enqueue(reindex, {"shop": 1}, dedupe_key="reindex:1").id == first.id  # running is live too
    finally:
        release.set()
    running.join()
    done = app.get(first.id)
    assert (done.status, done.dedupe_key) == ("succeeded", None)

    fresh = app.enqueue(reindex, {"shop": 1}, dedupe_key="reindex:1")
    assert fresh.id not in (first.id, other.id)
    assert (fresh.status, fresh.dedupe_key) == ("queued", "reindex:1")
    app.cancel(fresh.id)  # a cancelled job frees its key as well
    assert app.enqueue(reindex, {"shop": 1}, dedupe_key="reindex:1").id not in (first.id, fresh.id)
    assert len(job_rows(qdb.engine, jobs.c.dedupe_key == "reindex:1")) == 1
