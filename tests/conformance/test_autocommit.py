"""On PostgreSQL with psycopg, a claim or lease write that is one statement runs without BEGIN and COMMIT, on
an engine and on a caller's connection alike, and leaves the connection exactly as it found it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

import dibs
from tests.conformance.tables import fill, leased_columns
from tests.helpers.targets import with_driver


@pytest.fixture
def engine(postgres_database: sa.URL) -> Iterator[sa.Engine]:
    engine = dibs.create_engine(with_driver(postgres_database, "postgresql+psycopg"))
    yield engine
    engine.dispose()


@pytest.fixture
def table(engine: sa.Engine) -> Iterator[sa.Table]:
    table = sa.Table("autocommit_work", sa.MetaData(), *leased_columns())
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), fill(table, 6))
    yield table
    table.drop(engine)


def _driver(conn: sa.Connection) -> Any:
    return conn.connection.dbapi_connection


def _in_transaction(conn: sa.Connection) -> bool:
    """Whether the driver connection has a transaction open (psycopg's own view)."""
    import psycopg

    dbapi_connection: Any = conn.connection.dbapi_connection
    return bool(dbapi_connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)


@pytest.mark.parametrize("on", ["engine", "connection"])
def test_single_statements_run_without_a_transaction_and_leave_the_connection_as_it_was(
    engine: sa.Engine, table: sa.Table, on: str
) -> None:
    leases = dibs.Leases(table)
    seen: list[tuple[bool, bool]] = []

    # Before each statement: is the driver in autocommit mode, and has it a transaction open (a BEGIN sent)?
    def look(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if table.name in statement:
            seen.append((bool(_driver(conn).autocommit), _in_transaction(conn)))

    with engine.connect() as conn:
        bind: Any = engine if on == "engine" else conn
        event.listen(engine, "before_cursor_execute", look)
        try:
            held = leases.claim(bind, owner="w", duration=30, limit=3, order_by="id")
            assert leases.complete_many(bind, held) == []
        finally:
            event.remove(engine, "before_cursor_execute", look)
        assert [lease.key for lease in held] == [(1,), (2,), (3,)]
        assert seen == [(True, False), (True, False)]

        # The caller's connection is back in transactions: a rollback undoes its own write.
        conn.execute(table.update().where(table.c.id == 6).values(payload="kept?"))
        assert _in_transaction(conn)
        conn.rollback()
    with engine.connect() as conn:
        assert not _driver(conn).autocommit
        assert conn.scalar(sa.select(table.c.payload).where(table.c.id == 6)) is None
        assert conn.scalar(sa.select(sa.func.count()).where(table.c.status == "done")) == 3


def test_a_write_inside_the_callers_transaction_joins_it(engine: sa.Engine, table: sa.Table) -> None:
    leases = dibs.Leases(table)
    held = leases.claim(engine, owner="w", duration=30, limit=2, order_by="id")
    with engine.connect() as conn:
        conn.begin()
        assert leases.complete_many(conn, held) == []
        assert not _driver(conn).autocommit
        conn.rollback()
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).where(table.c.status == "done")) == 0


def test_a_failed_statement_leaves_no_connection_in_autocommit(engine: sa.Engine, table: sa.Table) -> None:
    leases = dibs.Leases(table)
    with engine.connect() as conn, engine.connect() as other:
        pid = conn.scalar(sa.text("SELECT pg_backend_pid()"))
        conn.exec_driver_sql("SET lock_timeout = 1")
        conn.commit()
        # Another connection holds the table: the claim's statement fails at once.
        other.execute(sa.text(f"LOCK TABLE {table.name} IN ACCESS EXCLUSIVE MODE"))
        with pytest.raises(sa.exc.DBAPIError, match="lock timeout"):
            leases.claim(conn, owner="w", duration=30, limit=1)
        other.rollback()
        assert not _driver(conn).autocommit
        assert conn.scalar(sa.text("SELECT pg_backend_pid()")) == pid
        conn.exec_driver_sql("RESET lock_timeout")
        conn.commit()
    with engine.connect() as conn:
        assert not _driver(conn).autocommit


def test_a_claim_loop_on_an_autocommit_connection_leaves_it_in_autocommit(engine: sa.Engine, table: sa.Table) -> None:
    leases = dibs.Leases(table)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        batches = []
        while held := leases.claim(conn, owner="w", duration=30, limit=4, order_by="id"):
            assert leases.complete_many(conn, held) == []
            assert _driver(conn).autocommit
            assert not _in_transaction(conn)
            batches.append(held)
        assert [[lease.key[0] for lease in held] for held in batches] == [[1, 2, 3, 4], [5, 6]]
        # A second completion of the same leases changes nothing and says so.
        assert leases.complete_many(conn, batches[0]) == batches[0]
        assert _driver(conn).autocommit
    with engine.connect() as conn:
        assert not _driver(conn).autocommit
        assert conn.scalar(sa.select(sa.func.count()).where(table.c.status == "done")) == 6
