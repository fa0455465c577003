"""Jobs that wait for other jobs: after=, chains and groups, on every backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa

import dibs
import dibs.queue.admin
from dibs import Step
from dibs.schema import tables
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import job_count


def recording_app(qdb: QueueDatabase) -> tuple[dibs.App, list[tuple[str, Any, list[Any]]]]:
    """An app whose tasks record, in order, what ran with which argument and parent results."""
    app = qdb.app()
    ran: list[tuple[str, Any, list[Any]]] = []

    @app.task(name="flow.step")
    def step(n: int, context: dibs.JobContext) -> int:
        ran.append(("step", n, list(context.parent_results)))
        return n * 10 + sum(result or 0 for result in context.parent_results)

    @app.task(name="flow.fail", max_attempts=1)
    def fail() -> int:
        ran.append(("fail", None, []))
        raise RuntimeError("step failed")

    return app, ran


def test_a_job_waits_for_its_parents_and_reads_their_results(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    first = app.enqueue("flow.step", {"n": 1}, delay=0.3)
    second = app.enqueue("flow.step", {"n": 2})
    child = app.enqueue("flow.step", {"n": 3}, after=[first, second.id])
    assert child.status == "waiting"
    qdb.drain(app)
    assert ran[-1] == ("step", 3, [10, 20])
    assert [name_n[1] for name_n in ran].index(3) == 2  # after both parents
    assert child.result(timeout=5) == 60


def test_a_chain_runs_its_steps_in_order_passing_results(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    made = app.chain(Step("flow.step", {"n": 1}), Step("flow.step", {"n": 2}), Step("flow.step", {"n": 3}))
    assert [job.status for job in made] == ["queued", "waiting", "waiting"]
    qdb.drain(app, concurrency=4)
    assert ran == [("step", 1, []), ("step", 2, [10]), ("step", 3, [30])]
    assert made[-1].result(timeout=5) == 60


def test_a_group_callback_runs_once_all_members_succeeded(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    made = app.group([Step("flow.step", {"n": n}) for n in range(1, 6)], then=Step("flow.step", {"n": 0}))
    qdb.drain(app, concurrency=4)
    assert ran[-1] == ("step", 0, [10, 20, 30, 40, 50])
    assert len(ran) == 6
    assert made[-1].result(timeout=5) == 150


def test_a_failed_parent_cancels_its_descendants_unless_they_run_anyway(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    failing = app.chain(Step("flow.fail"), Step("flow.step", {"n": 1}), Step("flow.step", {"n": 2}))
    anyway = app.enqueue("flow.step", {"n": 7}, after=[failing[0]], on_parent_failure="run")
    qdb.drain(app)
    assert ("step", 1, []) not in ran
    assert ("step", 7, [None]) in ran
    for job in failing[1:]:
        stored = app.get(job.id)
        assert stored.status == "cancelled"
        assert "did not succeed; cancelled without running" in (stored.last_error or "")
    with pytest.raises(dibs.JobFailed, match="is cancelled"):
        failing[-1].result(timeout=5)
    assert anyway.result(timeout=5) == 70


def test_a_later_step_of_a_chain_or_a_groups_callback_may_run_anyway_after_a_failure(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    anyway = {"on_parent_failure": "run"}
    chained = app.chain(Step("flow.fail"), Step("flow.step", {"n": 1}, anyway), Step("flow.step", {"n": 2}))
    grouped = app.group([Step("flow.fail"), Step("flow.step", {"n": 3})], then=Step("flow.step", {"n": 4}, anyway))
    qdb.drain(app)
    assert chained[1].result(timeout=5) == 10  # its failed parent's result is None
    assert chained[2].result(timeout=5) == 30
    assert grouped[-1].result(timeout=5) == 70
    assert ("step", 4, [None, 30]) in ran


@pytest.mark.parametrize(
    ("workflow", "message"),
    [
        (lambda app: app.chain(Step("flow.step", {"n": 1}), Step("flow.step", {"n": 2}, {"dedupe_key": "k"})),
         "a step that waits for others .* cannot have a dedupe_key"),
        (lambda app: app.group([Step("flow.step", {"n": 1})], then=Step("flow.step", {"n": 2}, {"dedupe_key": "k"})),
         "a step that waits for others .* cannot have a dedupe_key"),
        (lambda app: app.chain(Step("flow.step", {"n": 1}), Step("flow.step", {"n": 2}, {"on_parent_failure": "x"})),
         "on_parent_failure must be 'cancel'"),
        (lambda app: app.chain(Step("flow.step", {"n": 1}, {"on_parent_failure": "run"}), Step("flow.step", {"n": 2})),
         "on_parent_failure applies to a job enqueued with after="),
    ],
    ids=["chain-dedupe", "callback-dedupe", "bad-policy", "policy-on-the-first-step"],
)  # fmt: skip
def test_a_workflow_step_with_options_that_do_not_fit_its_place_is_refused(
    qdb: QueueDatabase, workflow: Callable[[dibs.App], object], message: str
) -> None:
    app, _ = recording_app(qdb)
    holder = app.enqueue("flow.step", {"n": 0}, dedupe_key="k")  # a live job holding the key
    with pytest.raises(dibs.InvalidArgument, match=message):
        workflow(app)
    assert job_count(qdb.engine) == 1
    assert app.get(holder.id).status == "queued"


def test_a_retried_child_waits_again_for_the_parents_not_finished(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    parent = app.enqueue("flow.step", {"n": 1})
    child = app.enqueue("flow.step", {"n": 2}, after=[parent])
    app.cancel(child.id)
    retried = app.retry(child.id)
    assert retried.status == app.get(child.id).status == "waiting"  # its parent has not run
    qdb.drain(app)
    assert ran == [("step", 1, []), ("step", 2, [10])]


def test_a_retry_counts_a_parent_that_finished_while_the_retry_was_open(
    qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's worker records its success and settles its children while the retry's transaction is
    open: it may not see the child waiting (PostgreSQL passes over a row being changed), so the retry
    settles the parents it made the child wait for once more after it commits."""
    app, ran = recording_app(qdb)
    parent = app.enqueue("flow.step", {"n": 1})
    child = app.enqueue("flow.step", {"n": 2}, after=[parent])
    app.cancel(child.id)
    where = {"queues": ["default"], "tasks": ["flow.step"], "tags": []}
    [lease] = app.store.claim(app.engine, owner="w", lease_seconds=30, limit=1, **where)
    finishers: list[threading.Thread] = []
    wait_again = dibs.queue.admin.wait_again

    def finish() -> None:
        assert app.store.succeed(app.engine, [lease]) == []
        app.store.settle_children(app.engine, [parent.id])

    def parent_finishing_meanwhile(conn: sa.Connection, job_id: int) -> list[int]:
        waited = wait_again(conn, job_id)
        finishers.append(threading.Thread(target=finish))
        finishers[0].start()
        finishers[0].join(3)  # elsewhere it waits for the retry to commit
        return waited

    monkeypatch.setattr(dibs.queue.admin, "wait_again", parent_finishing_meanwhile)
    app.retry(child.id)
    finishers[0].join(30)
    assert app.get(child.id).status == "queued"
    qdb.drain(app)
    assert ran == [("step", 2, [None])]  # the parent's success was written without a result


def test_a_chain_cancelled_by_a_failure_runs_in_order_once_its_steps_are_retried(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    tries: list[int] = []

    @app.task(name="flow.flaky", max_attempts=1)
    def flaky() -> int:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("down the first time")
        return 5

    first, second = app.chain(Step("flow.flaky"), Step("flow.step", {"n": 1}))
    qdb.drain(app)
    assert (app.get(first.id).status, app.get(second.id).status) == ("dead", "cancelled")
    assert app.retry(first.id).status == "queued"
    assert app.retry(second.id).status == "waiting"
    qdb.drain(app)
    assert ran == [("step", 1, [5])]
    assert app.get(second.id).result(timeout=5) == 15


def test_a_retried_child_whose_parents_all_finished_is_queued(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    failing = app.enqueue("flow.fail")
    child = app.enqueue("flow.step", {"n": 3}, after=[failing])
    qdb.drain(app)
    assert app.get(child.id).status == "cancelled"
    assert app.retry(child.id).status == "queued"  # retried by hand: it runs, its dead parent's result None
    qdb.drain(app)
    assert ran[-1] == ("step", 3, [None])


def test_cancelling_a_waiting_parent_cancels_its_children(qdb: QueueDatabase) -> None:
    app, _ = recording_app(qdb)
    parent = app.enqueue("flow.step", {"n": 1}, delay=3600)
    child = app.enqueue("flow.step", {"n": 2}, after=[parent])
    app.cancel(parent.id)
    assert app.get(child.id).status == "cancelled"


def test_a_job_after_finished_parents_is_queued_at_once(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    parent = app.enqueue("flow.step", {"n": 1})
    qdb.drain(app)
    child = app.enqueue("flow.step", {"n": 2}, after=[parent])
    assert child.status == "queued"
    qdb.drain(app)
    assert ran[-1] == ("step", 2, [10])


class Gated(NamedTuple):
    """An app whose task ``slow`` says it started, then runs on once ``gate`` is set, recording its ``n``."""

    app: dibs.App
    slow: dibs.Task
    gate: threading.Event
    started: threading.Event
    done: list[int]


def gated_app(qdb: QueueDatabase) -> Gated:
    app = qdb.app()
    gate, started = threading.Event(), threading.Event()
    done: list[int] = []

    @app.task(name="flow.slow")
    def slow(n: int) -> int:
        started.set()
        gate.wait(10)
        done.append(n)
        return n

    return Gated(app, slow, gate, started, done)


def test_a_burst_runs_a_child_enqueued_while_its_parent_ran(qdb: QueueDatabase) -> None:
    """The worker settles only the children a parent had when it was claimed; a burst must not end with a
    later child waiting for a parent that finished."""
    app, slow, gate, started, done = gated_app(qdb)
    parent = slow.enqueue({"n": 1})
    burst = qdb.start(app, burst=True)
    assert started.wait(10)
    child = slow.enqueue({"n": 2}, after=[parent])
    gate.set()
    stats = burst.join(30)
    assert (stats.succeeded, done) == (2, [1, 2])
    assert app.get(child.id).status == "succeeded"


def test_a_child_enqueued_while_its_parent_runs_is_settled_by_upkeep(qdb: QueueDatabase) -> None:
    app, slow, gate, started, done = gated_app(qdb)
    parent = slow.enqueue({"n": 1})
    worker = qdb.start(app)
    try:
        assert started.wait(10)
        child = slow.enqueue({"n": 2}, after=[parent])
        gate.set()
        wait_until(lambda: app.get(child.id).status == "succeeded", what="the child, settled by upkeep")
        assert done == [1, 2]
    finally:
        gate.set()
        worker.stop()


def test_a_workflow_is_enqueued_all_or_nothing(qdb: QueueDatabase) -> None:
    app, _ = recording_app(qdb)
    with pytest.raises(dibs.InvalidArgument):
        app.chain(Step("flow.step", {"n": 1}), Step("flow.step", {"n": "not json" + chr(0)}), Step("nope"))
    with pytest.raises(dibs.InvalidArgument, match="after names jobs that do not exist: 999999"):
        app.enqueue("flow.step", {"n": 1}, after=[999999])
    with pytest.raises(dibs.InvalidArgument, match="on_parent_failure must be"):
        app.enqueue("flow.step", {"n": 1}, after=[1], on_parent_failure="maybe")
    with qdb.engine.connect() as conn:
        conn.begin()
        app.group([Step("flow.step", {"n": 1})], then=Step("flow.step", {"n": 2}), conn=conn)
        conn.rollback()
    assert job_count(qdb.engine) == 0


def test_async_workflows(qdb: QueueDatabase) -> None:
    app, _ = recording_app(qdb)

    async def main() -> Any:
        made = await app.achain(Step("flow.step", {"n": 1}), Step("flow.step", {"n": 2}))
        grouped = await app.agroup([Step("flow.step", {"n": 3})], then=Step("flow.step", {"n": 4}))
        await qdb.worker(app, burst=True).arun()
        return await made[-1].aresult(timeout=5), await grouped[-1].aresult(timeout=5)

    assert asyncio.run(main()) == (30, 70)


def test_a_fan_in_of_ten_thousand_parents(qdb: QueueDatabase) -> None:
    app = qdb.app()
    count = 10_000

    # Only the last parent returns a value: the others' successes are written in batches, as plain jobs'.
    @app.task(name="flow.leaf")
    def leaf(n: int) -> int | None:
        return n if n == count - 1 else None

    @app.task(name="flow.total")
    def total(context: dibs.JobContext) -> list[Any]:
        return [len(context.parent_results), context.parent_results[-1]]

    made = app.group([Step(leaf, {"n": n}) for n in range(count)], then=Step(total))
    assert made[-1].status == "waiting"
    stats = qdb.drain(app, timeout=600, concurrency=20, batch=200)
    assert stats.succeeded == count + 1
    assert made[-1].result(timeout=5) == [count, count - 1]


def test_purge_keeps_a_finished_parent_until_its_children_are_settled(qdb: QueueDatabase) -> None:
    app, ran = recording_app(qdb)
    parent = app.enqueue("flow.step", {"n": 1})
    child = app.enqueue("flow.step", {"n": 2}, after=[parent])
    # Finished as by a worker that died before settling its children: only upkeep can queue the child now.
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    with app.engine.begin() as conn:
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.id == parent.id)
            .values(status="succeeded", finished_at=an_hour_ago, result="10")
        )
    assert app.purge() == 0
    assert app.get(child.id).status == "waiting"
    worker = qdb.start(app)
    try:
        wait_until(lambda: app.get(child.id).status == "succeeded", what="the child, settled by upkeep")
    finally:
        worker.stop()
    assert ran == [("step", 2, [10])]
    assert app.purge() == 2
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.job_parents)).scalar_one() == 0
