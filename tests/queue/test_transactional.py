"""Transactional tasks: the function's writes through context.conn commit with the job's fenced completion,
or not at all, on every backend, sync and asyncio."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs, outbox
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import QUICK_RETRY, counters, job_rows, runs, test_metadata

MODES = ["sync", "async"]


@pytest.fixture
def tables(qdb: QueueDatabase) -> sa.Engine:
    """The test tables, with the counter ``hits`` at 0."""
    test_metadata.create_all(qdb.engine)
    with qdb.engine.begin() as conn:
        conn.execute(counters.insert().values(name="hits", n=0))
    return qdb.engine


def hits(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(counters.c.n).where(counters.c.name == "hits")).scalar_one())


def run_log(engine: sa.Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(row.job_id, row.event) for row in conn.execute(sa.select(runs).order_by(runs.c.id))]


def counted(conn: sa.Connection, job_id: int, event: str = "counted") -> None:
    """What each test's task writes: one more hit, and a line naming the job."""
    conn.execute(sa.update(counters).where(counters.c.name == "hits").values(n=counters.c.n + 1))
    conn.execute(runs.insert().values(job_id=job_id, event=event))


def counting_task(
    app: dibs.App, mode: str, name: str, step: Callable[[dibs.JobContext], Any] | None = None, **options: Any
) -> dibs.Task:
    """A transactional task that counts a hit in its transaction, then runs ``step`` (in its thread, for an
    async task too) and returns what that returned."""

    def after(context: dibs.JobContext) -> Any:
        return None if step is None else step(context)

    if mode == "sync":

        def count(context: dibs.JobContext) -> Any:
            counted(context.conn, context.job_id)
            return after(context)

        return app.task(name=name, transactional=True, **options)(count)

    async def acount(context: dibs.JobContext) -> Any:
        await context.conn.run_sync(counted, context.job_id)
        return await asyncio.to_thread(after, context)

    return app.task(name=name, transactional=True, **options)(acount)


@pytest.mark.parametrize("mode", MODES)
def test_the_writes_the_result_and_the_children_commit_with_the_completion(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    app = qdb.app()
    count = counting_task(app, mode, "txn.count", lambda context: {"job": context.job_id})

    @app.task(name="txn.after")
    def after() -> str:
        return "ran"

    parents = [count.enqueue() for _ in range(5)]
    child = after.enqueue(after=parents)
    stats = qdb.drain(app)
    assert stats.succeeded == 6
    assert stats.lost == 0
    assert hits(tables) == 5
    assert sorted(run_log(tables)) == sorted((job.id, "counted") for job in parents)
    for job in parents:
        assert job.result(timeout=5) == {"job": job.id}
    assert child.result(timeout=5) == "ran"
    assert all(not row.has_children for row in job_rows(tables, jobs.c.id.in_([job.id for job in parents])))


@pytest.mark.parametrize("mode", MODES)
def test_an_error_rolls_the_writes_back_and_the_retry_commits_once(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    app = qdb.app()

    def first_fails(context: dibs.JobContext) -> None:
        if context.attempt == 1:
            raise RuntimeError("the first attempt fails after its write")

    count = counting_task(app, mode, "txn.flaky", first_fails, retry=QUICK_RETRY)
    job = count.enqueue()
    stats = qdb.drain(app)
    assert (stats.retried, stats.succeeded) == (1, 1)
    assert hits(tables) == 1
    assert run_log(tables) == [(job.id, "counted")]
    stored = app.get(job.id)
    assert (stored.status, stored.attempts) == ("succeeded", 2)


@pytest.mark.parametrize("mode", MODES)
def test_a_dead_job_leaves_no_write(qdb: QueueDatabase, tables: sa.Engine, mode: str) -> None:
    app = qdb.app()

    def boom(context: dibs.JobContext) -> None:
        raise ValueError("never works")

    job = counting_task(app, mode, "txn.dead", boom, max_attempts=1).enqueue()
    assert qdb.drain(app).dead == 1
    assert hits(tables) == 0
    stored = app.get(job.id)
    assert stored.status == "dead"
    assert "ValueError: never works" in (stored.last_error or "")


@pytest.mark.parametrize("mode", MODES)
def test_an_event_added_in_the_task_commits_with_it_and_a_rolled_back_run_leaves_none(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    app = qdb.app()
    events = dibs.Outbox(qdb.new_engine())

    def publish(context: dibs.JobContext) -> None:
        event = ("job", context.job_id, "counted", {"attempt": context.attempt})
        if mode == "sync":
            events.add(context.conn, *event)
        else:
            asyncio.run_coroutine_threadsafe(events.aadd(context.conn, *event), loop).result(10)
        if context.attempt == 1:
            raise RuntimeError("rolled back with its event")

    loop: asyncio.AbstractEventLoop
    if mode == "sync":
        count = counting_task(app, mode, "txn.publish", publish, retry=QUICK_RETRY)
    else:

        @app.task(name="txn.publish", transactional=True, retry=QUICK_RETRY)
        async def count(context: dibs.JobContext) -> None:
            nonlocal loop
            loop = asyncio.get_running_loop()
            await asyncio.to_thread(publish, context)

    job = count.enqueue()
    assert qdb.drain(app).succeeded == 1
    with tables.connect() as conn:
        found = conn.execute(sa.select(outbox.c.aggregate_id, outbox.c.payload)).all()
    assert [(row.aggregate_id, json.loads(row.payload)) for row in found] == [(str(job.id), {"attempt": 2})]


def take_over(app: dibs.App, engine: sa.Engine, job_id: int, task: str) -> None:
    """What another worker does once this worker's lease on the job expired: recover it, claim it again."""
    with engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=jobs.c.started_at))
    app.store.recover_expired(engine)
    taken = app.store.claim(
        engine, owner="thief", lease_seconds=600, limit=1, queues=["default"], tasks=[task], tags=[]
    )
    assert [lease.key[0] for lease in taken] == [job_id]


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_whose_lease_was_taken_over_while_the_task_ran_commits_nothing(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    if qdb.family == "sqlite":
        pytest.skip("SQLite: the task's transaction holds the one write lock, so no takeover can happen while it runs")
    app = qdb.app()
    started, go_on = threading.Event(), threading.Event()

    def wait(context: dibs.JobContext) -> str:
        started.set()
        assert go_on.wait(30)
        return "zombie"

    count = counting_task(app, mode, "txn.zombie", wait)
    job = count.enqueue()
    # A long lease, no upkeep and one runner (busy, so its worker claims nothing more): the test alone
    # decides when the job is taken over, and by whom.
    worker = qdb.start(app, lease=60.0, upkeep_every=3600.0, concurrency=1)
    try:
        assert started.wait(30)
        take_over(app, qdb.new_engine(), job.id, count.name)
        go_on.set()
        wait_until(lambda: worker.worker.stats.lost == 1, 30)
    finally:
        go_on.set()
        worker.stop()
    assert worker.worker.stats.succeeded == 0
    assert hits(tables) == 0
    assert run_log(tables) == []
    stored = app.get(job.id)
    assert (stored.status, stored.lease_owner, stored.result_json) == ("running", "thief", None)


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_whose_lease_was_taken_over_before_its_transaction_began_commits_nothing(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    app = qdb.app()
    thief = qdb.new_engine()
    taken: list[int] = []

    def take_over_first(conn: sa.Connection) -> None:
        # The transactional run's own connection, as it opens: a zombie worker stopped between its claim
        # and its transaction (the only moment another writer can take a lease over on SQLite).
        if not taken and conn.engine is not thief and _is_task_connection(conn, mode):
            taken.append(job.id)
            take_over(app, thief, job.id, "txn.early")

    count = counting_task(app, mode, "txn.early", lambda context: "zombie")
    job = count.enqueue()
    sa.event.listen(sa.Engine, "engine_connect", take_over_first)
    try:
        worker = qdb.start(app, lease=60.0, upkeep_every=3600.0, concurrency=1)
        wait_until(lambda: worker.worker.stats.lost == 1, 30)
        worker.stop()
    finally:
        sa.event.remove(sa.Engine, "engine_connect", take_over_first)
    assert taken == [job.id]
    assert worker.worker.stats.succeeded == 0
    assert hits(tables) == 0
    assert run_log(tables) == []
    assert (app.get(job.id).status, app.get(job.id).lease_owner) == ("running", "thief")


def _is_task_connection(conn: sa.Connection, mode: str) -> bool:
    if mode == "async":
        return conn.dialect.is_async
    return threading.current_thread().name.startswith("dibs-task")


def test_context_conn_outside_a_transactional_task_says_how_to_get_one(qdb: QueueDatabase) -> None:
    app = qdb.app()
    seen: list[str] = []

    @app.task(name="txn.plain")
    def plain(context: dibs.JobContext) -> None:
        try:
            context.conn  # noqa: B018
        except dibs.InvalidArgument as error:
            seen.append(str(error))

    plain.enqueue()
    qdb.drain(app)
    assert len(seen) == 1
    assert "@app.task(transactional=True)" in seen[0]


def test_a_transactional_task_without_a_context_parameter_is_refused(qdb: QueueDatabase) -> None:
    app = qdb.app()
    with pytest.raises(dibs.InvalidArgument, match="add a parameter named context"):

        @app.task(name="txn.blind", transactional=True)
        def blind() -> None: ...

    assert "txn.blind" not in app.tasks


@pytest.mark.parametrize("mode", MODES)
def test_a_run_past_its_timeout_commits_nothing(qdb: QueueDatabase, tables: sa.Engine, mode: str) -> None:
    app = qdb.app()
    done = threading.Event()

    def overstay(context: dibs.JobContext) -> str:
        # Ignores should_stop on purpose: it returns, well past its time limit, as if it had succeeded.
        threading.Event().wait(1.0)
        done.set()
        return "late"

    job = counting_task(app, mode, "txn.late", overstay, timeout=0.3, max_attempts=1).enqueue()
    assert qdb.drain(app).dead == 1
    assert mode == "async" or done.wait(10)  # an async run was cancelled at its limit
    wait_until(lambda: not _task_threads_busy(), 10)
    assert hits(tables) == 0
    assert run_log(tables) == []
    stored = app.get(job.id)
    assert stored.status == "dead"
    assert "timeout of 0.3 seconds" in (stored.last_error or "")


def test_a_sync_run_still_going_after_shutdown_commits_nothing(qdb: QueueDatabase, tables: sa.Engine) -> None:
    app = qdb.app()
    started = threading.Event()

    def linger(context: dibs.JobContext) -> str:
        started.set()
        context.wait(30)  # until the worker, stopping in a hurry, abandons the run
        return "returned as if nothing happened"

    job = counting_task(app, "sync", "txn.linger", linger).enqueue()
    worker = qdb.start(app, grace=0.1)
    assert started.wait(30)
    worker.stop()
    wait_until(lambda: not _task_threads_busy(), 30)
    assert hits(tables) == 0
    assert run_log(tables) == []
    # Given back if the worker was still there to write it, else left to its lease: never succeeded.
    assert app.get(job.id).status in ("queued", "running")


def _task_threads_busy() -> bool:
    """Whether a worker's thread of sync jobs (which ends once its job's transaction ended) is still alive."""
    return any(thread.name.startswith("dibs-task") for thread in threading.enumerate())


@pytest.mark.parametrize("mode", MODES)
def test_a_job_enqueued_on_context_conn_exists_only_if_the_run_commits(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    app = qdb.app()

    @app.task(name="txn.next")
    def follow_up(source: int) -> None: ...

    if mode == "sync":

        @app.task(name="txn.spawn", transactional=True, retry=QUICK_RETRY)
        def spawn(context: dibs.JobContext) -> None:
            follow_up.enqueue({"source": context.attempt}, conn=context.conn)
            if context.attempt == 1:
                raise RuntimeError("rolled back with the job it enqueued")

    else:

        @app.task(name="txn.spawn", transactional=True, retry=QUICK_RETRY)
        async def spawn(context: dibs.JobContext) -> None:
            await follow_up.aenqueue({"source": context.attempt}, conn=context.conn)
            if context.attempt == 1:
                raise RuntimeError("rolled back with the job it enqueued")

    spawn.enqueue()
    assert qdb.drain(app).succeeded == 2
    assert [row.args for row in job_rows(tables, jobs.c.task == "txn.next")] == ['{"source":2}']


@pytest.mark.parametrize("mode", MODES)
def test_a_child_enqueued_while_its_transactional_parent_runs_is_queued_when_it_succeeds(
    qdb: QueueDatabase, tables: sa.Engine, mode: str
) -> None:
    """The parent's transaction settles its children at its end: it must see one enqueued after it began,
    or (MySQL's REPEATABLE READ) clear the parent's flag with that child still waiting, for good."""
    if qdb.family == "sqlite":
        pytest.skip("SQLite's one write lock is held for the whole run: no job is enqueued meanwhile")
    app = qdb.app()
    started, release = threading.Event(), threading.Event()
    count = sa.select(sa.func.count()).select_from(counters)

    if mode == "sync":

        @app.task(name="txn.parent", transactional=True)
        def parent(context: dibs.JobContext) -> None:
            context.conn.execute(count).scalar_one()  # the transaction's first read
            started.set()
            release.wait(10)

    else:

        @app.task(name="txn.parent", transactional=True)
        async def parent(context: dibs.JobContext) -> None:
            (await context.conn.execute(count)).scalar_one()
            started.set()
            await asyncio.to_thread(release.wait, 10)

    @app.task(name="txn.child")
    def child() -> str:
        return "ran"

    first = app.enqueue("txn.parent")
    children = [child.enqueue(after=[first])]
    worker = qdb.start(app)
    try:
        assert started.wait(10)
        children.append(child.enqueue(after=[first]))  # while the parent's transaction is open
        release.set()
        wait_until(
            lambda: [app.get(job.id).status for job in children] == ["succeeded", "succeeded"],
            timeout=15,
            what="both children to run",
        )
    finally:
        release.set()
        worker.stop()
