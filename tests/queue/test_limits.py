"""Input no backend can store is refused by dibs before the database sees it: out-of-range times and
durations, NUL characters, counts past a 32-bit LIMIT, arguments the task cannot take. Each raises
InvalidArgument, writes nothing, and leaves a caller's transaction usable (on PostgreSQL a statement
that failed would have aborted it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.queue.database import QueueDatabase
from tests.queue.support import job_count, orders, test_metadata

PLUS_5 = timezone(timedelta(hours=5))
MINUS_5 = timezone(timedelta(hours=-5))

OUT_OF_RANGE: list[tuple[str, dict[str, Any], str]] = [
    ("delay-1e12", {"delay": 1e12}, "delay must be at most 36,500 days"),
    ("delay-huge-timedelta", {"delay": timedelta(days=999_999_999)}, "delay must be at most 36,500 days"),
    ("delay-huge-int", {"delay": 10**400}, "delay must be at most 36,500 days"),
    ("run-at-min", {"run_at": datetime.min.replace(tzinfo=PLUS_5)}, "run_at must lie from 1970-01-01"),
    ("run-at-max", {"run_at": datetime.max.replace(tzinfo=MINUS_5)}, "run_at must lie from 1970-01-01"),
    ("run-at-max-utc", {"run_at": datetime.max.replace(tzinfo=timezone.utc)}, "to before 9999-01-01"),
    ("run-at-1969", {"run_at": datetime(1969, 12, 31, tzinfo=timezone.utc)}, "run_at must lie from"),
    ("dedupe-key-nul", {"dedupe_key": "receipt\x00bob"}, "dedupe_key must not contain NUL"),
    ("ordering-key-nul", {"ordering_key": "a\x00"}, "ordering_key must not contain NUL"),
    ("ordering-key-surrogate", {"ordering_key": "a\ud800"}, "ordering_key must be valid Unicode"),
    ("dedupe-key-too-long", {"dedupe_key": "k" * 201}, "dedupe_key must be a string of 1 to 200"),
    ("queue-nul", {"queue": "default\x00"}, "queue must be 1 to 100 letters"),
    ("queue-newline", {"queue": "default\n"}, "queue must be 1 to 100 letters"),
    ("tag-nul", {"tag": "v1\x00"}, "tag must be 1 to 100 letters"),
    ("max-attempts-2-31", {"max_attempts": 2**31}, "max_attempts must be at most 2,147,483,647"),
    ("args-misfit", {"args": {"order_id": 1, "coupon": "X"}}, "do not fit the task: .*coupon.*takes \\(order_id\\)"),
    ("args-missing", {"args": {}}, "do not fit the task: missing a required argument: 'order_id'"),
]


def shop(qdb: QueueDatabase) -> tuple[dibs.App, dibs.Task]:
    app = qdb.app()

    @app.task(name="shop.send_receipt")
    def send_receipt(order_id: int) -> None: ...

    return app, send_receipt


def refused_in_a_transaction(qdb: QueueDatabase, call: Callable[[sa.Connection], Any], message: str) -> None:
    """``call`` raises InvalidArgument inside a caller's transaction, which goes on to commit its own rows."""
    test_metadata.create_all(qdb.engine)
    with qdb.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1, item="book"))
        with pytest.raises(dibs.InvalidArgument, match=message):
            call(conn)
        conn.execute(orders.insert().values(id=2, item="lamp"))
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 2
    assert job_count(qdb.engine) == 0


@pytest.mark.parametrize(("options", "message"), [case[1:] for case in OUT_OF_RANGE], ids=[c[0] for c in OUT_OF_RANGE])
def test_an_enqueue_out_of_range_is_refused_before_the_database_sees_it(
    qdb: QueueDatabase, options: dict[str, Any], message: str
) -> None:
    app, send_receipt = shop(qdb)
    options = dict(options)
    args = options.pop("args", {"order_id": 1})
    with pytest.raises(dibs.InvalidArgument, match=message):
        app.enqueue(send_receipt, args, **options)
    with pytest.raises(dibs.InvalidArgument, match=message):
        app.enqueue_many(send_receipt, [{"order_id": 2}, args], **options)
    refused_in_a_transaction(qdb, lambda conn: app.enqueue(send_receipt, args, conn=conn, **options), message)
    # The edges themselves are stored as given, on every backend.
    latest = datetime(9998, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
    assert app.enqueue(send_receipt, {"order_id": 3}, run_at=latest).run_at == latest
    assert app.enqueue(send_receipt, {"order_id": 4}, delay=timedelta(days=36_500)).status == "scheduled"
    assert app.enqueue(send_receipt, {"order_id": 5}, dedupe_key="k" * 200).dedupe_key == "k" * 200
    assert app.get(app.enqueue(send_receipt, {"order_id": 6}, max_attempts=2**31 - 1).id).max_attempts == 2**31 - 1


def test_aenqueue_refuses_the_same_input_inside_an_async_transaction(qdb: QueueDatabase) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    app, send_receipt = shop(qdb)
    test_metadata.create_all(qdb.engine)

    async def scenario() -> None:
        engine = create_async_engine(with_driver(qdb.url, ASYNC_DRIVERS[qdb.family]))
        try:
            async with engine.begin() as conn:
                for options in (
                    {"delay": 1e12},
                    {"dedupe_key": "a\x00b"},
                    {"run_at": datetime.min.replace(tzinfo=PLUS_5)},
                ):
                    with pytest.raises(dibs.InvalidArgument):
                        await app.aenqueue(send_receipt, {"order_id": 1}, conn=conn, **options)
                with pytest.raises(dibs.InvalidArgument, match="do not fit"):
                    await app.aenqueue_many(send_receipt, [{"order_id": 1}, {"id": 2}], conn=conn)
                await conn.execute(orders.insert().values(id=1, item="book"))
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert job_count(qdb.engine) == 0
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 1


def test_a_task_that_takes_context_or_any_keyword_is_checked_the_way_the_worker_calls_it(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="shop.audit")
    def audit(order_id: int, context: dibs.JobContext) -> None: ...

    @app.task(name="shop.anything")
    def anything(**_: Any) -> None: ...

    audit.enqueue({"order_id": 1})
    anything.enqueue({"whatever": 1, "context": 2})
    with pytest.raises(dibs.InvalidArgument, match="context is not an argument a job can have"):
        audit.enqueue({"order_id": 1, "context": 2})
    with pytest.raises(dibs.InvalidArgument, match="missing a required argument"):
        audit.enqueue({})
    assert job_count(qdb.engine) == 2


def test_a_job_written_by_other_means_with_misfit_arguments_still_dies_in_the_worker(qdb: QueueDatabase) -> None:
    app, send_receipt = shop(qdb)
    job = send_receipt.enqueue({"order_id": 1})
    with qdb.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job.id).values(args='{"coupon": "X"}'))
    qdb.drain(app)
    dead = app.get(job.id)
    assert dead.status == "dead"
    assert "do not fit task 'shop.send_receipt'" in (dead.last_error or "")


def test_periodic_jobs_refuse_arguments_and_intervals_out_of_range(qdb: QueueDatabase) -> None:
    app, send_receipt = shop(qdb)
    with pytest.raises(dibs.InvalidArgument, match="do not fit the task"):
        app.periodic(every=timedelta(minutes=5), args={"id": 1})(send_receipt)
    with pytest.raises(dibs.InvalidArgument, match="every= must be a timedelta of at least one second and at most"):
        app.periodic(every=timedelta(days=999_999_999), args={"order_id": 1})(send_receipt)
    assert app.schedules == {}


def test_retry_backoff_and_worker_settings_beyond_100_years_are_refused(qdb: QueueDatabase) -> None:
    for options in ({"cap": 1e12}, {"base": float("inf")}, {"factor": float("inf")}):
        with pytest.raises(dibs.InvalidArgument, match="Retry"):
            dibs.Retry(**options)
    # A steep backoff after many attempts is the cap, not an OverflowError in the worker.
    assert dibs.Retry(factor=10, cap=60, jitter=0).delay(5_000) == timedelta(seconds=60)
    assert dibs.Retry(base=1, factor=2, cap=60, jitter=0).delay(50_000) == timedelta(seconds=60)
    app, _ = shop(qdb)
    for options, message in (
        ({"lease": 1e12}, "lease must be at most 36,500 days"),
        ({"retention": timedelta(days=999_999_999)}, "retention must be at most"),
        ({"batch": 2**31}, "batch must be at most 2,147,483,647"),
        ({"name": "w" * 201}, "name must be a string of 1 to 200"),
        ({"name": "w\x00"}, "name must not contain NUL"),
    ):
        with pytest.raises(dibs.InvalidArgument, match=message):
            qdb.worker(app, **options)
    for count_or_delete in (app.purge, app.purgeable):
        with pytest.raises(dibs.InvalidArgument, match="older_than must be at most"):
            count_or_delete(older_than=timedelta(days=999_999_999))
    for limit in (2**31, -1):
        with pytest.raises(dibs.InvalidArgument, match="limit must be"):
            app.jobs(limit=limit)
    with pytest.raises(dibs.InvalidArgument, match="queue must not contain NUL"):
        app.jobs(queue="default\x00")


# -- claims and leases ---------------------------------------------------------------------------------

tickets = sa.Table("limit_tickets", test_metadata, sa.Column("id", sa.Integer, primary_key=True), *dibs.lease_columns())


def test_a_claim_past_a_32_bit_limit_is_refused_on_every_backend(qdb: QueueDatabase) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    test_metadata.create_all(qdb.engine)
    with qdb.engine.begin() as conn:
        conn.execute(tickets.insert(), [{"id": n} for n in (1, 2, 3)])
    leases = dibs.Leases(tickets)
    with pytest.raises(dibs.InvalidArgument, match="limit must be at most 2,147,483,647"):
        dibs.claim(qdb.engine, tickets, set={"status": "taken"}, limit=2**31)
    with pytest.raises(dibs.InvalidArgument, match="limit must be at most 2,147,483,647"):
        leases.claim(qdb.engine, owner="w", duration=30, limit=2**31)
    with pytest.raises(dibs.InvalidArgument, match="limit must be at most"):
        leases.claimer().claim(qdb.engine, owner="w", duration=30, limit=2**31)
    with pytest.raises(dibs.InvalidArgument, match="duration must be at most 36,500 days"):
        leases.claim(qdb.engine, owner="w", duration=1e12)
    with pytest.raises(dibs.InvalidArgument, match=r"owner .*must not contain NUL"):
        leases.claim(qdb.engine, owner="w\x00", duration=30)
    with pytest.raises(dibs.InvalidArgument, match=r"owner .*1 to 200 characters"):
        leases.claim(qdb.engine, owner="w" * 201, duration=30)

    async def claim_async() -> None:
        engine = create_async_engine(with_driver(qdb.url, ASYNC_DRIVERS[qdb.family]))
        try:
            with pytest.raises(dibs.InvalidArgument, match="limit must be at most"):
                await dibs.aclaim(engine, tickets, set={"status": "taken"}, limit=2**31)
            with pytest.raises(dibs.InvalidArgument, match="limit must be at most"):
                await leases.aclaim(engine, owner="w", duration=30, limit=2**31)
        finally:
            await engine.dispose()

    asyncio.run(claim_async())
    with qdb.engine.connect() as conn:
        assert set(conn.execute(sa.select(tickets.c.status)).scalars()) == {"ready"}
    # The largest limit claims what there is.
    assert len(dibs.claim(qdb.engine, tickets, where=tickets.c.id > 1, set={"status": "taken"}, limit=2**31 - 1)) == 2
    [held] = leases.claim(qdb.engine, owner="w" * 200, duration=timedelta(days=36_500), where=tickets.c.id == 1)
    leases.renew(qdb.engine, held, timedelta(days=36_500))
    with pytest.raises(dibs.InvalidArgument, match="duration must be at most"):
        leases.renew(qdb.engine, held, timedelta(days=999_999_999))
    test_metadata.drop_all(qdb.engine, tables=[tickets])
