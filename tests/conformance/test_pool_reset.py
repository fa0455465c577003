"""A connection goes back to the pool clean: rolled back on return unless dibs just ended its transaction,
which on MySQL and MariaDB saves the ROLLBACK the driver would send to an idle connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs


def _rollbacks(conn: sa.Connection) -> int:
    return int(conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_rollback'").one()[1])


@pytest.fixture
def one_connection_app(queue_url: sa.URL) -> Iterator[dibs.App]:
    """An App whose engine holds one connection, so that each call below uses the same session."""
    app = dibs.App(dibs.create_engine(queue_url, pool_size=1, max_overflow=0))

    @app.task(name="shop.note")
    def note(n: int) -> None: ...

    yield app
    app.engine.dispose()


def test_dibs_transactions_on_mysql_go_back_to_the_pool_without_a_rollback(one_connection_app: dibs.App) -> None:
    app = one_connection_app
    if app.engine.dialect.name != "mysql":
        pytest.skip("only the MySQL drivers send ROLLBACK to a connection with no transaction open")
    with app.engine.connect() as conn:
        before = _rollbacks(conn)  # this block's own transaction is rolled back as it ends: one
    app.enqueue("shop.note", {"n": 1})
    app.enqueue_many("shop.note", [{"n": 2}, {"n": 3}])
    where = {"queues": ["default"], "tasks": ["shop.note"], "tags": []}
    [lease] = app.store.claim(app.engine, owner="w", lease_seconds=30, limit=1, **where)
    assert app.store.succeed(app.engine, [lease]) == []
    with app.engine.connect() as conn:
        assert _rollbacks(conn) == before + 1


def test_a_connection_given_back_in_a_transaction_is_rolled_back(one_connection_app: dibs.App) -> None:
    app = one_connection_app
    app.enqueue("shop.note", {"n": 1})
    # A transaction the pool's user left open on the driver's connection, where SQLAlchemy cannot see it.
    raw = app.engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute("UPDATE dibs_jobs SET priority = 9")
    cursor.close()
    raw.close()
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(jobs.c.priority)).scalars().all() == [0]


def test_a_pool_reset_the_caller_chose_is_kept(queue_url: sa.URL) -> None:
    engine = dibs.create_engine(queue_url, pool_size=1, max_overflow=0, pool_reset_on_return="rollback")
    try:
        app = dibs.App(engine)

        @app.task(name="shop.note")
        def note(n: int) -> None: ...

        app.enqueue("shop.note", {"n": 1})
        raw = engine.raw_connection()
        cursor = raw.cursor()
        cursor.execute("UPDATE dibs_jobs SET priority = 9")
        cursor.close()
        raw.close()
        with engine.connect() as conn:
            assert conn.execute(sa.select(jobs.c.priority)).scalars().all() == [0]
            if engine.dialect.name == "mysql":
                rolled_back = _rollbacks(conn)
        if engine.dialect.name == "mysql":
            app.enqueue("shop.note", {"n": 2})
            with engine.connect() as conn:
                assert _rollbacks(conn) == rolled_back + 2  # the pool's own reset after the enqueue's COMMIT
    finally:
        engine.dispose()
