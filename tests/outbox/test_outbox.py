"""The outbox on every backend: events written in the caller's transaction (and only if it commits), checked
before anything is written, and inspected and tended by hand (events, get, status, requeue, discard, purge)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import dibs
from dibs.lease import Lease
from dibs.schema import outbox as outbox_table
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.outbox.support import OutboxDatabase, add_events, aware, interleaved
from tests.queue.support import analyzed_then_finished, assert_reads_indexes, caught_statements, database_now, orders

LONG_LEASE = 60.0


def claim(outbox: dibs.Outbox, target: str = "default", limit: int = 100, worker: str = "test-relay") -> list[Lease]:
    return outbox.store.claim(outbox.engine, owner=worker, limit=limit, target=target, lease_seconds=LONG_LEASE)


def one_each(outbox: dibs.Outbox, *names: str, target: str | None = None) -> dict[str, int]:
    """One event per name, each the only event of its aggregate; their ids by name."""
    with outbox.engine.begin() as conn:
        return {
            name: outbox.add(conn, "thing", name, "thing.happened", {"name": name}, target=target) for name in names
        }


def leases_of(held: list[Lease], ids: dict[str, int], *names: str) -> list[Lease]:
    wanted = {ids[name] for name in names}
    chosen = [lease for lease in held if lease.key[0] in wanted]
    assert len(chosen) == len(wanted)
    return chosen


def in_states(outbox: dibs.Outbox) -> dict[str, int]:
    """One event in each state (each its own aggregate); their ids by state."""
    ids = one_each(outbox, "pending", "processing", "failed", "abandoned", "published")
    held = claim(outbox)
    assert len(held) == 5
    store, engine = outbox.store, outbox.engine
    assert store.release(engine, leases_of(held, ids, "pending")) == []
    assert store.fail(engine, leases_of(held, ids, "failed"), timedelta(seconds=60), "boom: the broker said no") == []
    assert store.abandon(engine, leases_of(held, ids, "abandoned"), "gone for good") == []
    assert store.complete(engine, leases_of(held, ids, "published")) == []
    return ids


def statuses(outbox: dibs.Outbox) -> dict[int, str]:
    return {event.id: event.status for event in outbox.events(limit=1000)}


# -- add -------------------------------------------------------------------------------------------------


def clock(conn: sa.Connection) -> datetime:
    """The database clock now (each statement's own time, as dibs stamps events; SQLite: the application's)."""
    if conn.dialect.name == "sqlite":
        return datetime.now(timezone.utc)
    query = "SELECT statement_timestamp()" if conn.dialect.name == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    return aware(conn.execute(sa.text(query)).scalar_one())


def test_an_event_added_in_a_committed_transaction_is_pending_with_the_database_clock(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    with outbox.engine.begin() as conn:
        before = clock(conn)
        event_id = outbox.add(
            conn, "order", "o-1", "order.placed", {"total": 990, "items": ["a", "ü"]}, headers={"tenant": "t1"}
        )
        after = clock(conn)

    event = outbox.get(event_id)
    assert (event.id, event.target, event.aggregate_type, event.aggregate_id, event.event_type) == (
        event_id,
        "default",
        "order",
        "o-1",
        "order.placed",
    )
    assert event.payload == {"total": 990, "items": ["a", "ü"]}
    assert event.headers == {"tenant": "t1"}
    assert (event.status, event.retry_count, event.attempts) == ("pending", 0, 0)
    assert (event.next_attempt_at, event.last_error, event.published_at) == (None, None, None)
    assert before <= event.created_at <= after
    (row,) = odb.rows()
    assert (row.lease_owner, row.lease_expires_at, row.lease_token) == (None, None, 0)


def test_add_on_an_engine_commits_on_its_own(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    first = outbox.add(outbox.engine, "order", "o-1", "order.placed", {"n": 1})
    second, third = outbox.add_many(
        outbox.engine,
        [
            {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.paid", "payload": {"n": 2}},
            {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.sent", "payload": {"n": 3}},
        ],
    )
    assert first < second < third
    assert [(event.id, event.event_type) for event in outbox.events()] == [
        (first, "order.placed"),
        (second, "order.paid"),
        (third, "order.sent"),
    ]


def _write_sync(odb: OutboxDatabase, outbox: dibs.Outbox, kind: str, commit: bool) -> None:
    order = {"id": 1, "item": "book"}
    events = [
        {"aggregate_type": "order", "aggregate_id": 1, "event_type": "order.paid", "payload": {"n": 2}},
        {"aggregate_type": "order", "aggregate_id": 1, "event_type": "order.sent", "payload": {"n": 3}},
    ]
    if kind == "connection":
        with outbox.engine.connect() as conn:
            transaction = conn.begin()
            conn.execute(orders.insert().values(order))
            outbox.add(conn, "order", 1, "order.placed", {"n": 1})
            outbox.add_many(conn, events)
            transaction.commit() if commit else transaction.rollback()
    else:
        with Session(outbox.engine) as session:
            session.execute(orders.insert().values(order))
            outbox.add(session, "order", 1, "order.placed", {"n": 1})
            outbox.add_many(session, events)
            session.commit() if commit else session.rollback()


async def _write_async(odb: OutboxDatabase, outbox: dibs.Outbox, kind: str, commit: bool) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    order = {"id": 1, "item": "book"}
    events = [
        {"aggregate_type": "order", "aggregate_id": 1, "event_type": "order.paid", "payload": {"n": 2}},
        {"aggregate_type": "order", "aggregate_id": 1, "event_type": "order.sent", "payload": {"n": 3}},
    ]
    engine = dibs.create_async_engine(with_driver(odb.url, ASYNC_DRIVERS[odb.family]))
    try:
        if kind == "async_connection":
            async with engine.connect() as conn:
                await conn.begin()
                await conn.execute(orders.insert().values(order))
                await outbox.aadd(conn, "order", 1, "order.placed", {"n": 1})
                await outbox.aadd_many(conn, events)
                await (conn.commit() if commit else conn.rollback())
        else:
            async with async_sessionmaker(engine)() as session:
                await session.execute(orders.insert().values(order))
                await outbox.aadd(session, "order", 1, "order.placed", {"n": 1})
                await outbox.aadd_many(session, events)
                await (session.commit() if commit else session.rollback())
    finally:
        await engine.dispose()


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "rolled-back"])
@pytest.mark.parametrize("kind", ["connection", "session", "async_connection", "async_session"])
def test_events_commit_and_roll_back_with_the_business_change(odb: OutboxDatabase, kind: str, commit: bool) -> None:
    orders.create(odb.engine)
    outbox = odb.outbox()
    if kind.startswith("async"):
        asyncio.run(_write_async(odb, outbox, kind, commit))
    else:
        _write_sync(odb, outbox, kind, commit)

    with odb.engine.connect() as conn:
        order_rows = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one()
    if commit:
        assert order_rows == 1
        events = outbox.events()
        assert [(event.aggregate_id, event.event_type) for event in events] == [
            ("1", "order.placed"),
            ("1", "order.paid"),
            ("1", "order.sent"),
        ]
        assert [event.payload for event in events] == [{"n": 1}, {"n": 2}, {"n": 3}]
    else:
        assert order_rows == 0
        assert odb.count() == 0, "an event of a rolled-back transaction was written"


@pytest.mark.parametrize("kind", ["connection", "async_connection"])
def test_add_on_a_connection_without_a_transaction_joins_the_one_it_begins(odb: OutboxDatabase, kind: str) -> None:
    """SQLAlchemy 2.0 connections begin a transaction on their first statement, which the caller then
    commits or rolls back. An add() that comes first must not commit on its own: the business change
    after it may still fail and be rolled back, and the event with it."""
    orders.create(odb.engine)
    outbox = odb.outbox()
    if kind == "connection":
        with outbox.engine.connect() as conn:
            outbox.add(conn, "order", 1, "order.placed", {"n": 1})
            conn.execute(orders.insert().values(id=1, item="book"))
            conn.rollback()
    else:

        async def scenario() -> None:
            engine = dibs.create_async_engine(with_driver(odb.url, ASYNC_DRIVERS[odb.family]))
            try:
                async with engine.connect() as conn:
                    await outbox.aadd(conn, "order", 1, "order.placed", {"n": 1})
                    await conn.execute(orders.insert().values(id=1, item="book"))
                    await conn.rollback()
            finally:
                await engine.dispose()

        asyncio.run(scenario())
    with odb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 0
    assert odb.count() == 0, "the event was committed on its own, without the business change it belongs to"


def test_an_uncommitted_event_is_invisible_until_commit(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    reader = odb.outbox()  # other connections, as a relay's
    with outbox.engine.begin() as conn:
        event_id = outbox.add(conn, "order", "o-1", "order.placed", {"n": 1})
        assert reader.events() == []
        if odb.family != "sqlite":  # SQLite: a claim (a write) would wait for this transaction's write lock
            assert claim(reader) == []
    assert [event.id for event in reader.events()] == [event_id]
    (lease,) = claim(reader)
    assert lease.key == (event_id,)
    assert reader.get(event_id).status == "processing"


def test_add_many_returns_the_ids_in_order(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    events = [
        {
            "aggregate_type": "order",
            "aggregate_id": f"o-{n % 3}",
            "event_type": f"order.step{n}",
            "payload": {"n": n},
            "headers": {"n": str(n)} if n % 2 else None,
            "target": "audit" if n == 4 else None,
        }
        for n in range(7)
    ]
    with outbox.engine.begin() as conn:
        ids = outbox.add_many(conn, events)
        assert outbox.add_many(conn, []) == []
    assert len(ids) == 7
    assert ids == sorted(ids)
    assert len(set(ids)) == 7
    stored = {event.id: event for event in outbox.events(limit=100)}
    assert sorted(stored) == ids
    for event_id, given in zip(ids, events, strict=True):
        event = stored[event_id]
        assert (event.aggregate_id, event.event_type, event.payload) == (
            given["aggregate_id"],
            given["event_type"],
            given["payload"],
        )
        assert event.headers == (given["headers"] or {})
        assert event.target == (given["target"] or "default")


def test_add_many_writes_none_when_one_event_is_bad(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    good = {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.placed", "payload": {"n": 1}}
    bad = {**good, "payload": {"when": object()}}
    with pytest.raises(dibs.InvalidArgument, match="not JSON"):
        outbox.add_many(outbox.engine, [good, good, bad, good])
    with outbox.engine.begin() as conn, pytest.raises(dibs.InvalidArgument, match="not JSON"):
        outbox.add_many(conn, [good, bad])
    assert odb.count() == 0


Call = Callable[[dibs.Outbox, sa.Connection], Any]


def _add(**overrides: Any) -> Call:
    arguments = {
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "event_type": "order.placed",
        "payload": {"n": 1},
        **overrides,
    }
    return lambda outbox, conn: outbox.add(conn, **arguments)


def _add_many(events: Any) -> Call:
    return lambda outbox, conn: outbox.add_many(conn, events)


GOOD = {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.placed", "payload": {"n": 1}}


#: (what, the call, what its InvalidArgument says)
BAD_CALLS: list[tuple[str, Call, str]] = [
    ("payload-object", _add(payload=object()), "not JSON"),
    ("payload-module", _add(payload={"at": time}), "not JSON"),
    ("payload-nan", _add(payload={"x": float("nan")}), "not JSON"),
    ("payload-infinity", _add(payload=[float("inf")]), "not JSON"),
    ("payload-tuple-key", _add(payload={("tuple", "key"): 1}), "not JSON"),
    ("payload-oversize", _add(payload="x" * 1001), "over the limit of 1,000"),
    ("aggregate-id-empty", _add(aggregate_id=""), "aggregate_id"),
    ("aggregate-id-too-long", _add(aggregate_id="x" * 201), "aggregate_id"),
    ("aggregate-id-padded", _add(aggregate_id=" o-1"), "aggregate_id"),
    ("aggregate-id-none", _add(aggregate_id=None), "aggregate_id"),
    ("aggregate-id-bool", _add(aggregate_id=True), "aggregate_id"),
    ("aggregate-id-float", _add(aggregate_id=1.5), "aggregate_id"),
    ("aggregate-type-empty", _add(aggregate_type=""), "aggregate_type"),
    ("event-type-too-long", _add(event_type="e" * 201), "event_type"),
    ("target-empty", _add(target=""), "target"),
    ("target-too-long", _add(target="t" * 101), "target"),
    ("header-value-int", _add(headers={"tenant": 1}), "headers"),
    ("header-name-int", _add(headers={1: "one"}), "headers"),
    ("header-name-empty", _add(headers={"": "empty"}), "headers"),
    ("header-value-none", _add(headers={"tenant": None}), "headers"),
    ("headers-str", _add(headers="tenant=t1"), "headers"),
    ("headers-list", _add(headers=[("tenant", "t1")]), "headers"),
    ("many-unknown-key", _add_many([{**GOOD, "colour": "red"}]), "unknown keys ['colour']"),
    ("many-missing-keys", _add_many([{"aggregate_type": "order"}]), "missing keys"),
    ("many-dict-not-list", _add_many(GOOD), "a list of event dicts"),
    ("many-str", _add_many("events"), "a list of event dicts"),
    ("many-tuple-item", _add_many([GOOD, ("order", "o-1")]), "list of dicts"),
    ("many-second-bad", _add_many([GOOD, {**GOOD, "headers": {"a": 1}}]), "headers"),
    ("many-oversize", _add_many([GOOD, {**GOOD, "payload": ["x" * 1000]}]), "over the limit of 1,000"),
]


def raised_by(call: Call, outbox: dibs.Outbox, conn: sa.Connection) -> BaseException | None:
    try:
        call(outbox, conn)
    except Exception as exc:
        return exc
    return None


def test_bad_input_is_an_invalid_argument_and_writes_nothing(odb: OutboxDatabase) -> None:
    outbox = odb.outbox(max_payload_bytes=1000)
    wrong = []
    with outbox.engine.begin() as conn:
        kept = outbox.add(conn, "order", "o-0", "order.placed", {"before": True})
        for what, call, says in BAD_CALLS:
            error = raised_by(call, outbox, conn)
            if (
                not isinstance(error, dibs.InvalidArgument)
                or not isinstance(error, ValueError)
                or says not in str(error)
            ):
                wrong.append(f"{what}: {error!r}, expected an InvalidArgument saying {says!r}")
    assert wrong == []
    # The caller's transaction went on and committed what it wrote before; nothing of the bad calls.
    assert [event.id for event in outbox.events()] == [kept]


def test_bad_input_to_aadd_is_an_invalid_argument_and_writes_nothing(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()

    async def scenario() -> None:
        engine = dibs.create_async_engine(with_driver(odb.url, ASYNC_DRIVERS[odb.family]))
        try:
            async with engine.begin() as conn:
                with pytest.raises(dibs.InvalidArgument, match="not JSON"):
                    await outbox.aadd(conn, "order", "o-1", "order.placed", {"x": float("nan")})
                with pytest.raises(dibs.InvalidArgument, match="unknown keys"):
                    await outbox.aadd_many(conn, [{**GOOD, "key": "k"}])
                with pytest.raises(dibs.InvalidArgument, match="AsyncConnection or AsyncSession"):
                    await outbox.aadd(engine, "order", "o-1", "order.placed", {})  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    with pytest.raises(dibs.InvalidArgument, match="Connection or Session"):
        outbox.add("not a connection", "order", "o-1", "order.placed", {})  # type: ignore[arg-type]
    assert odb.count() == 0


def test_integer_aggregate_ids_are_stored_as_strings(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    with outbox.engine.begin() as conn:
        first = outbox.add(conn, "order", 42, "order.placed", {})
        (second,) = outbox.add_many(
            conn, [{"aggregate_type": "order", "aggregate_id": 420, "event_type": "order.placed", "payload": {}}]
        )
    with odb.engine.connect() as conn:
        stored = {row.id: row.aggregate_id for row in conn.execute(sa.select(outbox_table))}
    assert stored == {first: "42", second: "420"}
    assert outbox.get(first).aggregate_id == "42"
    assert [event.id for event in outbox.events(aggregate_id=42)] == [first]
    assert [event.id for event in outbox.events(aggregate_id="42")] == [first]
    assert [event.id for event in outbox.events(aggregate_id=420)] == [second]


# -- inspection ------------------------------------------------------------------------------------------


def test_events_get_and_status_filter_and_count(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    store, engine = outbox.store, outbox.engine
    with engine.begin() as conn:
        o1 = [outbox.add(conn, "order", "o1", f"order.e{n}", {"n": n}) for n in range(3)]
        u1 = [outbox.add(conn, "user", "u1", f"user.e{n}", {"n": n}) for n in range(2)]
        audit = [outbox.add(conn, "order", "o1", "order.audited", {"n": n}, target="audit") for n in range(2)]
        done = outbox.add(conn, "order", "o9", "order.archived", {}, target="archive")
    time.sleep(0.3)  # the oldest pending event has waited at least this long

    first = claim(outbox)  # the head of each aggregate of the default target only
    assert sorted(lease.key[0] for lease in first) == [o1[0], u1[0]]
    by_id = {lease.key[0]: lease for lease in first}
    assert store.complete(engine, [by_id[o1[0]]]) == []
    assert store.fail(engine, [by_id[u1[0]]], timedelta(seconds=60), "boom") == []
    second = claim(outbox)  # u1's next event waits behind its failed head
    assert [lease.key[0] for lease in second] == [o1[1]]
    assert store.abandon(engine, second, "gone") == []
    (audit_lease,) = claim(outbox, target="audit", limit=1)
    assert audit_lease.key == (audit[0],)
    (archived,) = claim(outbox, target="archive")
    assert store.complete(engine, [archived]) == []

    assert [event.id for event in outbox.events(status="pending")] == [o1[2], u1[1], audit[1]]
    assert [event.id for event in outbox.events(status=["failed", "abandoned"])] == [o1[1], u1[0]]
    assert [event.id for event in outbox.events(status="processing")] == [audit[0]]
    assert [event.id for event in outbox.events(target="audit")] == audit
    assert [event.id for event in outbox.events(aggregate_type="user")] == u1
    assert [event.id for event in outbox.events(aggregate_type="order", aggregate_id="o1", target="default")] == o1
    assert [event.id for event in outbox.events(status="pending", target="default", aggregate_type="order")] == [o1[2]]
    assert [event.id for event in outbox.events(limit=2)] == o1[:2]
    assert [event.id for event in outbox.events(newest_first=True, limit=3)] == [done, audit[1], audit[0]]
    assert outbox.events(aggregate_id="nobody") == []
    with pytest.raises(dibs.InvalidArgument, match="unknown outbox event state"):
        outbox.events(status="done")

    published = outbox.get(o1[0])
    assert published.status == "published"
    assert published.published_at is not None
    assert published.created_at <= published.published_at <= database_now(odb.engine)
    failed = outbox.get(u1[0])
    assert (failed.status, failed.retry_count, failed.attempts, failed.last_error) == ("failed", 1, 1, "boom")
    assert failed.next_attempt_at is not None
    assert failed.next_attempt_at - database_now(odb.engine) > timedelta(seconds=50)
    abandoned = outbox.get(o1[1])
    assert (abandoned.status, abandoned.retry_count, abandoned.last_error) == ("abandoned", 1, "gone")
    assert outbox.get(audit[0]).status == "processing"

    status = outbox.status()
    assert [each.target for each in status] == ["archive", "audit", "default"]
    archive_status, audit_status, default_status = status
    assert default_status.counts == {"pending": 2, "processing": 0, "failed": 1, "abandoned": 1, "published": 1}
    assert audit_status.counts == {"pending": 1, "processing": 1, "failed": 0, "abandoned": 0, "published": 0}
    assert archive_status.counts == {"pending": 0, "processing": 0, "failed": 0, "abandoned": 0, "published": 1}
    assert archive_status.oldest_pending_seconds is None
    for each in (default_status, audit_status):
        assert each.oldest_pending_seconds is not None
        assert 0.25 <= each.oldest_pending_seconds < 60
    assert default_status.published_per_second == pytest.approx(1 / 60)
    assert archive_status.published_per_second == pytest.approx(1 / 60)
    assert audit_status.published_per_second == 0


def test_get_of_an_unknown_event_is_event_not_found(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    event_id = outbox.add(outbox.engine, "order", "o-1", "order.placed", {})
    with pytest.raises(dibs.EventNotFound, match=str(event_id + 1)) as raised:
        outbox.get(event_id + 1)
    assert isinstance(raised.value, LookupError)
    (lease,) = claim(outbox)
    outbox.store.complete(outbox.engine, [lease])
    assert outbox.purge() == 1
    with pytest.raises(dibs.EventNotFound):
        outbox.get(event_id)
    assert outbox.status() == []


@pytest.mark.parametrize("bad", ["1", 2**70, 0, 1.0, True])
def test_an_event_id_of_the_wrong_kind_is_invalid_on_every_database(odb: OutboxDatabase, bad: Any) -> None:
    outbox = odb.outbox()
    outbox.add(outbox.engine, "order", "o-1", "order.placed", {})
    with pytest.raises(dibs.InvalidArgument, match="an event id must be a whole number from 1 to"):
        outbox.get(bad)
    with pytest.raises(dibs.InvalidArgument, match="an event id must be a whole number"):
        outbox.discard([bad])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda outbox: outbox.relay("stdout://", bogus=1), "the relay has no setting bogus; its settings are: target"),
        (lambda outbox: outbox.events(status=5), "status must be an outbox event state or a list of them, got 5"),
        (lambda outbox: outbox.add_many(outbox.engine, None), "add_many takes a list of event dicts, got None"),
    ],
    ids=["relay-setting", "events-status", "add-many-none"],
)
def test_arguments_of_the_wrong_kind_are_invalid(odb: OutboxDatabase, call: Any, message: str) -> None:
    outbox = odb.outbox()
    with pytest.raises(dibs.InvalidArgument, match=message):
        call(outbox)
    assert outbox.events() == []


@pytest.mark.parametrize("call", ["requeue", "discard"])
def test_one_event_id_given_where_a_list_is_expected_says_so(odb: OutboxDatabase, call: str) -> None:
    outbox = odb.outbox()
    event_id = outbox.add(outbox.engine, "order", "o-1", "order.placed", {})
    with pytest.raises(dibs.InvalidArgument, match=rf"ids must be a list of event ids, got {event_id}; for one"):
        getattr(outbox, call)(event_id)


# -- by hand: requeue, discard, purge ---------------------------------------------------------------------


def test_requeue_makes_failed_and_abandoned_events_pending_with_their_retries_reset(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    ids = in_states(outbox)
    (audit_id,) = one_each(outbox, "audit-abandoned", target="audit").values()
    (audit_lease,) = claim(outbox, target="audit")
    outbox.store.abandon(outbox.engine, [audit_lease], "audit gone")
    before = {event.id: event for event in outbox.events()}

    assert outbox.requeue([ids["pending"], ids["processing"], ids["published"]]) == 0
    assert outbox.requeue([]) == 0
    assert statuses(outbox) == {**{ids[state]: state for state in ids}, audit_id: "abandoned"}
    with pytest.raises(dibs.InvalidArgument, match="only failed or abandoned"):
        outbox.requeue(status="published")
    with pytest.raises(dibs.InvalidArgument, match="only failed or abandoned"):
        outbox.requeue(status=["abandoned", "pending"])
    with pytest.raises(dibs.InvalidArgument, match="event id must be a whole number"):
        outbox.requeue(["1"])  # type: ignore[list-item]

    assert outbox.requeue(status="failed") == 1  # the failed one only
    assert outbox.requeue(target="default") == 1  # the abandoned one of the default target, not audit's
    after = {event.id: event for event in outbox.events()}
    for name in ("failed", "abandoned"):
        event = after[ids[name]]
        assert (event.status, event.retry_count, event.next_attempt_at) == ("pending", 0, None)
        assert event.last_error == before[ids[name]].last_error  # kept until published
    assert after[audit_id].status == "abandoned"
    for name in ("pending", "processing", "published"):
        assert after[ids[name]] == before[ids[name]]

    assert outbox.requeue([audit_id]) == 1
    assert outbox.get(audit_id).status == "pending"
    assert outbox.requeue() == 0  # nothing failed or abandoned is left
    # Requeued events are claimed again.
    assert sorted(lease.key[0] for lease in claim(outbox)) == sorted([ids["pending"], ids["failed"], ids["abandoned"]])


def test_discard_deletes_abandoned_events_only_and_lets_their_aggregate_go_on(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    ids = in_states(outbox)
    with outbox.engine.begin() as conn:
        head = outbox.add(conn, "order", "o-7", "order.placed", {})
        behind = outbox.add(conn, "order", "o-7", "order.paid", {})
    (pending, lease) = claim(outbox)
    assert (pending.key, lease.key) == ((ids["pending"],), (head,))
    assert outbox.store.release(outbox.engine, [pending]) == []
    assert outbox.store.abandon(outbox.engine, [lease], "no") == []
    # Under block, o-7's next event waits behind its abandoned head.
    peek = claim(outbox)
    assert [lease.key for lease in peek] == [(ids["pending"],)]
    assert outbox.store.release(outbox.engine, peek) == []

    assert outbox.discard([]) == 0
    assert outbox.discard([ids[state] for state in ("pending", "processing", "failed", "published")]) == 0
    with pytest.raises(dibs.InvalidArgument, match="event id must be a whole number"):
        outbox.discard([True])
    assert outbox.discard([ids["abandoned"], head, ids["pending"]]) == 2
    assert sorted(statuses(outbox)) == sorted(
        [ids["pending"], ids["processing"], ids["failed"], ids["published"], behind]
    )
    with pytest.raises(dibs.EventNotFound):
        outbox.get(head)
    assert sorted(lease.key[0] for lease in claim(outbox)) == sorted([ids["pending"], behind])


def test_purge_deletes_published_events_older_than_the_cutoff_only(odb: OutboxDatabase) -> None:
    outbox = odb.outbox()
    old = one_each(outbox, "old-1", "old-2")
    assert outbox.store.complete(outbox.engine, claim(outbox)) == []
    old_published = time.monotonic()
    time.sleep(0.8)
    new_begun = time.monotonic()
    ids = in_states(outbox)  # one published now, one each of the other states

    assert outbox.purgeable(older_than=timedelta(hours=1)) == 0
    assert outbox.purge(older_than=timedelta(hours=1)) == 0
    # A cutoff halfway between the two ages, however long the steps since took on a busy machine.
    now = time.monotonic()
    cutoff = ((now - old_published) + (now - new_begun)) / 2
    assert outbox.purgeable(older_than=timedelta(seconds=cutoff)) == 2
    assert outbox.purge(older_than=timedelta(seconds=cutoff)) == 2
    assert sorted(statuses(outbox)) == sorted(ids.values())
    for event_id in old.values():
        with pytest.raises(dibs.EventNotFound):
            outbox.get(event_id)
    assert outbox.purge() == 1  # the one published just now
    assert statuses(outbox) == {ids[state]: state for state in ("pending", "processing", "failed", "abandoned")}
    assert outbox.purge() == 0


@pytest.mark.parametrize(
    ("look", "state", "index"),
    [("promote due", "failed", "dibs_outbox_due"), ("recover expired", "processing", "dibs_outbox_expiry")],
)
def test_the_relays_upkeep_reads_indexes_even_with_statistics_of_a_backlog(
    odb: OutboxDatabase, look: str, state: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statistics were taken while most events were failed (waiting to be tried again) or held by
    relays; the events were then published. A relay's upkeep must still read the index of its state, not
    every published event (on PostgreSQL both reads were planned as scans of the whole table).
    """
    outbox = odb.outbox()
    add_events(outbox, interleaved(30, 100), per_transaction=1000)
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    analyzed_then_finished(
        odb.engine,
        outbox_table,
        {"status": state, "next_attempt_at": past, "lease_expires_at": past},
        {"status": "published", "lease_expires_at": None, "published_at": past},
    )
    monkeypatch.setattr("dibs.outbox.store.UPKEEP_BATCH", 100)
    store = outbox.store
    found: list[int] = []
    if look == "promote due":
        statements = caught_statements(odb.engine, lambda: found.append(store.promote_due(odb.engine)))
    else:
        statements = caught_statements(odb.engine, lambda: found.append(store.recover_expired(odb.engine)))
    assert found == [0]
    assert_reads_indexes(odb.engine, statements, "dibs_outbox", [index])
