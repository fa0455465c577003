"""Batch enqueue: the jobs returned are the rows stored, in order, across as many statements as a batch
takes, with per-job ordering keys, schedules and parents; all or nothing in a caller's transaction; and on
PostgreSQL the one notification that wakes workers travels with the insert, only for jobs ready now."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import pickle
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

import dibs
from dibs.dialects import unnest
from dibs.queue.enqueue import CHANNEL
from dibs.queue.job import Job
from dibs.schema import jobs
from tests.helpers.targets import ASYNC_DRIVERS, with_driver
from tests.queue.database import QueueDatabase
from tests.queue.support import job_count

#: Enough jobs for several statements of a multi-row VALUES batch (512 rows at most each).
MANY = 1300


class Rollback(Exception):
    """Raised to roll a transaction back."""


def stored(qdb: QueueDatabase) -> list[Job]:
    with qdb.engine.connect() as conn:
        return [Job.from_row(row) for row in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


def shop_app(qdb: QueueDatabase) -> tuple[dibs.App, dibs.Task]:
    app = qdb.app(queues=["bulk"])

    @app.task(name="shop.reindex", ordering_key="shop")
    def reindex(shop: int, note: str = "") -> None:
        return None

    return app, reindex


def test_a_batch_returns_its_jobs_exactly_as_stored_in_order(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    args = [{"shop": n % 7, "note": f"ré-{n} ✓"} for n in range(MANY)]
    now = app.enqueue_many(reindex, args)
    later = app.enqueue_many(reindex, args[:3], delay=3600, priority=5, tag="night", max_attempts=2)
    at = datetime(2031, 5, 4, 3, 2, 1, 123456, tzinfo=timezone.utc)
    timed = app.enqueue_many(reindex, args[:2], run_at=at, queue="bulk", ordering_key="fixed")
    assert stored(qdb) == [*now, *later, *timed]
    assert [job.args for job in now] == args
    assert [job.ordering_key for job in now[:8]] == ["0", "1", "2", "3", "4", "5", "6", "0"]
    assert {job.status for job in now} == {"queued"}
    assert {(job.status, job.priority, job.tag, job.max_attempts) for job in later} == {("scheduled", 5, "night", 2)}
    assert abs(later[0].run_at - later[0].enqueued_at - timedelta(hours=1)) < timedelta(seconds=1)
    assert {(job.run_at, job.queue, job.ordering_key) for job in timed} == {(at, "bulk", "fixed")}
    assert app.enqueue_many(reindex, []) == []


def test_enqueues_give_the_same_jobs_whether_or_not_someone_watches_the_engine(qdb: QueueDatabase) -> None:
    # Unwatched, enqueue runs its statement on the driver's cursor; a cursor listener (a tracer, echo) gets
    # SQLAlchemy's own execution instead. Both must store and return the same jobs.
    app, reindex = shop_app(qdb)
    seen: list[str] = []

    def enqueue_each_way() -> list[Job]:
        made = [app.enqueue(reindex, {"shop": 1}), *app.enqueue_many(reindex, [{"shop": 2}, {"shop": 3}])]
        made.append(app.enqueue(reindex, {"shop": 4}, delay=60, priority=3, tag="t"))
        with app.engine.begin() as conn:
            made.append(app.enqueue(reindex, {"shop": 5}, conn=conn))
            made.extend(app.enqueue_many(reindex, [{"shop": 6}, {"shop": 7}], conn=conn))
        return made

    def look(conn: object, cursor: object, statement: str, *rest: object) -> None:
        seen.append(statement)

    quiet = enqueue_each_way()
    sa.event.listen(app.engine, "before_cursor_execute", look)
    try:
        watched = enqueue_each_way()
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", look)
    assert sum("INSERT INTO dibs_jobs" in statement for statement in seen) == 5  # a listener sees every insert
    assert stored(qdb) == [*quiet, *watched]
    for fast, slow in zip(quiet, watched, strict=True):
        assert [type(getattr(fast, name)) for name in ("id", "run_at", "enqueued_at", "args")] == [
            type(getattr(slow, name)) for name in ("id", "run_at", "enqueued_at", "args")
        ]
        assert fast.run_at.tzinfo is not None
        assert fast.enqueued_at.tzinfo is not None
        assert (fast.status, fast.priority, fast.tag) == (slow.status, slow.priority, slow.tag)


def test_a_batchs_jobs_hold_the_arguments_stored_whatever_is_done_with_them(qdb: QueueDatabase) -> None:
    # A batch's jobs hold their arguments as the JSON stored decodes (flat ones copied as they were
    # encoded, the others decoded in one call): each job gets its own, whatever the caller does to the
    # dicts it passed, and every way of reading a job sees them, its __dict__ (vars, orjson) too.
    app, reindex = shop_app(qdb)

    @app.task(name="shop.ping")
    def ping(shop: int, note: str = "", tags: tuple[str, ...] = (), flag: bool = False) -> None:
        return None

    args: list[dict[str, object]] = [{"shop": 1, "note": "ré ✓"}, {"shop": 2, "tags": ("a", "b")}, {"shop": 3}]
    keyed = app.enqueue_many(reindex, args[:1] + args[2:])
    first, second, third = app.enqueue_many(ping, args)
    args[0]["note"] = "changed after the enqueue"
    assert stored(qdb) == [*keyed, first, second, third]
    assert [job.args for job in keyed] == [{"shop": 1, "note": "ré ✓"}, {"shop": 3}]
    assert second.args == {"shop": 2, "tags": ["a", "b"]}  # as JSON keeps it
    twins = app.enqueue_many(ping, [args[2], args[2]])
    assert twins[0].args == twins[1].args
    assert twins[0].args is not twins[1].args
    assert vars(third)["args"] == {"shop": 3}
    assert dataclasses.asdict(second)["args"] == {"shop": 2, "tags": ["a", "b"]}
    # Flat arguments of every plain kind, among others, each read before anything else touched the job.
    plain: dict[str, object] = {"shop": 2**70, "note": "é\x7f\ud800", "tags": None, "flag": True}
    mixed = app.enqueue_many(ping, [plain, {"shop": 4, "tags": ["x"]}, {"shop": 5.5}, {"shop": 6}])
    assert [vars(job)["args"] for job in mixed] == [plain, {"shop": 4, "tags": ["x"]}, {"shop": 5.5}, {"shop": 6}]
    assert mixed[0].args is not plain
    plain["note"] = "changed"
    assert [job.args for job in mixed] == [job.args for job in stored(qdb)[-4:]]
    assert [type(value) for value in mixed[0].args.values()] == [int, str, type(None), bool]
    only = app.enqueue(ping, {"shop": 7})
    assert vars(only)["args"] == {"shop": 7}
    assert pickle.loads(pickle.dumps(only)).args == copy.deepcopy(only).args == {"shop": 7}


def test_a_batch_after_other_jobs_waits_for_them_and_is_queued_when_they_are_done(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    parent = app.enqueue(reindex, {"shop": 1})
    waiting = app.enqueue_many(reindex, [{"shop": 2}, {"shop": 3}], after=[parent])
    assert {(job.status, job.ordering_key) for job in waiting} == {("waiting", "2"), ("waiting", "3")}
    assert stored(qdb)[1:] == waiting
    qdb.drain(app)
    assert {app.get(job.id).status for job in waiting} == {"succeeded"}
    ready = app.enqueue_many(reindex, [{"shop": 4}, {"shop": 5}], after=[parent.id])  # a parent that succeeded
    assert {job.status for job in ready} == {"queued"}
    assert stored(qdb)[3:] == ready


def test_a_batch_rolled_back_with_the_callers_transaction_leaves_nothing(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    with contextlib.suppress(Rollback), qdb.engine.begin() as conn:
        made = app.enqueue_many(reindex, [{"shop": n} for n in range(MANY)], conn=conn)
        assert len(made) == MANY
        raise Rollback
    assert job_count(qdb.engine) == 0
    with qdb.engine.begin() as conn:
        kept = app.enqueue_many(reindex, [{"shop": n} for n in range(MANY)], conn=conn)
    assert stored(qdb) == kept


def test_a_bad_job_late_in_a_batch_writes_none_of_it(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    args: list[dict[str, object]] = [{"shop": n} for n in range(MANY)]
    with pytest.raises(dibs.InvalidArgument, match="orders its jobs by the argument 'shop'"):
        app.enqueue_many(reindex, [*args, {"note": "no shop"}])
    with pytest.raises(dibs.InvalidArgument, match="do not fit the task"):
        app.enqueue_many(reindex, [*args, {"shop": 1, "colour": "red"}])
    with pytest.raises(dibs.InvalidArgument, match="ordering_key must be"):
        app.enqueue_many(reindex, [*args, {"shop": "x" * 300}])
    assert job_count(qdb.engine) == 0


def test_aenqueue_many_returns_the_stored_jobs_alone_and_in_an_async_transaction(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    engine = dibs.create_async_engine(with_driver(qdb.url, ASYNC_DRIVERS[qdb.family]))

    async def scenario() -> list[Job]:
        try:
            alone = await app.aenqueue_many(reindex, [{"shop": n} for n in range(600)])
            with contextlib.suppress(Rollback):
                async with engine.begin() as conn:
                    await app.aenqueue_many(reindex, [{"shop": n} for n in range(600)], conn=conn)
                    raise Rollback
            async with engine.begin() as conn:
                joined = await app.aenqueue_many(reindex, [{"shop": n} for n in range(600)], conn=conn, delay=60)
                one = await app.aenqueue(reindex, {"shop": 9}, conn=conn)
            return [*alone, *joined, one]
        finally:
            await engine.dispose()

    made = asyncio.run(scenario())
    assert stored(qdb) == made


def test_a_postgresql_batch_longer_than_one_statement_keeps_its_order(
    qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    if qdb.family != "postgresql":
        pytest.skip("the array statement is PostgreSQL's")
    monkeypatch.setattr(unnest, "ROWS_LIMIT", 100)
    app, reindex = shop_app(qdb)
    made = app.enqueue_many(reindex, [{"shop": n} for n in range(450)])
    assert stored(qdb) == made
    assert [job.args["shop"] for job in made] == list(range(450))


def test_an_sqlite_batch_binds_the_values_its_jobs_share_once_per_statement(qdb: QueueDatabase) -> None:
    if qdb.family != "sqlite":
        pytest.skip("the shared values are bound once in SQLite's INSERT ... SELECT FROM (VALUES ...)")
    app, reindex = shop_app(qdb)
    bound: list[int] = []

    def look(conn: object, cursor: object, statement: str, parameters: tuple[object, ...], *rest: object) -> None:
        if statement.startswith("INSERT INTO dibs_jobs"):
            bound.append(len(parameters))

    sa.event.listen(app.engine, "before_cursor_execute", look)
    try:
        made = app.enqueue_many(reindex, [{"shop": n} for n in range(MANY)], tag="bulk")
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", look)
    assert stored(qdb) == made
    # 1300 jobs: 512 + 512 + 256 + 16 + 4 rows, each binding its arguments and ordering key, and the dozen
    # shared values once per statement.
    shared = bound[-1] - 2 * 4
    assert 8 <= shared <= 16
    assert bound == [shared + 2 * rows for rows in (512, 512, 256, 16, 4)]


def test_a_postgresql_batch_the_server_refuses_raises_writes_nothing_and_leaves_the_connection_usable(
    qdb: QueueDatabase,
) -> None:
    # A batch's INSERT is sent in pipeline mode while the jobs to return are made: a server error must still
    # come out as SQLAlchemy's, with the transaction rolled back and the connection fit for the next call.
    if qdb.family != "postgresql":
        pytest.skip("the INSERT runs in psycopg's pipeline mode on PostgreSQL")
    app, reindex = shop_app(qdb)
    with qdb.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION dibs_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF strpos(NEW.args, 'refused') > 0 THEN RAISE EXCEPTION 'refused by the test'; END IF; "
            "RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER dibs_test_refuse BEFORE INSERT ON dibs_jobs "
            "FOR EACH ROW EXECUTE FUNCTION dibs_test_refuse()"
        )
    try:
        with pytest.raises(sa.exc.DBAPIError, match="refused by the test"):
            app.enqueue_many(reindex, [{"shop": n, "note": "refused" if n == 700 else ""} for n in range(MANY)])
        with (
            qdb.engine.connect() as conn,
            pytest.raises(sa.exc.DBAPIError, match="refused by the test"),
            conn.begin(),
        ):
            app.enqueue_many(reindex, [{"shop": 1}, {"shop": 2, "note": "refused"}], conn=conn)
        assert stored(qdb) == []
        made = app.enqueue_many(reindex, [{"shop": n} for n in range(MANY)])
        assert stored(qdb) == made
        assert [job.args["shop"] for job in made] == list(range(MANY))
    finally:
        with qdb.engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER dibs_test_refuse ON dibs_jobs")
            conn.exec_driver_sql("DROP FUNCTION dibs_test_refuse()")


def test_a_batch_enqueues_on_an_engine_of_any_paramstyle_the_driver_takes(qdb: QueueDatabase) -> None:
    # The batch statements are written in the driver's own paramstyle: SQLite's driver takes named too.
    if qdb.family != "sqlite":
        pytest.skip("pysqlite takes qmark and named parameters")
    engine = dibs.create_engine(qdb.url, paramstyle="named")
    try:
        app = dibs.App(engine)

        @app.task(name="shop.count")
        def count(shop: int) -> None:
            return None

        made = app.enqueue_many(count, [{"shop": n} for n in range(MANY)])
        assert [job.args["shop"] for job in made] == list(range(MANY))
        assert stored(qdb) == made
    finally:
        engine.dispose()


def test_an_engine_binding_numbered_parameters_is_refused_before_anything_is_written(qdb: QueueDatabase) -> None:
    # SQLAlchemy numbers some of its own statements' parameters out of the driver's order, and a batch's
    # multi-row INSERT is written by position: refused where the engine is made or given, and where a
    # caller's connection of one is used, not a KeyError later.
    if qdb.family != "sqlite":
        pytest.skip("pysqlite is the driver that takes numbered parameters")
    refused = r"'numeric' paramstyle, which dibs does not write its statements in; make it without paramstyle="
    with pytest.raises(dibs.InvalidArgument, match=refused):
        dibs.create_engine(qdb.url, paramstyle="numeric")
    theirs = sa.create_engine(qdb.url, paramstyle="numeric")
    try:
        with pytest.raises(dibs.InvalidArgument, match=refused):
            dibs.App(theirs)
        with pytest.raises(dibs.InvalidArgument, match=refused):
            dibs.Outbox(theirs)
        app, reindex = shop_app(qdb)
        with theirs.connect() as conn, pytest.raises(dibs.InvalidArgument, match=refused):
            app.enqueue_many(reindex, [{"shop": 1}, {"shop": 2}], conn=conn)
        app.enqueue_many(reindex, [{"shop": 1}, {"shop": 2}])
        # A claim on such an engine bound its parameters in the wrong places and claimed nothing, silently.
        for strategy in (None, "portable"):
            with pytest.raises(dibs.InvalidArgument, match=refused):
                dibs.claim(theirs, jobs, where=jobs.c.id != 1, delete=True, order_by=[jobs.c.id], strategy=strategy)
    finally:
        theirs.dispose()
    assert job_count(qdb.engine) == 2


def test_asyncpgs_numbered_parameters_are_taken(qdb: QueueDatabase) -> None:
    # asyncpg binds $1, $2, ...: a PostgreSQL batch is one statement SQLAlchemy compiles in any style.
    if qdb.family != "postgresql":
        pytest.skip("asyncpg is a PostgreSQL driver")
    app, reindex = shop_app(qdb)

    async def enqueue() -> list[Job]:
        engine = dibs.create_async_engine(with_driver(qdb.url, "postgresql+asyncpg"))
        try:
            assert engine.dialect.paramstyle == "numeric_dollar"
            async with engine.begin() as conn:
                return await app.aenqueue_many(reindex, [{"shop": n} for n in range(MANY)], conn=conn)
        finally:
            await engine.dispose()

    assert [job.args for job in asyncio.run(enqueue())] == [{"shop": n} for n in range(MANY)]
    assert job_count(qdb.engine) == MANY


def test_a_batch_some_of_whose_rows_a_trigger_leaves_out_fails_and_keeps_nothing(qdb: QueueDatabase) -> None:
    # The returned ids are matched to the jobs by order: with rows missing, no job's id can be trusted.
    if qdb.family == "mariadb":
        pytest.skip("a MariaDB trigger cannot leave a row out without failing the statement")
    app, reindex = shop_app(qdb)
    create, drop = {
        "sqlite": (
            ["CREATE TRIGGER dibs_test_skip BEFORE INSERT ON dibs_jobs WHEN instr(NEW.args, 'skip') > 0 "
             "BEGIN SELECT RAISE(IGNORE); END"],
            ["DROP TRIGGER dibs_test_skip"],
        ),
        "postgresql": (
            ["CREATE FUNCTION dibs_test_skip() RETURNS trigger LANGUAGE plpgsql AS "
             "$$ BEGIN IF strpos(NEW.args, 'skip') > 0 THEN RETURN NULL; END IF; RETURN NEW; END $$",
             "CREATE TRIGGER dibs_test_skip BEFORE INSERT ON dibs_jobs "
             "FOR EACH ROW EXECUTE FUNCTION dibs_test_skip()"],
            ["DROP TRIGGER dibs_test_skip ON dibs_jobs", "DROP FUNCTION dibs_test_skip()"],
        ),
    }[qdb.family]  # fmt: skip
    with qdb.engine.begin() as conn:
        for statement in create:
            conn.exec_driver_sql(statement)
    try:
        for size in (3, MANY):
            batch = [{"shop": n, "note": "skip" if n == 1 else ""} for n in range(size)]
            with pytest.raises(dibs.DibsError, match="left rows out"):
                app.enqueue_many(reindex, batch)
        assert stored(qdb) == []
    finally:
        with qdb.engine.begin() as conn:
            for statement in drop:
                conn.exec_driver_sql(statement)


def heard_probe(qdb: QueueDatabase, heard: list[str], lock: threading.Lock) -> None:
    """Notify until the listener hears it (it listens once its thread has connected), then forget it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with qdb.engine.begin() as conn:
            conn.execute(sa.select(sa.func.pg_notify(CHANNEL, "probe")))
        time.sleep(0.1)
        with lock:
            if "probe" in heard:
                heard.clear()
                return
    raise AssertionError("the listener never heard a notification")


def test_postgresql_workers_are_woken_once_per_enqueue_of_jobs_ready_now(qdb: QueueDatabase) -> None:
    app, reindex = shop_app(qdb)
    heard: list[str] = []
    lock = threading.Lock()

    def woken(payload: str) -> None:
        with lock:
            heard.append(payload)

    listener = app.store.backend.listen(app.engine, CHANNEL, woken)
    if listener is None:
        pytest.skip("this database sends no notifications; workers poll")
    try:
        heard_probe(qdb, heard, lock)
        app.enqueue(reindex, {"shop": 1}, delay=60)  # not ready: nothing to wake for
        app.enqueue_many(reindex, [{"shop": 2}], run_at=datetime.now(timezone.utc) + timedelta(minutes=5))
        app.enqueue(reindex, {"shop": 3}, queue="bulk")
        app.enqueue_many(reindex, [{"shop": n} for n in range(50)])
        with qdb.engine.begin() as conn:
            app.enqueue(reindex, {"shop": 4}, conn=conn)
            time.sleep(0.5)
            with lock:
                assert heard == ["bulk", "default"]  # the caller's job is not committed yet
        deadline = time.monotonic() + 10
        while len(heard) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert heard == ["bulk", "default", "default"]
    finally:
        listener.close()
