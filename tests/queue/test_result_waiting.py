"""Waiting for results: a notification wakes a PostgreSQL waiter at once; any number of waiters share one
listener and one poller; results are written with their batch, one executemany per batch."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import dibs
from dibs.queue.results import FINISHED_CHANNEL, ResultWaiter
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import kill_listeners, sends_notifications


def listens(app: dibs.App) -> bool:
    """Whether the app's database sends notifications of finished jobs."""
    return sends_notifications(app, FINISHED_CHANNEL)


def waiter_selects(engine: sa.Engine) -> list[str]:
    """The waiter's looks at the jobs, as the engine sends them from now on."""
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("SELECT dibs_jobs.id, dibs_jobs.status, dibs_jobs.result"):
            seen.append(statement)

    return seen


def test_a_waiter_wakes_on_a_notification_long_before_its_poll(qdb: QueueDatabase) -> None:
    app = qdb.app()
    if not listens(app):
        pytest.skip("the database sends no notifications: waiters poll (see the other tests)")
    gate = threading.Event()

    @app.task(name="slow.answer")
    def answer() -> int:
        gate.wait(20)
        return 42

    # Polls so rare that only the worker's announcement can explain a prompt answer.
    waiter = ResultWaiter(app.engine, poll=60.0, listening_poll=60.0)
    job = answer.enqueue().waited_by(waiter)
    qdb.start(app)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(job.result(timeout=30)))
    thread.start()
    try:
        wait_until(lambda: waiter.listening, what="the waiter listens")
        time.sleep(0.3)  # its round after LISTEN is done: it now sleeps for the poll
        released = time.monotonic()
        gate.set()
        thread.join(30)
        took = time.monotonic() - released
    finally:
        gate.set()
    assert got == [42]
    assert took < 3.0, f"the waiter took {took:.2f}s to see the result"


def test_a_thousand_waiters_share_one_listener_and_one_poller(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.triple")
    async def triple(n: int) -> int:
        return 3 * n

    jobs = app.enqueue_many(triple, [{"n": n} for n in range(1000)])
    waiter = ResultWaiter(app.engine)
    connections: list[object] = []
    sa.event.listen(app.engine, "connect", lambda dbapi_connection, record: connections.append(dbapi_connection))
    selects = waiter_selects(app.engine)
    notified = listens(app)
    connections.clear()

    async def main() -> list[Any]:
        waits = [asyncio.create_task(job.waited_by(waiter).aresult(timeout=60)) for job in jobs]
        await asyncio.sleep(0.5)  # every wait has begun (each new one starts a round)
        selects.clear()
        await asyncio.sleep(1.0)
        if notified:
            assert waiter.listening
        # One query per round for all thousand (the ids fit one chunk), the rounds backing off (polling) or
        # none at all (listening); a loop per waiter would send a thousand per round.
        assert len(selects) <= (1 if notified else 10), selects
        # One listens, one polls; the pool may make one more to replace the connection the listener took.
        assert len(connections) <= 3
        drained = asyncio.create_task(qdb.worker(app, burst=True, concurrency=50).arun())
        answers = await asyncio.gather(*waits)
        await drained
        return answers

    assert asyncio.run(main()) == [3 * n for n in range(1000)]


def test_threads_waiting_share_the_app_waiter_and_its_rounds(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.negate")
    def negate(n: int) -> int:
        return -n

    jobs = app.enqueue_many(negate, [{"n": n} for n in range(300)])
    selects = waiter_selects(app.engine)
    answers: dict[int, int] = {}

    def wait(job: dibs.Job) -> None:
        answers[job.id] = job.result(timeout=60)

    threads = [threading.Thread(target=wait, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every wait has begun (each new one starts a round)
    selects.clear()
    time.sleep(1.0)
    assert len(selects) <= 10, "the waits are looked at together, not one by one"
    qdb.drain(app, concurrency=30)
    for thread in threads:
        thread.join(60)
    assert answers == {job.id: -n for n, job in enumerate(jobs)}


def test_a_waiter_polls_while_its_listening_connection_is_down(qdb: QueueDatabase) -> None:
    app = qdb.app()
    if not listens(app):
        pytest.skip("the database sends no notifications: waiters always poll")
    gate = threading.Event()

    @app.task(name="slow.word")
    def word() -> str:
        gate.wait(20)
        return "late"

    waiter = ResultWaiter(app.engine, poll=0.2, listening_poll=60.0)
    job = word.enqueue().waited_by(waiter)
    qdb.start(app)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(job.result(timeout=30)))
    thread.start()
    try:
        wait_until(lambda: waiter.listening, what="the waiter listens")
        assert kill_listeners(qdb.engine, FINISHED_CHANNEL) >= 1
        gate.set()
        thread.join(30)
    finally:
        gate.set()
    assert got == ["late"]
    wait_until(lambda: waiter.listening, what="the waiter listens again")


def test_results_are_written_with_their_batch_in_one_executemany(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="math.pair")
    async def pair(n: int) -> dict[str, int]:
        return {"n": n, "square": n * n}

    @app.task(name="math.none")
    async def none(n: int) -> None:
        return None

    with_results = app.enqueue_many(pair, [{"n": n} for n in range(200)])
    without = app.enqueue_many(none, [{"n": n} for n in range(200)])
    writes: list[str] = []

    @sa.event.listens_for(app.engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The completion that sets the results (PostgreSQL), or the executemany of them before it.
        if statement.startswith("UPDATE dibs_jobs SET") and "result=" in statement:
            writes.append(statement)

    stats = qdb.drain(app, concurrency=100, batch=100)
    assert stats.succeeded == 400
    assert 1 <= len(writes) < 100, f"{len(writes)} result writes for 200 results: not batched"
    for n, job in enumerate(with_results):
        assert app.get(job.id).result() == {"n": n, "square": n * n}
    assert {app.get(job.id).result_json for job in without} == {None}


@pytest.mark.parametrize(
    "returned",
    [{"text": 'a "quote", a \\ backslash, \u00e9t\u00e9 \u2603\n', "n": [1, 2.5, None, True]}, "just text", 0],
)
def test_a_result_reads_back_exactly_as_encoded(qdb: QueueDatabase, returned: Any) -> None:
    app = qdb.app()

    @app.task(name="echo.back")
    def back() -> Any:
        return returned

    job = back.enqueue()
    qdb.drain(app)
    assert app.get(job.id).result_json == json.dumps(returned, separators=(",", ":"))
    assert job.result(timeout=5) == returned


def test_a_job_dead_by_its_expired_lease_wakes_its_waiter_and_cancels_its_children(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.last", max_attempts=1)
    def last() -> None: ...

    job = app.enqueue(last)
    child = app.enqueue(last, after=[job])
    # Polls so rare that only the announcement of the dead job can explain a prompt answer where the
    # database sends notifications; elsewhere the waiter's polling finds it.
    notified = listens(app)
    waiter = ResultWaiter(app.engine, poll=60.0 if notified else 0.5, listening_poll=60.0)
    job.waited_by(waiter)
    store, engine = app.store, app.engine
    store.claim(engine, owner="worker-a", lease_seconds=0.3, limit=1, queues=["default"], tasks=["work.last"], tags=[])
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            job.result(timeout=20)
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        if notified:
            wait_until(lambda: waiter.listening, what="the waiter listens")
        time.sleep(0.5)
        assert store.recover_expired(engine) == (0, 1)
        began = time.monotonic()
        thread.join(10)
        assert not thread.is_alive()
        assert time.monotonic() - began < 5  # well before the waiter's next look of its own
    finally:
        thread.join(30)
    assert [type(error) for error in failed] == [dibs.JobFailed]
    assert "stopped renewing its lease" in str(failed[0])
    assert app.get(child.id).status == "cancelled"  # at once, not at upkeep's next look for unsettled parents


def test_a_stale_lease_keeps_no_result_and_the_current_one_keeps_its_own(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.answer")
    def answer() -> int:
        return 1

    job = app.enqueue(answer)
    store, engine = app.store, app.engine
    claim = {"limit": 1, "queues": ["default"], "tasks": ["work.answer"], "tags": []}
    (stale,) = store.claim(engine, owner="worker-a", lease_seconds=0.3, **claim)
    time.sleep(0.5)
    assert store.recover_expired(engine) == (1, 0)
    (current,) = store.claim(engine, owner="worker-b", lease_seconds=30, **claim)

    # The stale worker's batch writes neither its result nor its success; in one batch with the current
    # lease, only the current one's result is kept.
    assert store.succeed(engine, [stale], [(stale, '"stale"')]) == [stale]
    assert app.get(job.id).result_json is None
    assert store.succeed(engine, [stale, current], [(stale, '"stale"'), (current, '"current"')]) == [stale]
    done = app.get(job.id)
    assert (done.status, done.result_json, done.result()) == ("succeeded", '"current"', "current")


def test_a_completion_announces_its_jobs_in_its_own_statement_and_only_if_it_wrote(qdb: QueueDatabase) -> None:
    app = qdb.app()
    if not listens(app):
        pytest.skip("the database sends no notifications: waiters poll (see the other tests)")

    @app.task(name="work.answer")
    def answer() -> int:
        return 1

    first, second = app.enqueue(answer), app.enqueue(answer)
    store, engine = app.store, app.engine
    claim = {"queues": ["default"], "tasks": ["work.answer"], "tags": []}
    (stale,) = store.claim(engine, owner="worker-a", lease_seconds=0.3, limit=1, **claim)
    time.sleep(0.5)
    assert store.recover_expired(engine) == (1, 0)
    current = store.claim(engine, owner="worker-b", lease_seconds=30, limit=2, **claim)
    assert sorted(lease.key[0] for lease in current) == [first.id, second.id]

    statements: list[str] = []
    sessions: set[int] = set()

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)
        sessions.add(cursor.connection.info.backend_pid)

    def announced(timeout: float, wanted: int = 0) -> list[str]:
        """What this engine's sessions said on the channel (not others of the database, earlier tests' too),
        until ``wanted`` payloads were heard (if any are) or ``timeout`` seconds passed."""
        heard: list[str] = []
        for notification in listener.notifies(timeout=timeout):
            if notification.pid in sessions:
                heard.append(notification.payload)
                if len(heard) == wanted:
                    break
        return heard

    url = qdb.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {FINISHED_CHANNEL}")
        # A write that changed nothing (its lease was taken over) announces nothing.
        assert store.succeed(engine, [stale]) == [stale]
        assert announced(timeout=0.5) == []
        assert store.succeed(engine, current) == []
        heard = announced(timeout=5.0, wanted=1)
    assert heard == [",".join(str(lease.key[0]) for lease in current)]
    # Each completion is one statement, its announcement inside it: no statement of its own, nor its commit.
    assert len(statements) == 2
    assert all(statement.startswith("UPDATE dibs_jobs SET") and "pg_notify" in statement for statement in statements)


def test_an_app_that_does_not_notify_completes_without_announcing(qdb: QueueDatabase) -> None:
    app = qdb.app(notify=False)

    @app.task(name="work.answer")
    def answer() -> int:
        return 1

    app.enqueue(answer)
    completions: list[str] = []

    @sa.event.listens_for(app.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_notify" in statement or statement.startswith("UPDATE dibs_jobs SET status='succeeded'"):
            completions.append(statement)

    assert qdb.drain(app).succeeded == 1
    assert len(completions) == 1
    assert "pg_notify" not in completions[0]
