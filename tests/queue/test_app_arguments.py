"""App calls refuse what they cannot do with a dibs error: states that are not finished, a state given as a
string, and a database without the dibs tables."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import dibs
from dibs.testing import drain
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows


def succeeded_and_dead_job(qdb: QueueDatabase) -> dibs.App:
    app = qdb.app()

    @app.task(name="work.ok")
    def ok() -> None: ...

    @app.task(name="work.fail", max_attempts=1)
    def fail() -> None:
        raise RuntimeError("broken")

    app.enqueue(ok)
    app.enqueue(fail)
    assert [job.status for job in drain(app)] == ["succeeded", "dead"]
    time.sleep(0.01)
    return app


def test_purge_and_purgeable_take_one_state_given_as_a_string(qdb: QueueDatabase) -> None:
    app = succeeded_and_dead_job(qdb)
    assert app.purgeable(statuses="dead") == {"dead": 1}
    assert app.purge(statuses="dead") == 1
    assert [row.status for row in job_rows(qdb.engine)] == ["succeeded"]


@pytest.mark.parametrize("statuses", [["queued"], "running", ["dead", "scheduled"]])
def test_purgeable_refuses_states_that_are_not_finished_as_purge_does(
    qdb: QueueDatabase, statuses: str | list[str]
) -> None:
    app = succeeded_and_dead_job(qdb)
    for call in (app.purge, app.purgeable):
        with pytest.raises(dibs.InvalidArgument, match="only finished jobs can be purged"):
            call(statuses=statuses)
    assert len(job_rows(qdb.engine)) == 2


def test_purge_refuses_statuses_that_are_not_states(qdb: QueueDatabase) -> None:
    app = qdb.app()
    for call in (app.purge, app.purgeable):
        with pytest.raises(dibs.InvalidArgument, match="statuses must be a state or a list of states"):
            call(statuses=3)  # type: ignore[arg-type]


def test_periodic_calls_on_a_database_without_the_tables_say_to_run_dibs_init(empty_db: QueueDatabase) -> None:
    app = empty_db.app()

    @app.periodic(every=timedelta(minutes=5), name="tick")
    @app.task(name="work.tick")
    def tick() -> None: ...

    for call in (app.periodic_status, app.enqueue_periodic, app.sync_periodic):
        with pytest.raises(dibs.SchemaMissing, match=r"run `dibs --db URL init`"):
            call()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:jobs?mode=memory&uri=true"])
def test_an_sqlite_database_in_memory_is_refused_saying_to_use_a_file(url: str) -> None:
    # Each connection would get its own empty database: the worker's threads would never see the tables.
    for front in (dibs.App, dibs.Outbox):
        with pytest.raises(dibs.InvalidArgument, match=r"in memory.*use a file"):
            front(url)


def test_an_sqlite_database_in_memory_shared_by_name_is_taken() -> None:
    app = dibs.App("sqlite:///file:jobs?mode=memory&cache=shared&uri=true")
    assert app.url.endswith("cache=shared&uri=true")
