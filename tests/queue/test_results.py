"""Job results: kept as JSON with the job, waited for by one shared waiter, on every backend."""

from __future__ import annotations

import asyncio
import copy
import pickle
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.queue.results import MAX_RESULT_BYTES
from dibs.schema import LATEST, MIGRATIONS, current_version
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows, without_later_job_columns


def test_a_returned_value_is_kept_and_read_back(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.add")
    def add(a: int, b: int) -> dict[str, Any]:
        return {"sum": a + b, "parts": [a, b]}

    @app.task(name="math.nothing")
    def nothing() -> None:
        return None

    job = add.enqueue({"a": 2, "b": 3})
    empty = nothing.enqueue()
    qdb.drain(app)
    stored = app.get(job.id)
    assert stored.status == "succeeded"
    assert stored.result_json == '{"sum":5,"parts":[2,3]}'
    assert stored.result() == {"sum": 5, "parts": [2, 3]}
    assert job.result(timeout=5) == {"sum": 5, "parts": [2, 3]}
    assert app.get(empty.id).result_json is None
    assert empty.result(timeout=5) is None


def test_a_job_pickles_and_copies_without_the_apps_waiter(qdb: QueueDatabase) -> None:
    # A job an App returns can wait for its result through the App's engine, which cannot be pickled or
    # deep-copied (a cache, a process pool): those copies leave the waiter out and say how to wait instead.
    app = qdb.app()

    @app.task(name="math.double")
    def double(n: int) -> int:
        return 2 * n

    job = double.enqueue({"n": 21})
    batch = app.enqueue_many(double, [{"n": 1}, {"n": 2}])
    qdb.drain(app)
    for kept in (job, *batch):
        unpickled = pickle.loads(pickle.dumps(kept))
        assert unpickled == kept
        deep = copy.deepcopy(kept)
        assert deep == kept
        with pytest.raises(dibs.InvalidArgument, match="no App to wait through"):
            deep.result(timeout=5)
        with pytest.raises(dibs.InvalidArgument, match=rf"app.get\({kept.id}\).result\(\)"):
            unpickled.result(timeout=5)
    assert app.get(pickle.loads(pickle.dumps(job)).id).result(timeout=5) == 42
    assert copy.copy(batch[1]).result(timeout=5) == 4


def test_a_waiter_wakes_when_the_job_finishes(qdb: QueueDatabase) -> None:
    app = qdb.app()
    gate = threading.Event()

    @app.task(name="slow.answer")
    def answer() -> int:
        gate.wait(10)
        return 42

    job = answer.enqueue()
    worker = qdb.start(app)
    try:
        with pytest.raises(dibs.ResultTimeout, match=f"job {job.id} had not finished after 0.2 seconds"):
            job.result(timeout=0.2)
        assert app.get(job.id).status in ("queued", "running")  # left alone
        gate.set()
        assert job.result(timeout=10) == 42
    finally:
        gate.set()
        worker.stop()


def test_a_dead_or_cancelled_job_raises_with_its_error(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="bad.boom", max_attempts=1)
    def boom() -> int:
        raise RuntimeError("the disk is on fire")

    @app.task(name="bad.never")
    def never() -> int:
        return 1

    dead = boom.enqueue()
    cancelled = never.enqueue(delay=3600)
    app.cancel(cancelled.id)
    qdb.drain(app)
    with pytest.raises(dibs.JobFailed, match="is dead, it has no result: RuntimeError: the disk is on fire") as info:
        dead.result(timeout=5)
    assert info.value.status == "dead"
    assert "Traceback" in (info.value.error or "")
    with pytest.raises(dibs.JobFailed, match="is cancelled") as cancelled_info:
        cancelled.result(timeout=5)
    assert cancelled_info.value.job_id == cancelled.id


@pytest.mark.parametrize("returned", [{1, 2}, "x" * (MAX_RESULT_BYTES + 1), float("nan")])
def test_a_result_that_cannot_be_kept_fails_the_job_and_stores_nothing(qdb: QueueDatabase, returned: Any) -> None:
    app = qdb.app()

    @app.task(name="bad.result")
    def give() -> Any:
        return returned

    job = give.enqueue()
    stats = qdb.drain(app)
    assert stats.dead == 1
    stored = app.get(job.id)
    assert stored.status == "dead"
    assert stored.result_json is None
    assert (stored.last_error or "").startswith("InvalidArgument: the task")
    with pytest.raises(dibs.JobFailed):
        job.result(timeout=5)


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True])
def test_a_bad_timeout_is_refused_before_anything_waits(qdb: QueueDatabase, timeout: Any) -> None:
    app = qdb.app()
    slow = app.task(name="math.slow")(lambda: None)
    job = slow.enqueue()
    with pytest.raises(dibs.InvalidArgument, match="timeout"):
        job.result(timeout=timeout)
    with pytest.raises(dibs.InvalidArgument, match="timeout"):
        asyncio.run(job.aresult(timeout=timeout))
    with pytest.raises(dibs.ResultTimeout):  # a timedelta is a timeout too; the job has not run
        job.result(timeout=timedelta(milliseconds=50))
    # No wait was left behind for the App's one waiter to keep looking for.
    assert app._results is not None
    assert app._results._waits == {}


@pytest.mark.parametrize("bad", ["1", 2**70, 0, True])
def test_a_job_id_of_the_wrong_kind_is_invalid_on_every_database(qdb: QueueDatabase, bad: Any) -> None:
    app = qdb.app()
    task = app.task(name="math.any")(lambda: None)
    task.enqueue()
    for call in (app.get, app.cancel, app.retry):
        with pytest.raises(dibs.InvalidArgument, match="a job id must be a whole number from 1 to"):
            call(bad)


def test_many_waiters_share_one_thread(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.double")
    def double(n: int) -> int:
        return 2 * n

    waited = app.enqueue_many(double, [{"n": n} for n in range(200)])
    answers: dict[int, int] = {}
    # The waiter of an earlier test's App may still linger, listening for the next wait of its own.
    earlier = set(threading.enumerate())

    def wait(job: dibs.Job) -> None:
        answers[job.id] = job.result(timeout=60)

    threads = [threading.Thread(target=wait, args=(job,)) for job in waited]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    waiting_threads = [thread for thread in set(threading.enumerate()) - earlier if thread.name == "dibs-results"]
    assert len(waiting_threads) == 1
    qdb.drain(app)
    for thread in threads:
        thread.join(60)
    assert answers == {job.id: 2 * n for n, job in enumerate(waited)}


def test_an_async_waiter_gets_the_result(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.square")
    async def square(n: int) -> int:
        return n * n

    job = square.enqueue({"n": 7})

    async def main() -> tuple[int, int]:
        with pytest.raises(dibs.ResultTimeout):
            await job.aresult(timeout=0.1)
        worker = asyncio.create_task(qdb.worker(app, burst=True, handle_signals=False).arun())
        got = await job.aresult(timeout=20)
        await worker
        again = await app.get(job.id).aresult()
        return got, again

    assert asyncio.run(main()) == (49, 49)


def test_a_version_4_database_gains_the_result_column(empty_db: QueueDatabase) -> None:
    """A database made before results: its jobs stay, and their results are kept once upgraded."""
    engine = empty_db.engine
    dibs.migrate(engine, MIGRATIONS[:4])
    without_later_job_columns(engine)
    assert "result" not in {column["name"] for column in sa.inspect(engine).get_columns("dibs_jobs")}
    app = empty_db.app()

    @app.task(name="work.echo")
    def echo(n: int) -> int:
        return n

    with engine.begin() as conn:
        # What a dibs of version 4 wrote: every column but the result.
        conn.execute(
            sa.text(
                "INSERT INTO dibs_jobs (task, queue, args, priority, status, run_at, attempts, max_attempts, "
                "lease_token, cancel_requested, enqueued_at) VALUES ('work.echo', 'default', '{\"n\": 9}', 0, "
                "'queued', :now, 0, 3, 0, false, :now)"
            ),
            {"now": datetime.now(timezone.utc).replace(tzinfo=None)},
        )
    assert [step.version for step in dibs.migrate(engine)] == list(range(5, LATEST + 1))
    assert current_version(engine) == LATEST
    empty_db.drain(app)
    (kept,) = job_rows(engine)
    assert kept.status == "succeeded"
    assert app.get(kept.id).result() == 9


def test_a_version_3_database_without_the_later_columns_upgrades_through_every_step(empty_db: QueueDatabase) -> None:
    """Step 4 (exact names on MySQL/MariaDB) changes only the columns a version 3 table has; later steps add theirs."""
    engine = empty_db.engine
    dibs.migrate(engine, MIGRATIONS[:3])
    without_later_job_columns(engine)
    assert [step.version for step in dibs.migrate(engine)] == list(range(4, LATEST + 1))
    columns = {column["name"] for column in sa.inspect(engine).get_columns("dibs_jobs")}
    assert {"result", "has_children", "on_parent_failure", "parents_left", "headers"} <= columns
