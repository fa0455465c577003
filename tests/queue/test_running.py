"""Running jobs: retries and dead letters, scheduled times, priorities, ordering keys, cancellation, timeouts."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import (
    QUICK_RETRY,
    analyzed_then_finished,
    assert_reads_indexes,
    caught_statements,
    database_now,
    job_rows,
)

# -- retries and dead letters --------------------------------------------------------------------------


def test_a_job_that_always_fails_is_retried_with_backoff_then_dead(qdb: QueueDatabase) -> None:
    app = qdb.app()
    attempts_at: list[float] = []

    @app.task(name="mail.send", max_attempts=3, retry=dibs.Retry(base=0.2, factor=2.0, jitter=0.0))
    def send(to: str) -> None:
        attempts_at.append(time.monotonic())
        raise ConnectionError(f"smtp server refused mail to {to}")

    job = app.enqueue(send, {"to": "ann@example.com"})
    stats = qdb.drain(app)

    dead = app.get(job.id)
    assert (dead.status, dead.attempts) == ("dead", 3)
    assert dead.finished_at is not None
    assert job_rows(qdb.engine)[0].lease_expires_at is None
    assert dead.last_error is not None
    assert dead.last_error.startswith("ConnectionError: smtp server refused mail to ann@example.com")
    assert "Traceback" in dead.last_error
    assert (stats.retried, stats.dead, stats.succeeded) == (2, 1, 0)
    # Attempt n+1 waited base * factor ** (n-1) seconds on the database clock after attempt n failed.
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts_at)]
    assert len(gaps) == 2
    assert gaps[0] >= 0.2 - 0.02
    assert gaps[1] >= 0.4 - 0.02
    assert [job.id for job in app.jobs(status="dead")] == [job.id]


def test_an_error_the_retry_filter_does_not_name_goes_straight_to_the_dead_letters(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="mail.send", max_attempts=5, retry=dibs.Retry(base=0.05, on=(ConnectionError,)))
    def send(to: str) -> None:
        raise ValueError(f"{to!r} is not an email address")

    job = app.enqueue(send, {"to": "nobody"})
    stats = qdb.drain(app)

    dead = app.get(job.id)
    assert (dead.status, dead.attempts, dead.max_attempts) == ("dead", 1, 5)
    assert dead.last_error is not None
    assert dead.last_error.startswith("ValueError: 'nobody' is not an email address")
    assert (stats.retried, stats.dead) == (0, 1)


def test_a_job_that_fails_twice_then_succeeds_ends_succeeded(qdb: QueueDatabase) -> None:
    app = qdb.app()
    calls: list[int] = []

    @app.task(name="feed.fetch", max_attempts=3, retry=QUICK_RETRY)
    def fetch(url: str, context: dibs.JobContext) -> None:
        calls.append(context.attempt)
        if len(calls) < 3:
            raise TimeoutError(f"{url} did not answer")

    job = app.enqueue(fetch, {"url": "https://example.com/feed"})
    stats = qdb.drain(app)

    done = app.get(job.id)
    assert (done.status, done.attempts) == ("succeeded", 3)
    assert calls == [1, 2, 3]
    assert (stats.retried, stats.succeeded, stats.dead) == (2, 1, 0)


def test_a_task_raising_its_own_timeout_error_is_retried_like_any_error(qdb: QueueDatabase) -> None:
    # TimeoutError raised by the task itself (a socket timeout), with and without a task timeout: it is
    # the task's error, not the worker's timeout.
    app = qdb.app()

    @app.task(name="feed.fetch", max_attempts=2, retry=dibs.Retry(base=0.05, on=(TimeoutError,)))
    def fetch(url: str) -> None:
        raise TimeoutError(f"{url} did not answer")

    @app.task(name="feed.afetch", max_attempts=2, retry=dibs.Retry(base=0.05, on=(TimeoutError,)), timeout=30)
    async def afetch(url: str) -> None:
        raise TimeoutError(f"{url} did not answer")

    first = app.enqueue(fetch, {"url": "https://example.com/a"})
    second = app.enqueue(afetch, {"url": "https://example.com/b"})
    stats = qdb.drain(app)

    for job, url in ((first, "https://example.com/a"), (second, "https://example.com/b")):
        dead = app.get(job.id)
        assert (dead.status, dead.attempts) == ("dead", 2)
        assert dead.last_error is not None
        assert dead.last_error.startswith(f"TimeoutError: {url} did not answer")
        assert "Traceback" in dead.last_error
    assert (stats.retried, stats.dead) == (2, 2)


def test_retry_queues_a_dead_job_again_and_it_runs(qdb: QueueDatabase) -> None:
    app = qdb.app()
    broken = threading.Event()
    broken.set()
    ran: list[int] = []

    @app.task(name="report.build", max_attempts=1)
    def build(report: int) -> None:
        ran.append(report)
        if broken.is_set():
            raise RuntimeError("the reporting database is down")

    job = app.enqueue(build, {"report": 7})
    qdb.drain(app)
    dead = app.get(job.id)
    assert dead.status == "dead"

    waiting = app.enqueue(build, {"report": 8}, delay=60)
    with pytest.raises(dibs.InvalidArgument, match=r"job \d+ is scheduled; only dead or cancelled jobs can be retried"):
        app.retry(waiting.id)
    app.cancel(waiting.id)
    broken.clear()
    again = app.retry(job.id)
    assert (again.status, again.attempts, again.finished_at, again.last_error) == (
        "queued",
        0,
        None,
        dead.last_error,
    )
    qdb.drain(app)
    done = app.get(job.id)
    assert (done.status, done.attempts) == ("succeeded", 1)
    assert ran == [7, 7]
    with pytest.raises(dibs.JobNotFound):
        app.retry(10**9)


# -- scheduled jobs ------------------------------------------------------------------------------------


def test_scheduled_jobs_never_run_before_their_time_on_the_database_clock(qdb: QueueDatabase) -> None:
    app = qdb.app()
    started: dict[int, datetime] = {}

    @app.task(name="remind.send")
    def remind(context: dibs.JobContext) -> None:
        started[context.job_id] = database_now(app.engine)

    delayed = app.enqueue(remind, delay=1.5)
    at = app.enqueue(remind, run_at=database_now(qdb.engine) + timedelta(seconds=1.0))
    later = app.enqueue(remind, delay=timedelta(minutes=10))
    for job in (delayed, at, later):
        assert app.get(job.id).status == "scheduled"
    # On SQLite the application's clock is read for run_at a moment before it is read for enqueued_at.
    assert app.get(delayed.id).run_at - app.get(delayed.id).enqueued_at >= timedelta(seconds=1.45)

    running = qdb.start(app, burst=False)
    wait_until(lambda: len(started) == 2, timeout=10, what="the two due jobs to run")
    time.sleep(0.3)
    running.stop()

    for job in (delayed, at):
        stored = app.get(job.id)
        assert stored.status == "succeeded"
        assert stored.started_at is not None
        assert stored.started_at >= stored.run_at
        assert started[job.id] >= stored.run_at
    assert app.get(later.id).status == "scheduled"
    assert later.id not in started


# -- priorities ----------------------------------------------------------------------------------------


def test_higher_priority_jobs_are_claimed_first(qdb: QueueDatabase) -> None:
    app = qdb.app()
    order: list[str] = []

    @app.task(name="work.do")
    def do(name: str) -> None:
        order.append(name)

    for name, priority in [("low", -5), ("normal-1", 0), ("urgent", 100), ("normal-2", 0), ("high", 10)]:
        app.enqueue(do, {"name": name}, priority=priority)
    qdb.drain(app, concurrency=1, batch=1)
    assert order == ["urgent", "high", "normal-1", "normal-2", "low"]


# -- ordering keys -------------------------------------------------------------------------------------


def test_jobs_of_one_ordering_key_run_one_at_a_time_in_enqueue_order(qdb: QueueDatabase) -> None:
    app = qdb.app()
    spans: list[tuple[str, int, float, float]] = []

    @app.task(name="account.apply", ordering_key="account")
    def apply(account: str, seq: int) -> None:
        start = time.monotonic()
        time.sleep(0.03)
        spans.append((account, seq, start, time.monotonic()))

    accounts = ["a", "b", "c"]
    per_account = 6
    app.enqueue_many(apply, [{"account": account, "seq": seq} for seq in range(per_account) for account in accounts])
    qdb.drain(app, concurrency=8)

    assert len(spans) == len(accounts) * per_account
    for account in accounts:
        mine = sorted((span for span in spans if span[0] == account), key=lambda span: span[2])
        assert [span[1] for span in mine] == list(range(per_account))
        for earlier, later in itertools.pairwise(mine):
            assert earlier[3] <= later[2], f"jobs {earlier} and {later} of account {account} overlapped"
    overlapping = [
        (one, other)
        for one in spans
        for other in spans
        if one[0] < other[0] and one[2] < other[3] and other[2] < one[3]
    ]
    assert overlapping, "jobs of different accounts never ran at the same time"
    assert {row.status for row in job_rows(qdb.engine)} == {"succeeded"}


# -- cancellation --------------------------------------------------------------------------------------


def test_a_cancelled_waiting_job_never_runs(qdb: QueueDatabase) -> None:
    app = qdb.app()
    ran: list[int] = []

    @app.task(name="work.do")
    def do(n: int) -> None:
        ran.append(n)

    queued = app.enqueue(do, {"n": 1})
    scheduled = app.enqueue(do, {"n": 2}, delay=0.2)
    kept = app.enqueue(do, {"n": 3})
    for job in (queued, scheduled):
        cancelled = app.cancel(job.id)
        assert (cancelled.status, cancelled.last_error) == ("cancelled", "cancelled before it ran")
        assert cancelled.finished_at is not None
    time.sleep(0.3)
    stats = qdb.drain(app)
    assert ran == [3]
    assert stats.claimed == 1
    assert [app.get(job.id).status for job in (queued, scheduled, kept)] == ["cancelled", "cancelled", "succeeded"]
    assert app.cancel(kept.id).status == "succeeded"  # a finished job is left as it is


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_cancelled_running_job_stops_quickly_and_ends_cancelled(qdb: QueueDatabase, kind: str) -> None:
    app = qdb.app()
    reasons: list[str | None] = []

    @app.task(name="work.async_loop")
    async def async_loop(context: dibs.JobContext) -> None:
        try:
            while not context.should_stop:
                await asyncio.sleep(0.02)
        finally:
            reasons.append(context.stop_reason)

    @app.task(name="work.sync_wait")
    def sync_wait(context: dibs.JobContext) -> None:
        context.wait(30)
        reasons.append(context.stop_reason)

    job = app.enqueue(async_loop if kind == "async" else sync_wait)
    running = qdb.start(app, burst=True, lease=1.0, heartbeat=0.1)
    wait_until(lambda: app.get(job.id).status == "running", what="the job to start")
    requested = app.cancel(job.id)
    assert (requested.status, requested.cancel_requested) == ("running", True)
    asked = time.monotonic()
    stats = running.join(timeout=10)
    assert time.monotonic() - asked < 2.0
    ended = app.get(job.id)
    assert ended.status == "cancelled"
    assert ended.last_error is not None
    assert "cancelled" in ended.last_error
    assert reasons == ["cancelled"]
    assert (stats.cancelled, stats.succeeded) == (1, 0)


# -- timeouts ------------------------------------------------------------------------------------------


def test_an_async_job_past_its_timeout_is_stopped_retried_then_dead(qdb: QueueDatabase) -> None:
    app = qdb.app()
    attempts: list[float] = []

    @app.task(name="work.slow", timeout=0.3, max_attempts=2, retry=QUICK_RETRY)
    async def slow() -> None:
        attempts.append(time.monotonic())
        await asyncio.sleep(10)

    job = app.enqueue(slow)
    began = time.monotonic()
    stats = qdb.drain(app)
    assert time.monotonic() - began < 5
    dead = app.get(job.id)
    assert (dead.status, dead.attempts) == ("dead", 2)
    assert dead.last_error is not None
    assert dead.last_error.startswith("TimeoutError: the job ran longer than its timeout of 0.3 seconds")
    assert (stats.retried, stats.dead) == (1, 1)
    assert len(attempts) == 2


def test_on_sqlite_the_ordering_key_check_reads_the_ordering_index(tmp_path: Path) -> None:
    """SQLite uses a partial index only when the query repeats its condition with the same literals: with the
    live states bound as parameters, the check scanned the whole table for every candidate with a key."""
    from dibs.queue.store import JobStore

    app = dibs.App(f"sqlite:///{tmp_path / 'ordering.sqlite'}")

    @app.task(name="account.apply", ordering_key="account")
    def apply(account: str) -> None:
        return None

    app.init()
    app.enqueue_many(apply, [{"account": f"a{n % 50}"} for n in range(500)])
    statements: list[tuple[str, Any]] = []

    def caught(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "dibs_other" in statement:
            statements.append((statement, parameters))

    sa.event.listen(app.engine, "before_cursor_execute", caught)
    claimed = JobStore(app.engine).claim(
        app.engine, owner="w", lease_seconds=30, limit=100, queues=["default"], tasks=[apply.name], tags=[]
    )
    sa.event.remove(app.engine, "before_cursor_execute", caught)
    assert len(claimed) == 50, "one job per account: the oldest of each"
    statement, parameters = statements[0]
    with app.engine.connect() as conn:
        plan = " | ".join(row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters))
    app.engine.dispose()
    assert "dibs_jobs_ordering" in plan, plan
    assert "SCAN dibs_other" not in plan, plan


def test_a_burst_worker_stops_when_only_jobs_of_tasks_it_does_not_run_are_left(qdb: QueueDatabase) -> None:
    producer = qdb.app()

    @producer.task(name="mail.send")
    def send() -> None:
        return None

    @producer.task(name="report.build")
    def build() -> None:
        return None

    producer.enqueue_many(send, [{}] * 3)
    waiting = producer.enqueue(build, {})
    mailer = qdb.app()

    @mailer.task(name="mail.send")
    def send_here() -> None:
        return None

    stats = qdb.drain(mailer, timeout=10.0)

    assert stats.succeeded == 3
    assert producer.get(waiting.id).status == "queued"


# -- the worker process's garbage collector ------------------------------------------------------------


def test_a_worker_told_to_tune_the_gc_runs_jobs_with_it_tuned_and_puts_it_back(qdb: QueueDatabase) -> None:
    import gc

    from dibs.runtime.collector import TUNED_GC_THRESHOLD

    app = qdb.app()
    seen: list[tuple[int, int]] = []

    @app.task(name="gc.look")
    def look() -> None:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))

    before = (gc.get_threshold(), gc.get_freeze_count())
    app.enqueue(look)
    assert qdb.drain(app, tune_gc=True).succeeded == 1
    ((threshold, frozen),) = seen
    assert threshold == TUNED_GC_THRESHOLD
    assert frozen > 0  # what existed at start is out of the collector's sight
    assert (gc.get_threshold(), gc.get_freeze_count()) == before

    app.enqueue(look)
    assert qdb.drain(app).succeeded == 1  # not asked: left as it is
    assert seen[1] == (before[0][0], before[1])


def test_a_worker_is_ready_from_its_start_until_it_stops(qdb: QueueDatabase) -> None:
    app = qdb.app()
    seen: list[bool] = []

    @app.task(name="ready.look")
    def look() -> None:
        seen.append(worker.ready.is_set())

    worker = app.worker(concurrency=1, poll=0.05, handle_signals=False)
    assert not worker.ready.is_set()
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert worker.ready.wait(30)
        app.enqueue(look)
        wait_until(lambda: seen, timeout=30)
    finally:
        worker.stop()
        runner.join(30)
    assert seen == [True]
    assert not runner.is_alive()
    assert not worker.ready.is_set()


# -- the end of a burst ----------------------------------------------------------------------------------


def test_a_burst_worker_waits_for_a_job_running_elsewhere_and_ends_soon_after_it(qdb: QueueDatabase) -> None:
    app = qdb.app()
    release = threading.Event()
    started = threading.Event()

    @app.task(name="slow.step")
    def step() -> None:
        started.set()
        release.wait(30)

    job = app.enqueue(step)
    qdb.start(app)  # runs the job, until told to let it end
    assert started.wait(30)
    # A burst worker with a long poll: it stays while the job runs elsewhere (it may fail and be retried,
    # or its worker crash), and it leaves soon after the job ends, not after a backoff grown towards its poll.
    other = qdb.app()
    other.task(name="slow.step")(step.function)
    burst = qdb.start(other, burst=True, poll=5.0)
    time.sleep(3.0)
    assert burst.thread.is_alive(), "a burst worker left while a job of its queue was still running"
    release.set()
    ended = time.monotonic()
    stats = burst.join(10.0)
    waited = time.monotonic() - ended
    assert app.get(job.id).status == "succeeded"
    assert stats.claimed == 0
    # Its looks back off from 10 ms to 0.4 s (with a poll of 5 s it used to back off towards 5 s).
    assert waited < 1.2, f"the burst worker took {waited:.2f} s to end after the last job did"


def recorded_claims(app: dibs.App) -> list[int]:
    """The limit of every claim the app's workers make from now on."""
    asked: list[int] = []
    claim = app.store.claim

    def recorded(*args: Any, **options: Any) -> list[dibs.Lease]:
        asked.append(options["limit"])
        return claim(*args, **options)

    app.store.claim = recorded  # type: ignore[method-assign]
    return asked


def test_a_claim_takes_no_more_jobs_than_the_worker_has_idle_runners(qdb: QueueDatabase) -> None:
    app = qdb.app()
    running = 0
    most = 0

    @app.task(name="quick.nap")
    async def nap() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    app.enqueue_many(nap, [{}] * 30)
    asked = recorded_claims(app)
    stats = qdb.drain(app, concurrency=3, batch=20)

    assert stats.succeeded == 30
    # A claimed job counts an attempt: one that waited in the worker behind others would lose it if the
    # worker died before starting it.
    assert asked, "the worker never claimed"
    assert max(asked) <= 3, asked
    assert most == 3


def test_quick_jobs_are_claimed_in_full_batches(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="quick.step")
    async def step() -> None:
        return None

    app.enqueue_many(step, [{}] * 100)
    asked = recorded_claims(app)
    stats = qdb.drain(app, concurrency=40, batch=20)

    assert stats.succeeded == 100
    # With twice the batch in runners, a batch's worth of them is idle again by the time a claim returns.
    assert max(asked) == 20
    assert statistics.median(asked) == 20, asked


def test_a_burst_worker_stops_when_only_jobs_of_tags_it_lacks_are_left(qdb: QueueDatabase) -> None:
    producer = qdb.app()

    @producer.task(name="video.encode", tag="gpu")
    def encode() -> None:
        return None

    @producer.task(name="video.probe")
    def probe() -> None:
        return None

    waiting = producer.enqueue(encode, {})
    producer.enqueue_many(probe, [{}] * 2)

    stats = qdb.drain(producer, timeout=10.0)  # a worker without the gpu tag

    assert stats.succeeded == 2
    assert producer.get(waiting.id).status == "queued"


#: The statements a worker runs when it looks for work, by what the statistics were taken on: each
#: must read the index of its state, not the whole table.
LOOKS = {
    "work left": ("queued", ("dibs_jobs_claim", "dibs_jobs_due", "dibs_jobs_expiry")),
    "promote due": ("scheduled", ("dibs_jobs_due",)),
    "recover expired": ("running", ("dibs_jobs_expiry",)),
}


@pytest.mark.parametrize("look", list(LOOKS))
def test_a_workers_looks_read_indexes_even_with_statistics_of_a_backlog(
    qdb: QueueDatabase, look: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statistics were taken while a backlog waited (queued, scheduled or running), so the database
    believes most rows are in that state; the jobs then finished. The looks of every worker (promote due
    jobs, recover expired leases, and a burst worker's look for work left) must still read the indexes of
    their states, not every finished row: planned without an order to follow, they were scans of the whole
    table (on PostgreSQL all three; on MariaDB and SQLite the queued and running probes)."""
    state, indexes = LOOKS[look]
    app = qdb.app()

    @app.task(name="bulk.step")
    def step() -> None:
        return None

    app.enqueue_many(step, [{}] * 3000)
    expired = datetime.now(timezone.utc) - timedelta(minutes=5)
    analyzed_then_finished(
        qdb.engine,
        dibs.schema.jobs,
        {"status": state, "lease_expires_at": expired},
        {"status": "succeeded", "lease_expires_at": None, "dedupe_key": None},
    )
    # Rounds far smaller than the table: an ordered read of a few rows is clearly cheaper than a sort of all.
    monkeypatch.setattr("dibs.queue.store.UPKEEP_BATCH", 100)
    store = app.store
    found: list[Any] = []
    if look == "work left":
        statements = caught_statements(
            qdb.engine, lambda: found.append(store.work_left(qdb.engine, ["default", "reports"], [step.name]))
        )
        assert found == [(False, False, False)]
    elif look == "promote due":
        statements = caught_statements(qdb.engine, lambda: found.append(store.promote_due(qdb.engine)))
        assert found == [0]
    else:
        statements = caught_statements(qdb.engine, lambda: found.append(store.recover_expired(qdb.engine)))
        assert found == [(0, 0)]
    assert_reads_indexes(qdb.engine, statements, "dibs_jobs", list(indexes))


def test_the_work_left_probe_sees_each_kind_of_work(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="bulk.step")
    def step() -> None:
        return None

    store = app.store
    assert store.work_left(qdb.engine, ["default"], [step.name]) == (False, False, False)
    queued = app.enqueue(step)
    assert store.work_left(qdb.engine, ["default"], [step.name]) == (True, False, False)
    [lease] = store.claim(
        qdb.engine, owner="w", lease_seconds=30, limit=1, queues=["default"], tasks=[step.name], tags=[]
    )
    assert lease.key[0] == queued.id
    assert store.work_left(qdb.engine, ["default"], [step.name]) == (False, False, True)
    assert store.work_left(qdb.engine, ["reports"], [step.name]) == (False, False, False)
    store.retry(qdb.engine, lease, timedelta(hours=1), "later")
    assert store.work_left(qdb.engine, ["default"], [step.name]) == (False, True, False)
