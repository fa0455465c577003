"""The asyncio engine of async transactional tasks: made on the App's database with the App's
``async_engine_options``, since an Engine carries no record of the options it was made with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows

#: The schema of the PostgreSQL test, reached only through the search_path its engines are made with.
SCHEMA = "dibs_test_elsewhere"


def test_an_async_transactional_task_runs_on_an_engine_made_with_the_apps_options(qdb: QueueDatabase) -> None:
    app = dibs.App(qdb.engine, async_engine_options={"execution_options": {"dibs_test_marker": "mine"}})
    seen: list[Any] = []

    @app.task(name="txn.look", transactional=True)
    async def look(context: dibs.JobContext) -> None:
        seen.append(context.conn.sync_engine.get_execution_options().get("dibs_test_marker"))

    look.enqueue()
    assert qdb.drain(app).succeeded == 1
    assert seen == ["mine"]


@pytest.fixture
def elsewhere(qdb: QueueDatabase) -> Iterator[dict[str, Any]]:
    """On PostgreSQL, a schema of its own, reached through the search_path: the connect arguments of an
    engine made for it."""
    if qdb.family != "postgresql":
        pytest.skip("a search_path is PostgreSQL's")
    with qdb.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.exec_driver_sql(f"CREATE SCHEMA {SCHEMA}")
    try:
        yield {"options": f"-c search_path={SCHEMA}"}
    finally:
        with qdb.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def test_an_app_on_a_schema_reached_by_connect_args_runs_async_transactional_tasks_there(
    qdb: QueueDatabase, elsewhere: dict[str, Any]
) -> None:
    engine = dibs.create_engine(qdb.url, connect_args=elsewhere)
    try:
        app = dibs.App(engine, async_engine_options={"connect_args": elsewhere})
        app.init()
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE notes (job_id bigint)")

        @app.task(name="txn.note", transactional=True)
        async def note(context: dibs.JobContext) -> None:
            await context.conn.execute(sa.text("INSERT INTO notes VALUES (:id)"), {"id": context.job_id})

        job = note.enqueue()
        stats = qdb.drain(app)
        assert (stats.succeeded, stats.lost) == (1, 0)
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT job_id FROM {SCHEMA}.notes").scalars().all() == [job.id]
        assert [row.status for row in job_rows(engine, jobs.c.id == job.id)] == ["succeeded"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("options", [["echo"], {1: True}, "echo=True"])
def test_async_engine_options_that_are_not_options_by_name_are_refused(options: Any) -> None:
    with pytest.raises(dibs.InvalidArgument, match="async_engine_options must be a dict of options by name"):
        dibs.App("sqlite:///unused.sqlite", async_engine_options=options)


@pytest.mark.parametrize(
    "options", [{"isolation_level": "AUTOCOMMIT"}, {"execution_options": {"isolation_level": "AUTOCOMMIT"}}]
)
def test_async_engine_options_that_would_take_the_jobs_transaction_away_are_refused(options: Any) -> None:
    with pytest.raises(dibs.InvalidArgument, match="async_engine_options cannot set isolation_level"):
        dibs.App("sqlite:///unused.sqlite", async_engine_options=options)


def test_an_option_the_async_engine_does_not_know_stops_the_worker_as_it_starts(qdb: QueueDatabase) -> None:
    app = dibs.App(qdb.engine, async_engine_options={"no_such_option": 1})

    @app.task(name="txn.never", transactional=True)
    async def never(context: dibs.JobContext) -> None:
        raise AssertionError("the task ran without its engine")

    job = never.enqueue()
    with pytest.raises(dibs.InvalidArgument, match=r"async_engine_options were refused .*no_such_option"):
        app.worker(burst=True, handle_signals=False).run()
    (row,) = job_rows(qdb.engine, jobs.c.id == job.id)
    assert (row.status, row.attempts) == ("queued", 0)
