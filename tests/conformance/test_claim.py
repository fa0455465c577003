"""The claim contract (DESIGN section 1), on every backend x driver x strategy."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.conformance.tables import fill, work_columns
from tests.helpers.harness import Harness


def make_work(db: Harness, count: int, **values: Any) -> sa.Table:
    table = db.table("work", *work_columns())
    if count:
        db.execute(table.insert(), fill(table, count, **values))
    return table


def test_returns_rows_as_stored_after_the_claim(db: Harness) -> None:
    work = make_work(db, 5, payload=lambda i: f"p{i}")
    rows = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running", work.c.attempts: work.c.attempts + 1, "claimed_by": "w1"},
        limit=3,
        order_by=work.c.id,
    )
    assert [row.id for row in rows] == [1, 2, 3]
    stored = {row.id: row for row in db.rows(sa.select(work))}
    for row in rows:
        assert (row.status, row.attempts, row.claimed_by) == ("running", 1, "w1")
        assert row == stored[row.id]
        assert row.payload == f"p{row.id}"


def test_claim_is_durable_and_the_next_claim_skips_it(db: Harness) -> None:
    work = make_work(db, 6)
    ready = work.c.status == "ready"
    first = db.claim(work, where=ready, set={"status": "running"}, limit=4, order_by="id")
    second = db.claim(work, where=ready, set={"status": "running"}, limit=4, order_by="id")
    third = db.claim(work, where=ready, set={"status": "running"}, limit=4, order_by="id")
    assert [row.id for row in first] == [1, 2, 3, 4]
    assert [row.id for row in second] == [5, 6]
    assert third == []
    # Seen from another connection: committed.
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "running")) == 6


def test_only_rows_matching_the_criteria_are_claimed(db: Harness) -> None:
    work = make_work(db, 10, status=lambda i: "ready" if i % 2 else "done", payload=lambda i: "a" if i < 6 else "b")
    rows = db.claim(
        work,
        where=[work.c.status == "ready", work.c.payload == "a"],
        set={"status": "running"},
        limit=10,
        order_by=work.c.id,
    )
    assert [row.id for row in rows] == [1, 3, 5]
    untouched = db.rows(sa.select(work.c.id, work.c.status).where(work.c.id.not_in([1, 3, 5])).order_by(work.c.id))
    assert [tuple(row) for row in untouched] == [
        (2, "done"),
        (4, "done"),
        (6, "done"),
        (7, "ready"),
        (8, "done"),
        (9, "ready"),
        (10, "done"),
    ]


def test_rows_follow_order_by_and_limit(db: Harness) -> None:
    priorities = {1: 5, 2: None, 3: 9, 4: 1, 5: 9, 6: 3, 7: None, 8: 7}
    work = make_work(db, 8, priority=priorities.__getitem__)
    rows = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running"},
        limit=4,
        # Expressions, not only columns: NULL priorities last, on every backend.
        order_by=[work.c.priority.is_(None), work.c.priority.desc(), work.c.id.desc()],
    )
    assert [row.id for row in rows] == [5, 3, 8, 1]
    rest = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running"},
        limit=10,
        order_by=[work.c.priority.is_not(None), work.c.priority, work.c.id],
    )
    assert [row.id for row in rest] == [2, 7, 4, 6]


def test_nulls_first_and_last_orderings(db: Harness) -> None:
    if not db.target.orders_nulls:
        pytest.skip("this database has no NULLS FIRST / NULLS LAST")
    priorities = {1: 5, 2: None, 3: 9, 4: 1, 5: None}
    work = make_work(db, 5, priority=priorities.__getitem__)
    first = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running"},
        limit=3,
        order_by=[work.c.priority.desc().nulls_last(), work.c.id],
    )
    assert [row.id for row in first] == [3, 1, 4]
    rest = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running"},
        limit=3,
        order_by=[work.c.priority.asc().nulls_first(), work.c.id.desc()],
    )
    assert [row.id for row in rest] == [5, 2]


def test_order_is_the_claim_order_even_when_set_changes_the_ordering_column(db: Harness) -> None:
    work = make_work(db, 5, priority=lambda i: 10 - i)
    rows = db.claim(
        work,
        where=work.c.status == "ready",
        set={"status": "running", "priority": work.c.id * 100},
        limit=3,
        order_by=work.c.priority,
    )
    assert [row.id for row in rows] == [5, 4, 3]
    assert [row.priority for row in rows] == [500, 400, 300]


def _ordering_table(db: Harness) -> sa.Table:
    """Forty rows of integers, times, flags and text, with NULLs and ties in each."""
    table = db.table(
        "ordered",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(20), nullable=False, server_default="ready"),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("due", sa.DateTime, nullable=True),
        sa.Column("flag", sa.Boolean, nullable=True),
        sa.Column("name", sa.String(20), nullable=True),
    )
    names = ["b", "B", "a", "A", "ab", "é", "z", None]
    db.execute(
        table.insert(),
        [
            {
                "id": i,
                "priority": None if i % 7 == 0 else (i * 37) % 5,
                "due": None if i % 5 == 0 else datetime(2026, 1, 1) + timedelta(hours=(i * 13) % 9),
                "flag": None if i % 6 == 0 else bool(i % 2),
                "name": names[i % len(names)],
            }
            for i in range(1, 41)
        ],
    )
    return table


ORDERINGS: dict[str, Callable[[sa.Table], list[Any]]] = {
    "integer": lambda t: [t.c.priority, t.c.id],
    "integer descending": lambda t: [t.c.priority.desc(), t.c.id.desc()],
    "time": lambda t: [t.c.due, t.c.id],
    "time descending": lambda t: [t.c.due.desc(), t.c.id],
    "flag then integer": lambda t: [t.c.flag, t.c.priority.desc(), t.c.id],
    "text": lambda t: [t.c.name, t.c.id],
    "text descending": lambda t: [t.c.name.desc(), t.c.priority, t.c.id],
    "expression": lambda t: [t.c.priority * -1, t.c.id],
}


@pytest.mark.parametrize("name", ORDERINGS)
def test_claimed_rows_come_in_the_order_the_database_sorts_them(db: Harness, name: str) -> None:
    # Where the claim sorts its rows itself (in Python, or by joining to the picked order), they must come
    # exactly as the database's own ORDER BY puts them, NULLs, collation and all.
    table = _ordering_table(db)
    order = ORDERINGS[name](table)
    expected = [row.id for row in db.rows(sa.select(table.c.id).order_by(*order))]
    claimed: list[int] = []
    while rows := db.claim(table, where=table.c.status == "ready", set={"status": "running"}, limit=15, order_by=order):
        claimed.extend(row.id for row in rows)
    assert claimed == expected


@pytest.mark.parametrize("limit", [0, -1])
def test_a_non_positive_limit_claims_nothing(db: Harness, limit: int) -> None:
    work = make_work(db, 3)
    assert db.claim(work, where=work.c.status == "ready", set={"status": "running"}, limit=limit) == []
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "ready")) == 3


def test_at_most_limit_rows_per_call(db: Harness) -> None:
    work = make_work(db, 50)
    sizes = []
    while rows := db.claim(work, where=work.c.status == "ready", set={"status": "running"}, limit=7):
        sizes.append(len(rows))
    assert sizes == [7] * 7 + [1]


def test_delete_mode_consumes_rows_and_returns_them_as_they_were(db: Harness) -> None:
    work = make_work(db, 5, payload=lambda i: f"p{i}", priority=lambda i: i % 3)
    rows = db.claim(work, where=work.c.payload != "p2", delete=True, limit=3, order_by=[work.c.priority, work.c.id])
    assert [(row.id, row.payload, row.status) for row in rows] == [
        (3, "p3", "ready"),
        (1, "p1", "ready"),
        (4, "p4", "ready"),
    ]
    assert [row.id for row in db.rows(sa.select(work.c.id).order_by(work.c.id))] == [2, 5]


def test_then_runs_in_the_claim_transaction(db: Harness) -> None:
    work = make_work(db, 4)
    audit = db.table("audit", sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))

    def record(conn: sa.Connection, rows: list[sa.Row[Any]]) -> None:
        conn.execute(audit.insert(), [{"id": row.id} for row in rows])

    rows = db.claim(
        work, where=work.c.status == "ready", set={"status": "running"}, limit=2, order_by="id", then=record
    )
    assert [row.id for row in rows] == [1, 2]
    assert sorted(row.id for row in db.rows(sa.select(audit))) == [1, 2]


def test_when_then_raises_nothing_is_claimed(db: Harness) -> None:
    work = make_work(db, 4)
    audit = db.table("audit", sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))

    class Refused(Exception):
        pass

    def record_then_refuse(conn: sa.Connection, rows: list[sa.Row[Any]]) -> None:
        conn.execute(audit.insert(), [{"id": row.id} for row in rows])
        raise Refused

    with pytest.raises(Refused):
        db.claim(work, where=work.c.status == "ready", set={"status": "running"}, limit=2, then=record_then_refuse)
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "ready")) == 4
    assert db.rows(sa.select(audit)) == []
    # And the rows are still there to claim.
    assert len(db.claim(work, where=work.c.status == "ready", set={"status": "running"}, limit=10)) == 4


def test_claim_inside_an_open_transaction_is_refused_and_writes_nothing(db: Harness) -> None:
    work = make_work(db, 2)
    arguments: dict[str, Any] = {"where": work.c.status == "ready", "set": {"status": "running"}, "limit": 2}
    if db.target.is_async:

        async def inside() -> None:
            async with db.engine.connect() as conn, conn.begin():
                await dibs.aclaim(conn, work, **arguments)

        with pytest.raises(dibs.InTransaction, match="inside an open transaction"):
            db.run(inside())
    else:
        with db.engine.connect() as conn, conn.begin(), pytest.raises(dibs.InTransaction, match="open transaction"):
            dibs.claim(conn, work, **arguments)
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "ready")) == 2


def test_claim_on_a_connection_with_no_transaction(db: Harness) -> None:
    work = make_work(db, 3)
    arguments: dict[str, Any] = {"where": work.c.status == "ready", "set": {"status": "running"}, "order_by": "id"}
    if db.target.is_async:

        async def on_connection() -> list[list[int]]:
            async with db.engine.connect() as conn:
                first = await dibs.aclaim(conn, work, limit=2, strategy=db.target.strategy, **arguments)
                second = await dibs.aclaim(conn, work, limit=2, strategy=db.target.strategy, **arguments)
                return [[row.id for row in first], [row.id for row in second]]

        claimed = db.run(on_connection())
    else:
        with db.engine.connect() as conn:
            claimed = [
                [row.id for row in dibs.claim(conn, work, limit=2, strategy=db.target.strategy, **arguments)]
                for _ in range(2)
            ]
    assert claimed == [[1, 2], [3]]
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "running")) == 3


def test_composite_primary_key(db: Harness) -> None:
    pairs = db.table(
        "pairs",
        sa.Column("tenant", sa.String(20), primary_key=True),
        sa.Column("n", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(20), nullable=False),
    )
    db.execute(pairs.insert(), [{"tenant": t, "n": n, "status": "ready"} for t in ("a", "b") for n in (1, 2, 3)])
    rows = db.claim(
        pairs,
        where=pairs.c.status == "ready",
        set={"status": "running"},
        limit=4,
        order_by=[pairs.c.n, pairs.c.tenant],
    )
    assert [(row.tenant, row.n) for row in rows] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert db.scalar(sa.select(sa.func.count()).where(pairs.c.status == "running")) == 4


def test_then_stays_atomic_on_an_engine_in_autocommit_mode(db: Harness) -> None:
    if db.target.memory:
        pytest.skip("a second engine on :memory: would be a different database")
    work = make_work(db, 3)
    audit = db.table("audit", sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))

    def record_then_refuse(conn: sa.Connection, rows: list[sa.Row[Any]]) -> None:
        conn.execute(audit.insert(), [{"id": row.id} for row in rows])
        raise LookupError("refused")

    def record(conn: sa.Connection, rows: list[sa.Row[Any]]) -> None:
        conn.execute(audit.insert(), [{"id": row.id} for row in rows])

    arguments: dict[str, Any] = {
        "where": work.c.status == "ready",
        "set": {"status": "running"},
        "limit": 2,
        "order_by": "id",
        "strategy": db.target.strategy,
    }
    if db.target.is_async:
        engine = dibs.create_async_engine(db.url, isolation_level="AUTOCOMMIT")
        with pytest.raises(LookupError):
            db.run(dibs.aclaim(engine, work, then=record_then_refuse, **arguments))
        claimed = db.run(dibs.aclaim(engine, work, then=record, **arguments))
        db.run(engine.dispose())
    else:
        engine = dibs.create_engine(db.url, isolation_level="AUTOCOMMIT")
        with pytest.raises(LookupError):
            dibs.claim(engine, work, then=record_then_refuse, **arguments)
        claimed = dibs.claim(engine, work, then=record, **arguments)
        engine.dispose()
    assert [row.id for row in claimed] == [1, 2]
    assert sorted(row.id for row in db.rows(sa.select(audit))) == [1, 2]
    assert db.scalar(sa.select(sa.func.count()).where(work.c.status == "ready")) == 1
