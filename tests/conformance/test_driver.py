"""Lease statements run on the driver's cursor unless someone watches the engine, both ways giving the same rows;
on psycopg a connection keeps a cursor per thread for its small statements."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from dibs.dialects import driver
from tests.conformance.tables import make_leased
from tests.helpers.harness import Harness


def _sync_engine(db: Harness) -> sa.Engine:
    engine: Any = db.engine
    return engine.sync_engine if hasattr(engine, "sync_engine") else engine


def test_watched_and_unwatched_lease_statements_give_the_same_rows(db: Harness) -> None:
    table, leases = make_leased(db, 6)
    quiet = db.lease(leases, "claim", owner="w", duration=30, limit=3, order_by="id")
    seen: list[str] = []

    def look(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    engine = _sync_engine(db)
    event.listen(engine, "before_cursor_execute", look)
    try:
        watched = db.lease(leases, "claim", owner="w", duration=30, limit=3, order_by="id")
        assert db.lease(leases, "complete_many", watched) == []
    finally:
        event.remove(engine, "before_cursor_execute", look)
    assert db.lease(leases, "complete_many", quiet) == []

    # A tracer sees the claim and the completion while it listens.
    assert any(table.name in statement and "UPDATE" in statement.upper() for statement in seen)
    assert [lease.key for lease in quiet + watched] == [(1,), (2,), (3,), (4,), (5,), (6,)]
    for fast, slow in zip(quiet, watched, strict=True):
        assert fast.row._fields == slow.row._fields
        assert [type(value) for value in fast.row] == [type(value) for value in slow.row]
        assert (fast.token, type(fast.expires_at), fast.expires_at.tzinfo is not None) == (
            slow.token,
            type(slow.expires_at),
            True,
        )
    stored = {row.id: row for row in db.rows(sa.select(table))}
    assert all(stored[key].status == "done" for key in range(1, 7))


def test_a_lease_claim_returns_rows_exactly_as_stored(db: Harness) -> None:
    table, leases = make_leased(db, 4)
    held = db.lease(leases, "claim", owner="w", duration=30, limit=4, order_by=table.c.id.desc())
    assert [lease.key for lease in held] == [(4,), (3,), (2,), (1,)]
    stored = {row.id: row for row in db.rows(sa.select(table))}
    for lease in held:
        assert lease.row == stored[lease.key[0]]


def kept_cursor(conn: sa.Connection) -> Any:
    return conn.connection.info["dibs_cursor"][1]


def test_a_psycopg_connection_keeps_one_cursor_and_takes_a_fresh_one_after_an_error(postgres_database: sa.URL) -> None:
    engine = sa.create_engine(postgres_database.set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            with conn.begin():
                assert driver.fetch_text(conn, "SELECT %s", [1]) == [(1,)]
                kept = kept_cursor(conn)
                assert driver.fetch_text(conn, "SELECT %s, %s", [2, 3]) == [(2, 3)]
                assert kept_cursor(conn) is kept
            with pytest.raises(sa.exc.DBAPIError, match="division by zero"), conn.begin():
                driver.fetch_text(conn, "SELECT 1 / %s", [0])
            # The cursor that saw the error is not used again.
            assert "dibs_cursor" not in conn.connection.info
            with conn.begin():
                assert driver.fetch_text(conn, "SELECT %s", [4]) == [(4,)]
                assert kept_cursor(conn) is not kept
            # Nor is one left in the middle of a statement by an error of Python's.
            kept = kept_cursor(conn)
            one = sa.literal_column("1")

            def failing() -> None:
                raise ZeroDivisionError

            with pytest.raises(ZeroDivisionError), conn.begin():
                driver.fetch_values_meanwhile(conn, sa.select(one), {}, [one], failing)
            assert conn.connection.info.get("dibs_cursor") is None
            assert kept.closed
            driver_connection = conn.connection.dbapi_connection
        # Back from the pool, the same driver connection comes with its cursor.
        with engine.connect() as conn, conn.begin():
            assert conn.connection.dbapi_connection is driver_connection
            assert driver.fetch_text(conn, "SELECT %s", [5]) == [(5,)]
            again = kept_cursor(conn)
        with engine.connect() as conn, conn.begin():
            assert driver.fetch_text(conn, "SELECT %s", [6]) == [(6,)]
            assert kept_cursor(conn) is again
        # A large result is not kept in memory until the next statement, nor are large parameters.
        with engine.connect() as conn, conn.begin():
            assert len(driver.fetch_text(conn, "SELECT generate_series(1, 1000)", [])) == 1000
            assert "dibs_cursor" not in conn.connection.info
            assert driver.fetch_text(conn, "SELECT length(%s)", ["x" * 100_000]) == [(100_000,)]
            assert "dibs_cursor" not in conn.connection.info
    finally:
        engine.dispose()


def test_a_cursor_kept_for_one_thread_is_not_handed_to_another_on_the_same_connection(
    postgres_database: sa.URL,
) -> None:
    # A StaticPool hands every thread the same driver connection; a cursor kept for one thread must not
    # serve another, whose statement could run between the first one's execute and its fetch.
    import psycopg

    url = postgres_database
    shared = psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: shared, poolclass=sa.StaticPool)
    theirs: list[Any] = []

    def select_elsewhere() -> None:
        with engine.connect() as conn, conn.begin():
            assert conn.connection.dbapi_connection is shared
            assert driver.fetch_text(conn, "SELECT %s", [2]) == [(2,)]
            theirs.append(kept_cursor(conn))

    try:
        with engine.connect() as conn, conn.begin():
            assert driver.fetch_text(conn, "SELECT %s", [1]) == [(1,)]
            mine = kept_cursor(conn)
            other = threading.Thread(target=select_elsewhere)
            other.start()
            other.join()
            assert len(theirs) == 1
            assert theirs[0] is not mine
            # Back on this thread, a cursor of its own again.
            assert driver.fetch_text(conn, "SELECT %s", [3]) == [(3,)]
            assert kept_cursor(conn) is not theirs[0]
    finally:
        engine.dispose()
        shared.close()
