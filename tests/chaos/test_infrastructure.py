"""Infrastructure faults under running workers, each run ended by the history checker: the database server
restarted under worker processes, a connection pool exhausted by other code, a snapshot held open for the
whole run (vacuum held back), and SQLite busy storms (another program's writer) with a long reader. Every
job reaches a final state, nothing is lost, and every duplicate execution is explained by an expired lease."""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from dibs.lease import Lease
from dibs.schema import jobs
from tests.chaos.faults import (
    HeldConnections,
    HeldSnapshot,
    LongSQLiteReader,
    SQLiteWriteHog,
    history_list_length,
    vacuum,
)
from tests.chaos.history import Recorder, load, read_jobs
from tests.chaos.infra_support import (
    WorkerProcess,
    checked_history,
    start_throwaway,
    stop_all,
    wait_ready,
    wait_while_running,
)
from tests.chaos.recording import KEYED, WORK, count_completions, enqueue, recording_app, terminal_count, workload
from tests.chaos.servers import ThrowawayMariaDB, ThrowawayPostgres
from tests.helpers import BACKENDS, wait_until
from tests.helpers.targets import SYNC_DRIVERS, database_url
from tests.queue.support import WorkerThread, drop_everything


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes the test started; any still running at the end is killed."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()


def fresh_database(request: pytest.FixtureRequest, family: str, tmp_path: Path) -> sa.URL:
    """The session's database on a server (or an SQLite file), with a fresh dibs schema, emptied again after."""
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "chaos.sqlite")
    drop_everything(url)
    request.addfinalizer(lambda: drop_everything(url))
    engine = dibs.create_engine(url)
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()
    return url


def enqueuer(engine: Engine, tmp_path: Path) -> dibs.App:
    """An app of the test process with the scenarios' tasks, to enqueue with (it runs nothing itself)."""
    return recording_app(engine, Recorder(tmp_path / "enqueuer", "enqueuer"), notify=False)


# -- 1. the database server restarted under the workers ---------------------------------------------------


@pytest.fixture(params=["postgresql", "mariadb"])
def throwaway_server(request: pytest.FixtureRequest) -> ThrowawayPostgres | ThrowawayMariaDB:
    """A database server of the test's own (SQLite has none to restart)."""
    return start_throwaway(request, request.param)


def test_workers_ride_out_database_restarts(
    throwaway_server: ThrowawayPostgres | ThrowawayMariaDB, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    server = throwaway_server
    url = server.url
    engine = dibs.create_engine(url)
    try:
        dibs.migrate(engine)
        history = tmp_path / "history"
        app = enqueuer(engine, tmp_path)
        ids = enqueue(app, workload(plain=450, keyed=150, accounts=10, seconds=0.02))
        for n in range(3):
            workers.append(
                WorkerProcess(tmp_path, history, f"w{n}", url, "--concurrency", "4", "--batch", "8", "--lease", "2")
            )
        wait_ready(workers)
        test = Recorder(history, "test")
        # Restart as the work goes: fast (sessions told to end), immediate (crash recovery), then an outage
        # long enough that claims and heartbeats fail over and over.
        restarts: list[float] = []
        for share, fault in ((0.15, "fast"), (0.4, "immediate"), (0.65, "outage")):
            wait_while_running(
                workers,
                lambda share=share: count_completions(history) >= share * len(ids),
                timeout=60,
                what=f"{share:.0%} of the jobs to complete before the {fault} restart",
            )
            test.fault(f"restart-{fault}", "server")
            if fault == "outage":
                server.outage(3.5)
            else:
                server.restart(fault)
            restarts.append(time.time())
        engine.dispose()
        wait_while_running(
            workers, lambda: terminal_count(engine) == len(ids), timeout=90, what="every job to reach a final state"
        )
        stop_all(workers)
    finally:
        engine.dispose()
    test.close()

    report = checked_history(history, engine, ids)
    assert server.restarts == 3
    # The faults hit: every worker saw the database go away and carried on after the last restart.
    for worker in workers:
        output = worker.output()
        assert re.search(r"claim failed|heartbeat failed|upkeep failed|recording \d+ successes failed", output), (
            f"worker {worker.name} never noticed the restarts:\n{output[-3000:]}"
        )
    events = load(history)
    after = {event.actor for event in events if event.kind == "completed" and event.at > restarts[-1]}
    assert after & {worker.name for worker in workers}, "no worker completed a job after the last restart"
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)).all())
    assert statuses == {"succeeded": len(ids)}, report.summary
    engine.dispose()


def test_a_worker_stopped_while_its_database_is_down_still_stops_gracefully(
    request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Giving back the jobs of a claim that returned as the worker stopped fails, but the worker goes on
    stopping: its running job gets its grace, and run() returns its stats (it used to raise the database's
    error and skip the grace)."""
    caplog.set_level(logging.WARNING, logger="dibs.worker")
    server = start_throwaway(request, "postgresql")
    engine = dibs.create_engine(server.url)
    history = tmp_path / "history"
    recorder = Recorder(history, "stopping")
    try:
        dibs.migrate(engine)
        app = recording_app(engine, recorder)
        enqueue(app, workload(plain=6, keyed=0, accounts=1, seconds=1.0))
        # One job a claim: the first starts, and the second claim returns once it runs, as the worker stops.
        worker = quick_worker(app, "stopping", concurrency=2, batch=1, lease=10.0, grace=10.0)
        claim = app.store.claim
        claims = 0

        def stopping_claim(*args: object, **options: object) -> list[Lease]:
            nonlocal claims
            claims += 1
            claimed = claim(*args, **options)  # type: ignore[arg-type]
            if claims == 2:
                wait_until(lambda: any(event.kind == "started" for event in load(history)), what="a job to start")
                server.stop("fast")
                worker.stop()
            return claimed

        app.store.claim = stopping_claim  # type: ignore[method-assign]
        running = WorkerThread(worker).start()
        stats = running.join(30)
    finally:
        recorder.close()
        engine.dispose()
    assert stats.claimed >= 1, stats
    assert any("could not give back" in record.getMessage() for record in caplog.records)
    events = load(history)
    started = [event.subject for event in events if event.kind == "started"]
    finished = [event.subject for event in events if event.kind == "finished" and event.get("outcome") == "returned"]
    assert started, "no job started"
    assert sorted(finished) == sorted(started), "the running job did not get its grace"


# -- 3. a connection pool exhausted by other code of the same engine --------------------------------------


def pool_engine(url: sa.URL) -> Engine:
    """An engine with one connection, no overflow, and a short wait for it."""
    return dibs.create_engine(url, pool_size=1, max_overflow=0, pool_timeout=0.2)


def quick_worker(app: dibs.App, name: str, **options: object) -> dibs.Worker:
    settings: dict[str, object] = {
        "concurrency": 4,
        "batch": 8,
        "lease": 4.0,
        "poll": 0.05,
        "upkeep_every": 0.1,
        "grace": 5.0,
        "handle_signals": False,
        "name": name,
        **options,
    }
    return dibs.Worker(app, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", BACKENDS)
def test_a_worker_rides_out_its_pool_held_by_other_code(
    request: pytest.FixtureRequest, family: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dibs.worker")
    url = fresh_database(request, family, tmp_path)
    engine = pool_engine(url)
    reader = dibs.create_engine(url)
    history = tmp_path / "history"
    recorder = Recorder(history, "pooled")
    # LISTEN would keep the one connection for good on PostgreSQL (see the test below): the worker polls.
    app = recording_app(engine, recorder, notify=False)
    ids = enqueue(app, workload(plain=150, keyed=50, accounts=5, seconds=0.01))
    running = WorkerThread(quick_worker(app, "pooled")).start()
    holds: list[tuple[float, float]] = []
    try:
        for round_ in range(3):
            # Let it work a little between holds, so that each hold lands mid-run.
            wait_until(
                lambda round_=round_: count_completions(history) >= (round_ + 1) * 25 or not running.thread.is_alive(),
                timeout=60,
                what="the worker to complete some jobs",
            )
            held = HeldConnections(engine, 1).take()
            taken = time.time()
            time.sleep(1.2)
            holds.append((taken, time.time()))
            held.give_back()
            assert running.thread.is_alive(), f"the worker gave up while its pool was held: {running.error!r}"
        wait_until(lambda: terminal_count(reader) == len(ids), timeout=60, what="every job to reach a final state")
        assert running.thread.is_alive(), f"the worker gave up: {running.error!r}"
    finally:
        running.stop()
        recorder.close()
    assert running.error is None, running.error
    assert running.stats is not None

    report = checked_history(history, reader, ids)
    assert report.duplicates == 0, report.summary
    assert running.stats.succeeded == len(ids), running.stats
    # The pool really ran dry: the worker's calls timed out (and were tried again), and while the other
    # code held the connection no outcome could be written (past a margin: a write that returned just
    # before the hold is recorded a moment later).
    timeouts = [record for record in caplog.records if "QueuePool limit" in record.getMessage()]
    assert timeouts, "the worker never waited for a connection"
    completed = [event.at for event in load(history) if event.kind == "completed" and event.get("changed")]
    for taken, given_back in holds:
        during = [moment for moment in completed if taken + 0.5 < moment < given_back - 0.05]
        assert not during, f"{len(during)} completions were written while the pool's one connection was held"
    reader.dispose()
    engine.dispose()


def test_a_listening_worker_on_a_one_connection_pool_still_works(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = fresh_database(request, "postgresql", tmp_path)
    engine = pool_engine(url)
    recorder = Recorder(tmp_path / "history", "listening")
    app = recording_app(engine, recorder, notify=True)
    ids = enqueue(app, workload(plain=20, keyed=0, accounts=1, seconds=0))
    try:
        stats = WorkerThread(quick_worker(app, "listening", burst=True)).start().join(5)
        assert stats.succeeded == len(ids)
    finally:
        recorder.close()
        engine.dispose()


# -- 4. a snapshot held open for the whole run: vacuum held back -------------------------------------------


def claim_concurrently(app: dibs.App, engine: Engine, threads: int, limit: int) -> list[list[Lease]]:
    """Claim in ``threads`` threads at once, each until three claims in a row come back empty."""
    calls: list[list[Lease]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        empty = 0
        try:
            while empty < 3:
                got = app.store.claim(
                    engine,
                    owner=f"claimer-{n}",
                    lease_seconds=300,
                    limit=limit,
                    queues=["default"],
                    tasks=[WORK, KEYED],
                    tags=[],
                )
                with lock:
                    calls.append(got)
                empty = 0 if got else empty + 1
        except BaseException as error:
            errors.append(error)

    started = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(60)
    assert not any(thread.is_alive() for thread in started), "a claimer hung"
    assert not errors, errors
    return calls


@pytest.mark.parametrize("family", ["postgresql", "mariadb"])
def test_the_queue_flows_while_a_long_snapshot_holds_back_cleanup(
    request: pytest.FixtureRequest, family: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """SQLite's counterpart (a long reader that keeps the WAL from its checkpoint) is the busy-storm test."""
    url = fresh_database(request, family, tmp_path)
    engine = dibs.create_engine(url)
    history = tmp_path / "history"
    app = enqueuer(engine, tmp_path)
    seen = enqueue(app, workload(plain=10, keyed=0, accounts=1, seconds=0))
    snapshot = HeldSnapshot(url)
    try:
        assert snapshot.jobs_seen == len(seen)
        # Thousands of jobs (fewer on MariaDB, whose three-statement claim is slower on this machine).
        plain, keyed = (2400, 600) if family == "postgresql" else (1200, 300)
        ids = seen + enqueue(app, workload(plain=plain, keyed=keyed, accounts=20, seconds=0))
        for n in range(2):
            workers.append(
                WorkerProcess(tmp_path, history, f"w{n}", url, "--concurrency", "8", "--batch", "50", "--lease", "10")
            )
        wait_while_running(
            workers, lambda: terminal_count(engine) == len(ids), timeout=90, what="every job to reach a final state"
        )
        stop_all(workers)

        # The snapshot was held the whole time, and held cleanup back.
        assert snapshot.still_held()
        if family == "postgresql":
            # The dead versions of every job's claim and completion are still there: VACUUM may not remove them.
            report = vacuum(engine)
            kept = re.search(r"(\d+) are dead but not yet removable", report)
            assert kept is not None, report
            assert int(kept.group(1)) >= len(ids), report
        else:
            # Purge may not pass the snapshot: the undo of every claim and completion since is kept.
            # (Counted whole: older undo of other sessions may be purged meanwhile, never ours.)
            kept_undo = history_list_length(engine)
            assert kept_undo >= 2 * len(ids) // 50, f"the history list holds {kept_undo} undo logs only"

        # Claims under the same conditions: at most the limit each, nothing twice, everything once.
        more = enqueue(app, workload(plain=700, keyed=0, accounts=1, seconds=0))
        calls = claim_concurrently(app, engine, threads=4, limit=7)
        assert snapshot.still_held()
    finally:
        snapshot.close()
    assert max(len(call) for call in calls) <= 7
    claimed = [int(lease.key[0]) for call in calls for lease in call]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert sorted(claimed) == sorted(more)

    checked_history(history, engine, ids)
    engine.dispose()


# -- 5. SQLite: busy storms of eight worker processes and another program's writer, and a reader that keeps --
# -- the WAL from its checkpoint ---------------------------------------------------------------------------


def test_sqlite_busy_storms_with_a_long_reader_run_every_job_exactly_once(
    request: pytest.FixtureRequest, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    url = fresh_database(request, "sqlite", tmp_path)
    path = Path(str(url.database))
    engine = dibs.create_engine(url)
    history = tmp_path / "history"
    app = enqueuer(engine, tmp_path)
    ids = enqueue(app, workload(plain=1400, keyed=200, accounts=8, seconds=0))
    reader = LongSQLiteReader(path)
    # Another program's writer holds the write lock 50 ms at a time. The workers take turns among themselves,
    # but with a busy timeout of 20 ms they meet dibs.Busy behind it over and over (on SQLite's lock, or
    # waiting for a turn held by a worker that waits on it) and must back off.
    hog = SQLiteWriteHog(path, hold=0.05, gap=0.03)
    try:
        for n in range(8):
            workers.append(
                WorkerProcess(
                    tmp_path,
                    history,
                    f"w{n}",
                    url,
                    "--concurrency",
                    "2",
                    "--batch",
                    "4",
                    "--lease",
                    "15",
                    "--sqlite-timeout",
                    "0.02",
                )
            )
        wait_while_running(
            workers,
            lambda: terminal_count(engine) >= 0.8 * len(ids),
            timeout=90,
            what="most jobs to reach a final state",
        )
        # Held all this time: no checkpoint could get past the reader's snapshot.
        assert reader.still_held()
        with sqlite3.connect(path) as other:
            busy, frames, checkpointed = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert frames > checkpointed, (busy, frames, checkpointed)
    finally:
        reader.close()
        hog.close()
    wait_while_running(
        workers, lambda: terminal_count(engine) == len(ids), timeout=90, what="every job to reach a final state"
    )
    stop_all(workers)

    assert hog.held > 10
    report = checked_history(history, engine, ids)
    assert report.duplicates == 0, f"a job ran twice: {report.summary}"
    assert report.executions == len(ids), report.summary
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)).all())
    assert statuses == {"succeeded": len(ids)}
    busy_lines = sum(
        len(re.findall(r"locked by another writer|database is locked|kept its turn", worker.output()))
        for worker in workers
    )
    assert busy_lines > 0, "no worker ever found the database busy: the storm did not happen"
    engine.dispose()


# -- after an outage: one write of successes holding a job's stale lease and its newer one -----------------


@pytest.mark.parametrize("family", BACKENDS)
def test_successes_written_with_a_stale_and_a_newer_lease_of_one_job_are_counted_once(
    request: pytest.FixtureRequest, family: str, tmp_path: Path
) -> None:
    """A worker whose success write failed through an outage keeps it for the next flush; if meanwhile the
    lease expired and the same worker claimed the job again, one flush holds both leases. The newer one is
    recorded, the stale one is lost, and the metrics count the success (they once matched by key alone)."""
    from dibs.metrics import Metrics

    url = fresh_database(request, family, tmp_path)
    engine = dibs.create_engine(url)
    app = enqueuer(engine, tmp_path)
    (job_id,) = enqueue(app, workload(plain=1, keyed=0, accounts=1, seconds=0))
    where = {"queues": ["default"], "tasks": [WORK, KEYED], "tags": []}
    (stale,) = app.store.claim(engine, owner="w", lease_seconds=0.2, limit=1, **where)
    worker = quick_worker(app, "flusher")
    metrics = worker.writes.metrics = Metrics()

    try:
        time.sleep(0.6)
        assert app.store.recover_expired(engine) == (1, 0)
        (newer,) = app.store.claim(engine, owner="w", lease_seconds=30, limit=1, **where)
        assert (stale.key, newer.key, newer.token) == ((job_id,), (job_id,), stale.token + 1)
        asyncio.run(worker.writes.write_successes([stale, newer]))
        (row,) = read_jobs(engine)
    finally:
        worker.threads.shutdown(wait=True)
        worker.runners.shutdown()
        engine.dispose()
    assert (worker.stats.succeeded, worker.stats.lost) == (1, 1)
    assert metrics.registry.get_sample_value("dibs_jobs_finished_total", {"task": WORK, "outcome": "succeeded"}) == 1
    assert (row["status"], row["lease_token"]) == ("succeeded", newer.token)
