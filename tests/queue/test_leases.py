"""Fenced leases under the queue: a stale worker changes nothing, a killed worker's jobs run again, and a
terminated worker finishes what it runs and gives back the rest at once."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase, start_worker
from tests.queue.support import job_rows, run_events, runs
from tests.queue.worker_process import build_app

ROOT = Path(__file__).resolve().parents[2]


def test_a_stale_workers_completion_is_rejected_and_the_new_owners_counts(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.do")
    def do() -> None: ...

    job = app.enqueue(do)
    store, engine = app.store, app.engine
    claim = {"limit": 1, "queues": ["default"], "tasks": ["work.do"], "tags": []}

    (stale,) = store.claim(engine, owner="worker-a", lease_seconds=0.3, **claim)
    assert store.claim(engine, owner="worker-b", lease_seconds=30, **claim) == []  # held: nothing to claim
    assert store.recover_expired(engine) == (0, 0)  # not expired yet
    time.sleep(0.5)
    assert store.recover_expired(engine) == (1, 0)
    recovered = app.get(job.id)
    assert (recovered.status, recovered.lease_owner, recovered.attempts) == ("queued", None, 1)
    (current,) = store.claim(engine, owner="worker-b", lease_seconds=30, **claim)
    assert current.key == stale.key
    assert current.token == stale.token + 1

    # Worker A wakes up and reports: every write it tries is refused, and the row stays B's.
    assert store.succeed(engine, [stale]) == [stale]
    assert store.retry(engine, stale, dibs.Retry().delay(1), "stale") is False
    assert store.bury(engine, stale, "stale") is False
    assert store.release(engine, [stale]) == [stale]
    assert store.renew(engine, [stale], 30) == [stale]
    row = job_rows(engine)[0]
    assert (row.status, row.lease_owner, row.lease_token, row.attempts) == ("running", "worker-b", current.token, 2)
    assert row.finished_at is None

    assert store.succeed(engine, [current]) == []
    done = app.get(job.id)
    assert (done.status, done.lease_owner, done.attempts) == ("succeeded", "worker-b", 2)
    assert done.finished_at is not None


def test_an_expired_lease_on_the_last_attempt_is_dead(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="work.do", max_attempts=1)
    def do() -> None: ...

    job = app.enqueue(do)
    (lease,) = app.store.claim(
        app.engine, owner="worker-a", lease_seconds=0.2, limit=1, queues=["default"], tasks=["work.do"], tags=[]
    )
    time.sleep(0.4)
    assert app.store.recover_expired(app.engine) == (0, 1)
    dead = app.get(job.id)
    assert (dead.status, dead.attempts) == ("dead", 1)
    assert dead.last_error is not None
    assert "stopped renewing its lease" in dead.last_error
    assert app.store.succeed(app.engine, [lease]) == [lease]


def test_a_lease_expiring_between_the_recovery_passes_is_not_queued_past_its_last_attempt(
    qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = qdb.app()

    @app.task(name="work.do", max_attempts=1)
    def do() -> None: ...

    job = app.enqueue(do)
    app.store.claim(
        app.engine, owner="worker-a", lease_seconds=30, limit=1, queues=["default"], tasks=["work.do"], tags=[]
    )
    recover = dibs.queue.store.leases.recover
    passes = []

    def expiring_after_the_first_pass(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        found = recover(*args, **kwargs)
        if not passes:  # the lease runs out just after the pass that buries last attempts looked
            with qdb.engine.begin() as conn:
                conn.execute(jobs.update().values(lease_expires_at=jobs.c.enqueued_at))
        passes.append(found)
        return found

    monkeypatch.setattr(dibs.queue.store.leases, "recover", expiring_after_the_first_pass)
    assert app.store.recover_expired(app.engine) == (0, 0)
    assert app.get(job.id).status == "running"
    monkeypatch.undo()
    assert app.store.recover_expired(app.engine) == (0, 1)
    dead = app.get(job.id)
    assert (dead.status, dead.attempts) == ("dead", 1)


# -- worker processes ----------------------------------------------------------------------------------


@pytest.fixture
def spawn(qdb: QueueDatabase, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start worker processes (tests.queue.worker_process) on the test's database; all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    runs.create(qdb.engine)
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_a_killed_workers_jobs_run_again_and_none_is_lost(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    app = build_app(qdb.url.render_as_string(False))
    try:
        enqueued = app.enqueue_many("tests.nap", [{"seconds": 0.15}] * 40)
        log = tmp_path / "worker.log"
        start_worker(qdb, spawn, log, "--concurrency", "4", "--batch", "8", "--lease", "1.5")
        (process,) = spawn

        def in_flight() -> bool:
            """Some jobs recorded succeeded, and some started and not finished."""
            events = run_events(qdb.engine)
            finished = {job for job, event in events if event == "finished"}
            started = {job for job, event in events if event == "started"}
            succeeded = job_rows(qdb.engine, jobs.c.status == "succeeded")
            return len(succeeded) >= 4 and bool(started - finished)

        wait_until(lambda: in_flight() or process.poll() is not None, timeout=30, what="jobs to be in flight")
        assert process.poll() is None, log.read_text()
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL

        events = run_events(qdb.engine)
        cut_short = {job for job, event in events if event == "started"} - {
            job for job, event in events if event == "finished"
        }
        held = {row.id for row in job_rows(qdb.engine, jobs.c.status == "running")}
        done_before = {row.id for row in job_rows(qdb.engine, jobs.c.status == "succeeded")}
        assert cut_short, "no job was running when the worker was killed"
        assert cut_short <= held
        assert done_before

        stats = qdb.drain(app, concurrency=8, lease=1.5)  # recovers the killed worker's leases when they expire

        rows = {row.id: row for row in job_rows(qdb.engine)}
        assert sorted(rows) == [job.id for job in enqueued]
        assert {row.status for row in rows.values()} == {"succeeded"}, "a job was lost"
        starts = Counter(job for job, event in run_events(qdb.engine) if event == "started")
        finishes = Counter(job for job, event in run_events(qdb.engine) if event == "finished")
        for job_id, row in rows.items():
            assert finishes[job_id] >= 1
            if job_id in held:  # claimed by the killed worker: it ran again here
                assert row.attempts >= 2, f"job {job_id} held by the killed worker was not run again"
            else:
                assert (row.attempts, starts[job_id]) == (1, 1), f"job {job_id} ran more than once"
        for job_id in cut_short:
            assert starts[job_id] >= 2
        assert stats.succeeded == len(enqueued) - len(done_before)
    finally:
        app.engine.dispose()


def started_runs(qdb: QueueDatabase) -> Counter[int]:
    return Counter(job for job, event in run_events(qdb.engine) if event == "started")


def kill_once_started(qdb: QueueDatabase, process: subprocess.Popen[bytes], log: Path, job_id: int, runs: int) -> None:
    """SIGKILL the worker process once job ``job_id`` has started for the ``runs``-th time."""
    wait_until(
        lambda: started_runs(qdb)[job_id] >= runs or process.poll() is not None,
        timeout=30,
        what=f"job {job_id} to start (run {runs})",
    )
    assert process.poll() is None, log.read_text()
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL


def test_jobs_a_killed_worker_claimed_but_never_started_keep_their_attempt(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    app = build_app(qdb.url.render_as_string(False))
    try:
        first, *rest = app.enqueue_many("tests.nap", [{"seconds": 60}] + [{"seconds": 0.01}] * 5, max_attempts=1)
        log = tmp_path / "worker.log"
        # A batch that would take every job at once, and one runner: only the job it runs may be claimed.
        start_worker(qdb, spawn, log, "--concurrency", "1", "--batch", "6", "--lease", "1")
        kill_once_started(qdb, spawn[0], log, first.id, runs=1)

        qdb.drain(app, concurrency=2, lease=1)  # recovers the killed worker's lease when it expires

        starts = started_runs(qdb)
        for job in rest:
            row = app.get(job.id)
            assert (row.status, row.attempts, starts[job.id]) == ("succeeded", 1, 1), (
                f"job {job.id}, claimed but never started by the killed worker, lost its only attempt"
            )
        killed = app.get(first.id)
        assert (killed.status, killed.attempts, starts[first.id]) == ("dead", 1, 1)
        assert "stopped renewing its lease" in (killed.last_error or "")
    finally:
        app.engine.dispose()


def test_a_job_whose_worker_dies_while_it_runs_counts_that_run(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    app = build_app(qdb.url.render_as_string(False))
    try:
        (job,) = app.enqueue_many("tests.nap", [{"seconds": 60}], max_attempts=2)
        for run in (1, 2):
            log = tmp_path / f"worker-{run}.log"
            start_worker(qdb, spawn, log, "--concurrency", "2", "--lease", "1")
            kill_once_started(qdb, spawn[-1], log, job.id, runs=run)

        # Both runs were counted: the recovery buries the job instead of running it a third time.
        wait_until(lambda: app.store.recover_expired(app.engine) == (0, 1), timeout=10, what="the lease to expire")
        row = app.get(job.id)
        assert (row.status, row.attempts, started_runs(qdb)[job.id]) == ("dead", 2, 2)
    finally:
        app.engine.dispose()


def test_sigterm_finishes_running_jobs_and_leaves_the_rest_queued(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    app = build_app(qdb.url.render_as_string(False))
    try:
        enqueued = app.enqueue_many("tests.nap", [{"seconds": 0.5}] * 12)
        log = tmp_path / "worker.log"
        grace = 5.0
        # A long lease: anything queued again below was given back by the worker, not recovered after expiry.
        start_worker(qdb, spawn, log, "--concurrency", "2", "--batch", "10", "--lease", "60", "--grace", str(grace))
        (process,) = spawn
        wait_until(
            lambda: len(run_events(qdb.engine)) >= 2 or process.poll() is not None, timeout=30, what="two jobs to start"
        )
        assert process.poll() is None, log.read_text()
        claimed = {row.id for row in job_rows(qdb.engine, jobs.c.status == "running")}
        assert len(claimed) == 2, "a worker with two runners claimed more jobs than it could start"
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert process.wait(grace + 5) == 0, log.read_text()
        assert time.monotonic() - sent < grace, log.read_text()

        events = run_events(qdb.engine)
        started = {job for job, event in events if event == "started"}
        finished = {job for job, event in events if event == "finished"}
        assert started == finished, "a running job was cut short"
        rows = job_rows(qdb.engine)
        assert [row.id for row in rows] == [job.id for job in enqueued]
        for row in rows:
            if row.id in started:
                assert (row.status, row.attempts) == ("succeeded", 1)
            else:
                assert (row.status, row.lease_owner, row.lease_expires_at, row.attempts) == ("queued", None, None, 0)
        assert claimed <= started
    finally:
        app.engine.dispose()


def test_jobs_of_a_claim_that_returns_as_the_worker_stops_are_given_back_with_no_attempt_spent(
    qdb: QueueDatabase,
) -> None:
    app = qdb.app()
    ran: list[int] = []

    @app.task(name="tests.note")
    def note(n: int) -> None:
        ran.append(n)

    enqueued = app.enqueue_many(note, [{"n": n} for n in range(5)])
    worker = qdb.worker(app, concurrency=5, lease=60)
    claim = app.store.claim

    def stopped_while_claiming(*args: Any, **options: Any) -> list[dibs.Lease]:
        claimed = claim(*args, **options)
        worker.stop()
        return claimed

    app.store.claim = stopped_while_claiming  # type: ignore[method-assign]
    stats = worker.run()

    assert (stats.claimed, stats.released, ran) == (0, 5, [])
    for job in enqueued:
        row = app.get(job.id)
        assert (row.status, row.attempts, row.lease_owner) == ("queued", 0, None)


def test_a_claimed_jobs_row_holds_what_the_worker_reads_where_it_reads_it(qdb: QueueDatabase) -> None:
    from dibs.queue.store import ARGS_AT, ATTEMPTS_AT, CLAIMED, ID_AT, TASK_AT

    app = qdb.app()

    @app.task(name="work.read")
    def read(n: int) -> None: ...

    job = app.enqueue(read, {"n": 7})
    claim = {"limit": 1, "queues": ["default"], "tasks": ["work.read"], "tags": []}
    (lease,) = app.store.claim(app.engine, owner="w", lease_seconds=30, **claim)
    # The worker reads the row by position: the positions must name the columns the claim returns.
    assert lease.row._fields == tuple(column.name for column in CLAIMED)
    row = lease.row
    assert (row[ID_AT], row[TASK_AT], row[ATTEMPTS_AT]) == (job.id, "work.read", 1)
    assert json.loads(row[ARGS_AT]) == {"n": 7}
    assert app.store.succeed(app.engine, [lease]) == []


@pytest.mark.parametrize("first_write", ["written", "failing once"])
def test_a_run_whose_lease_expired_leaves_the_run_that_claimed_its_job_again_renewed_and_stoppable(
    qdb: QueueDatabase, first_write: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dibs.worker")
    app = qdb.app()
    failures = [ConnectionError("the database went away")] if first_write == "failing once" else []

    @sa.event.listens_for(app.engine, "before_cursor_execute")
    def fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The stale run's success is kept to be written again: it must not be renewed over the new lease.
        if statement.startswith("UPDATE dibs_jobs SET status='succeeded'") and failures:
            raise failures.pop()

    first_may_end, second_may_end = threading.Event(), threading.Event()
    started: list[int] = []

    @app.task(name="work.twice")
    def twice() -> None:
        started.append(len(started) + 1)
        (first_may_end if len(started) == 1 else second_may_end).wait(20)

    running = qdb.start(app, concurrency=2, lease=30.0)
    job = app.enqueue(twice)
    wait_until(lambda: started == [1], timeout=10, what="the first run")
    # The worker's renewals stopped reaching the database past the lease (an outage): the lease expired, and
    # the worker itself recovers the job and claims it again while its first run goes on.
    with qdb.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job.id).values(lease_expires_at=jobs.c.enqueued_at))
    wait_until(lambda: started == [1, 2], timeout=10, what="the second run")
    # Claimed again, the job's first run is told its lease was lost (as a renewal would have found).
    lost = f"lost the lease on job {job.id} (it expired and was taken over); stopping it here"
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("lost the lease")] == [lost]
    worker = running.worker
    (current,) = worker.keeper.held.values()
    first_may_end.set()
    wait_until(lambda: worker.stats.lost == 1, timeout=10, what="the first run's outcome refused")
    # The stale run's end takes neither the new lease out of the renewals nor the new run out of the running
    # jobs (where a cancellation or a lost lease finds it).
    assert worker.keeper.holds(current)
    assert worker.runners.running[job.id].lease is current
    second_may_end.set()
    wait_until(lambda: app.get(job.id).status == "succeeded", timeout=10, what="the second run's success")
