"""Every public operation and capability of the backend, called directly on every database and driver.

The rest of dibs reaches the backend only through ``backend_for(dialect)``; these tests pin down what each
method returns or does there, so that a backend (or a driver's flags) cannot drift without a test saying so.
Strategies do not change the backend, so each driver runs once, with its native strategy.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

import dibs
from dibs.dialects import STRATEGIES, Backend, backend_for
from dibs.dialects.base import Name, from_now, resolve_times
from dibs.dialects.inserts import Returning
from dibs.schema import Timestamp, aware
from tests.helpers.fixtures import target_url
from tests.helpers.harness import Harness
from tests.helpers.targets import TARGETS

T = TypeVar("T")
DRIVERS = [target for target in TARGETS if target.strategy is None]
FAMILY_BACKEND = {"postgresql": "postgresql", "sqlite": "sqlite", "mariadb": "mysql"}
#: The families some of whose servers return no inserted rows (SQLite before 3.35, MySQL), where the way
#: without RETURNING is taken in earnest: it is tested on their drivers with RETURNING switched off.
WITHOUT_RETURNING = {"sqlite", "mariadb"}


@pytest.fixture(params=DRIVERS, ids=[target.id for target in DRIVERS])
def db(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Harness]:
    harness = Harness(request.param, target_url(request, request.param, tmp_path), table_prefix="backend_")
    try:
        yield harness
    finally:
        harness.close()


def on_connection(db: Harness, work: Callable[[sa.Connection], T]) -> T:
    """``work`` on a sync Connection of the target's engine (through run_sync on asyncio drivers)."""
    if not db.target.is_async:
        with db.engine.connect() as conn:
            return work(conn)

    async def run() -> T:
        async with db.engine.connect() as conn:
            return await conn.run_sync(work)  # type: ignore[no-any-return]

    return db.run(run())


def backend_of(db: Harness) -> Backend:
    return backend_for(db.engine.dialect)


def database_now(db: Harness) -> datetime:
    return on_connection(db, lambda conn: aware(conn.execute(sa.select(backend_of(db).now())).scalar_one()))


def keyed(db: Harness, name: str = "keyed") -> sa.Table:
    """A table of integer keys with a token, a unique name and a time."""
    return db.table(
        name,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("token", sa.Integer, nullable=False, server_default="0"),
        sa.Column("label", sa.String(50), nullable=True, unique=True),
        sa.Column("at", Timestamp, nullable=True),
    )


# -- identity and capabilities -----------------------------------------------------------------------------


def test_the_backend_is_the_one_for_the_family_and_its_capabilities_say_what_the_database_does(db: Harness) -> None:
    backend = backend_of(db)
    assert backend.name == FAMILY_BACKEND[db.family]
    assert backend.atomic_statements is (db.family in ("postgresql", "sqlite"))
    # SQLite takes one writer at a time: a second connection of one worker would only wait for the first.
    assert backend.default_worker_connections == (1 if db.family == "sqlite" else 2)
    assert backend.partial_indexes is (db.family != "mariadb")
    strategy = backend.native_strategy(db.engine.dialect)
    assert strategy.name in STRATEGIES


def test_partial_indexes_are_offered_where_create_index_takes_a_where(db: Harness) -> None:
    table = keyed(db)
    index_sql = f"CREATE INDEX {table.name}_where ON {table.name} (token) WHERE token > 0"
    with db.admin.begin() as conn:
        if backend_of(db).partial_indexes:
            conn.exec_driver_sql(index_sql)
        else:
            with pytest.raises(sa.exc.DBAPIError):
                conn.exec_driver_sql(index_sql)


def test_the_guarded_write_way_matches_what_the_driver_reports(db: Harness) -> None:
    table = keyed(db)
    db.execute(table.insert(), [{"token": 1}, {"token": 1}])
    way = backend_of(db).guarded_write(db.engine.dialect)

    def write(conn: sa.Connection) -> tuple[list[Any], int]:
        with conn.begin():
            change = sa.update(table).where(table.c.token == 1).values(token=1)
            if way == "returning":
                return [row.id for row in conn.execute(change.returning(table.c.id))], -1
            # Counting relies on rows that matched being counted even when no value changed.
            return [], conn.execute(change).rowcount

    returned, counted = on_connection(db, write)
    if way == "returning":
        assert sorted(returned) == [1, 2]
    elif way == "counting":
        assert counted == 2
    assert way == ("counting" if db.family == "mariadb" else "returning")


# -- time -------------------------------------------------------------------------------------------------


def test_now_after_and_from_now_read_the_database_clock(db: Harness) -> None:
    backend = backend_of(db)
    before = database_now(db)

    def read(conn: sa.Connection) -> tuple[datetime, datetime]:
        after = resolve_times({"later": backend.after_value(30)})
        later = conn.execute(sa.select(backend.after("later")), after).scalar_one()
        earlier = conn.execute(sa.select(from_now(backend, -60))).scalar_one()
        return aware(later), aware(earlier)

    later, earlier = on_connection(db, read)
    now = database_now(db)
    assert before + timedelta(seconds=29) <= later <= now + timedelta(seconds=31)
    assert before - timedelta(seconds=61) <= earlier <= now - timedelta(seconds=59)


def test_elapsed_tells_rows_whose_time_has_passed(db: Harness) -> None:
    backend = backend_of(db)
    table = keyed(db)
    now = database_now(db)
    db.execute(table.insert(), [{"token": 30, "at": now - timedelta(seconds=60)}, {"token": 30, "at": now}])
    old = on_connection(
        db, lambda conn: conn.execute(sa.select(table.c.id).where(backend.elapsed(table.c.at, table.c.token))).all()
    )
    assert [row.id for row in old] == [1]


def test_utc_value_is_what_the_database_stores_for_an_aware_time(db: Harness) -> None:
    backend = backend_of(db)
    table = keyed(db)
    given = datetime(2030, 5, 6, 9, 30, 15, 250000, tzinfo=timezone(timedelta(hours=2)))
    value = backend.utc_value(given)
    if db.family == "postgresql":
        assert (value, value.tzinfo) == (given, timezone.utc)
    else:
        assert (value, value.tzinfo) == (datetime(2030, 5, 6, 7, 30, 15, 250000), None)
    db.execute(table.insert(), {"at": value})
    assert aware(db.scalar(sa.select(table.c.at))) == given


# -- statements -------------------------------------------------------------------------------------------


def test_one_of_matches_the_values_of_a_list_parameter(db: Harness) -> None:
    backend = backend_of(db)
    table = keyed(db)
    db.execute(table.insert(), [{"token": token} for token in (1, 2, 3)])
    query = sa.select(table.c.id).where(backend.one_of(table.c.token, "tokens")).order_by(table.c.id)

    def found(conn: sa.Connection) -> list[list[int]]:
        return [[row.id for row in conn.execute(query, {"tokens": tokens})] for tokens in ([2, 3], [2], [])]

    assert on_connection(db, found) == [[2, 3], [2], []]


def test_fenced_guards_each_row_by_its_key_and_token(db: Harness) -> None:
    backend = backend_of(db)
    table = keyed(db)
    db.execute(table.insert(), [{"token": token} for token in (1, 1, 1, 1)])
    change = sa.update(table).where(backend.fenced([table.c.id], table.c.token)).values(token=table.c.token + 10)
    # Row 2's token is stale, row 3 is listed twice (its newer token holds), row 4 is not listed.
    pairs = [(1, 1), (2, 0), (3, 0), (3, 1)]

    def write(conn: sa.Connection) -> None:
        with conn.begin():
            conn.execute(change, backend.fenced_values([table.c.id], pairs))

    on_connection(db, write)
    assert [tuple(row) for row in db.rows(sa.select(table.c.id, table.c.token).order_by(table.c.id))] == [
        (1, 11),
        (2, 1),
        (3, 11),
        (4, 1),
    ]


def test_insert_new_leaves_out_a_taken_value_without_ending_the_transaction(db: Harness) -> None:
    backend = backend_of(db)
    table = keyed(db)

    def insert(conn: sa.Connection) -> None:
        with conn.begin():
            statement = backend.insert_new(table, table.c.label)
            conn.execute(statement, {"label": "a", "token": 1})
            conn.execute(statement, {"label": "a", "token": 2})
            conn.execute(statement, {"label": "b", "token": 3})

    on_connection(db, insert)
    assert [tuple(row) for row in db.rows(sa.select(table.c.label, table.c.token).order_by(table.c.label))] == [
        ("a", 1),
        ("b", 3),
    ]


@contextlib.contextmanager
def returning_off(db: Harness, off: bool) -> Iterator[None]:
    """The engine's dialect told its driver returns no inserted rows (as MySQL's does), when ``off``."""
    on_connection(db, lambda conn: None)  # the first connection sets the flag from the server's version
    dialect = db.engine.dialect
    saved = dialect.insert_returning
    if off:
        dialect.insert_returning = False
    try:
        yield
    finally:
        dialect.insert_returning = saved


def _build(table: sa.Table, built: list[Returning]) -> Callable[[Returning], sa.Insert]:
    def build(returning: Returning) -> sa.Insert:
        built.append(returning)
        statement = sa.insert(table)
        if returning == "none":
            return statement
        return statement.returning(table.c.id, table.c.token, sort_by_parameter_order=returning == "sorted rows")

    return build


@pytest.mark.parametrize("returning", [True, False], ids=["as-the-driver-does", "without-returning"])
@pytest.mark.parametrize("count", [1, 3])
def test_insert_rows_gives_back_each_row_or_id_in_order(db: Harness, returning: bool, count: int) -> None:
    backend = backend_of(db)
    table = keyed(db)
    built: list[Returning] = []
    rows = [{"token": 10 * (index + 1)} for index in range(count)]

    def insert(conn: sa.Connection) -> Any:
        with conn.begin():
            return backend.insert_rows(conn, _build(table, built), rows)

    with returning_off(db, not returning):
        inserted = on_connection(db, insert)
    stored = {row.id: row.token for row in db.rows(sa.select(table))}
    if inserted.ids:
        assert (inserted.rows, built) == ([], ["none"])
        assert [stored[key] for key in inserted.ids] == [row["token"] for row in rows]
    else:
        assert built == (["rows"] if count == 1 else ["sorted rows"])
        assert [(row.id, row.token) for row in inserted.rows] == [(key, stored[key]) for key in sorted(stored)]
    dialect = db.engine.dialect
    in_one = dialect.insert_returning and (count == 1 or dialect.insert_executemany_returning_sort_by_parameter_order)
    assert bool(inserted.ids) is (not returning or not in_one)


@pytest.mark.parametrize("returning", [True, False], ids=["as-the-driver-does", "without-returning"])
def test_insert_one_new_gives_the_row_or_its_id_and_none_when_left_out(db: Harness, returning: bool) -> None:
    if not returning and db.family not in WITHOUT_RETURNING:
        pytest.skip("every PostgreSQL server returns inserted rows; its drivers give no id without RETURNING")
    backend = backend_of(db)
    table = keyed(db)

    def build(how: Returning) -> sa.Insert:
        statement = backend.insert_new(table, table.c.label)
        return statement if how == "none" else statement.returning(table.c.id, table.c.label)

    def insert(conn: sa.Connection) -> tuple[Any, Any]:
        with conn.begin():
            first = backend.insert_one_new(conn, build, {"label": "a", "token": 1})
            again = backend.insert_one_new(conn, build, {"label": "a", "token": 2})
            return first, again

    with returning_off(db, not returning):
        first, again = on_connection(db, insert)
    stored = db.scalar(sa.select(table.c.id).where(table.c.label == "a"))
    assert first == stored if isinstance(first, int) else tuple(first) == (stored, "a")
    assert isinstance(first, int) is (not returning or not db.engine.dialect.insert_returning)
    assert again is None


# -- transactions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("opened", ["transaction", "writing"])
def test_transaction_and_writing_commit_on_success_and_roll_back_on_error(db: Harness, opened: str) -> None:
    backend = backend_of(db)
    table = keyed(db)

    def write(conn: sa.Connection) -> None:
        with getattr(backend, opened)(conn):
            conn.execute(table.insert(), {"label": "kept"})
        with contextlib.suppress(ZeroDivisionError), getattr(backend, opened)(conn):
            conn.execute(table.insert(), {"label": "undone"})
            raise ZeroDivisionError
        assert not conn.in_transaction()

    on_connection(db, write)
    assert [row.label for row in db.rows(sa.select(table.c.label))] == ["kept"]


@pytest.mark.parametrize("owned", [True, False], ids=["dibs-connection", "callers-connection"])
def test_one_statement_commits_its_statement_and_leaves_no_transaction_open(db: Harness, owned: bool) -> None:
    backend = backend_of(db)
    table = keyed(db)
    db.execute(table.insert(), [{"token": 1}])

    def write(conn: sa.Connection) -> bool:
        with backend.one_statement(conn, owned=owned):
            conn.execute(sa.update(table).values(token=2))
            driver: Any = conn.connection.dbapi_connection
            # psycopg's autocommit, or pysqlite's: no transaction left open by the statement it just ran.
            committing = getattr(driver, "autocommit", None) is True or (
                getattr(driver, "isolation_level", "") is None and getattr(driver, "in_transaction", True) is False
            )
        assert not conn.in_transaction()
        if db.family == "sqlite":  # switched back to pysqlite's transactions
            assert getattr(conn.connection.dbapi_connection, "isolation_level", "") is not None
        return committing

    committing = on_connection(db, write)
    assert db.scalar(sa.select(table.c.token)) == 2
    # psycopg and pysqlite run the statement in autocommit, without BEGIN and COMMIT; other drivers in a
    # transaction.
    if db.target.driver in ("postgresql+psycopg", "sqlite+pysqlite") and not db.target.is_async:
        assert committing


def test_an_sqlite_statement_run_alone_waits_for_another_writer_instead_of_failing(tmp_path: Any) -> None:
    # Outside a transaction, SQLite takes the write lock as the statement starts, waiting on the busy
    # handler as BEGIN IMMEDIATE would; it must not fail at once with SQLITE_BUSY.
    import sqlite3

    path = tmp_path / "held.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode = WAL")  # as dibs's engine sets it
    holder.execute("CREATE TABLE counted (n INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO counted VALUES (1)")
    engine = dibs.create_engine(f"sqlite:///{path}")
    released = threading.Timer(0.3, holder.commit)
    released.start()
    try:
        with engine.connect() as conn, backend_for(engine.dialect).one_statement(conn, owned=True):
            conn.exec_driver_sql("INSERT INTO counted VALUES (2)")
    finally:
        released.join()
        engine.dispose()
    assert holder.execute("SELECT n FROM counted ORDER BY n").fetchall() == [(1,), (2,)]
    holder.close()


# -- errors, engines, names -------------------------------------------------------------------------------


def test_translate_leaves_errors_dibs_does_not_know(db: Harness) -> None:
    backend = backend_of(db)

    def fail(conn: sa.Connection) -> sa.exc.DBAPIError:
        with pytest.raises(sa.exc.DBAPIError) as caught:
            conn.exec_driver_sql("SELECT * FROM no_such_table_here")
        return caught.value

    assert backend.translate(on_connection(db, fail)) is None


def test_sqlite_translates_a_lock_held_past_the_busy_timeout_to_busy(tmp_path: Any) -> None:
    import sqlite3

    path = tmp_path / "locked.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.01})
    try:
        with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        engine.dispose()
        holder.rollback()
        holder.close()
    assert isinstance(backend_for(engine.dialect).translate(caught.value), dibs.Busy)


def test_engine_options_add_the_backend_defaults_and_keep_the_callers(db: Harness) -> None:
    backend = backend_of(db)
    if db.family == "sqlite":
        assert backend.engine_options({}) == {"connect_args": {"timeout": 10.0}}
        assert backend.engine_options({"connect_args": {"timeout": 1}}) == {"connect_args": {"timeout": 1}}
    elif db.family == "mariadb":
        # The pool's rollback on return is replaced by dibs's own reset (configure), unless the caller chose one.
        assert backend.engine_options({"pool_size": 3}) == {"pool_size": 3, "pool_reset_on_return": None}
        chosen = {"pool_reset_on_return": "rollback"}
        assert backend.engine_options(chosen) == chosen
    else:
        assert backend.engine_options({"pool_size": 3}) == {"pool_size": 3}


def test_configure_tunes_the_engines_dibs_creates(db: Harness) -> None:
    url = db.url.set(drivername=db.target.sync_driver)
    engine = sa.create_engine(url, poolclass=sa.pool.StaticPool) if db.target.memory else sa.create_engine(url)
    try:
        backend_for(engine.dialect).configure(engine, {})
        with engine.connect() as conn:
            if db.family == "sqlite":
                # WAL lets readers go on while a writer writes; an in-memory database has no journal file.
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == ("memory" if db.target.memory else "wal")
            else:
                assert conn.execute(sa.select(1)).scalar() == 1
    finally:
        engine.dispose()


def test_make_names_exact_brings_older_name_columns_to_compare_byte_for_byte(db: Harness) -> None:
    backend = backend_of(db)
    older = db.table("named", sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.String(20)))
    db.execute(older.insert(), [{"id": 1, "name": "k"}])
    current = sa.Table(
        older.name, sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", Name(20))
    )

    def exact(conn: sa.Connection) -> None:
        with conn.begin():
            backend.make_names_exact(conn, current)

    on_connection(db, exact)
    matches = db.rows(sa.select(older.c.id).where(older.c.name.in_(["K", "k "])))
    assert matches == []
    assert [row.id for row in db.rows(sa.select(older.c.id).where(older.c.name == "k"))] == [1]


# -- notifications ----------------------------------------------------------------------------------------


def test_notify_wakes_a_listener_where_the_database_and_driver_have_notifications(db: Harness) -> None:
    backend = backend_of(db)
    engine = db.admin  # listening takes a sync Engine, as the worker's and the relay's are
    heard: list[str] = []
    woken = threading.Event()

    def hear(payload: str) -> None:
        if payload:
            heard.append(payload)
            woken.set()

    listener = backend.listen(engine, "dibs_backend_test", hear)
    notify = backend.notify("dibs_backend_test")
    if db.family != "postgresql":
        assert (listener, notify) == (None, None)
        return
    assert notify is not None
    assert (listener is not None) is (engine.dialect.driver == "psycopg")
    if listener is None:
        return
    try:
        deadline = datetime.now() + timedelta(seconds=10)
        while not woken.is_set() and datetime.now() < deadline:
            with db.admin.begin() as conn:
                conn.execute(notify, {"dibs_payload": "hello"})
            woken.wait(0.2)
    finally:
        listener.close()
    assert heard
    assert set(heard) == {"hello"}
