"""Pausing a queue: no worker anywhere claims its jobs, running ones finish, and a resume is taken up at once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase, start_worker
from tests.queue.support import run_events, runs


@pytest.fixture
def spawn(qdb: QueueDatabase) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes (tests.queue.worker_process) on the test's database; all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    runs.create(qdb.engine)
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _statuses(app: dibs.App, ids: list[int]) -> list[str]:
    return [app.get(job_id).status for job_id in ids]


def test_paused_queues_are_listed_by_name_and_resuming_forgets_them(qdb: QueueDatabase) -> None:
    app = qdb.app()
    assert app.paused() == []
    app.pause("mail")
    app.pause("mail")  # pausing twice is the same as once
    app.pause("billing")
    assert app.paused() == ["billing", "mail"]
    app.resume("mail")
    app.resume("never-paused")
    assert app.paused() == ["billing"]
    with pytest.raises(dibs.InvalidArgument, match="a queue name"):
        app.pause("no spaces")


def test_a_worker_takes_no_job_of_a_paused_queue_and_the_others_go_on(qdb: QueueDatabase) -> None:
    app = qdb.app(queues=["billing"])
    done: list[str] = []

    @app.task(name="tests.note", queue="mail")
    def note(text: str) -> None:
        done.append(text)

    app.pause("mail")
    held = app.enqueue(note, {"text": "held"})
    other = app.enqueue(note, {"text": "other"}, queue="billing")
    stats = qdb.drain(app, queues=["mail", "billing"])  # a burst ends: a paused queue's jobs are not its work
    assert done == ["other"]
    assert stats.claimed == 1
    assert (app.get(held.id).status, app.get(other.id).status) == ("queued", "succeeded")
    app.resume("mail")
    qdb.drain(app, queues=["mail", "billing"])
    assert app.get(held.id).status == "succeeded"


def test_worker_processes_leave_a_paused_queue_alone_finish_running_jobs_and_resume_at_once(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    app = qdb.app()

    @app.task(name="tests.nap")
    def nap(seconds: float) -> None: ...

    for number in range(3):
        start_worker(qdb, spawn, tmp_path / f"worker{number}.log", "--concurrency", "2")
    wait_until(lambda: len(app.workers()) == 3, timeout=30, what="three workers to register")
    running = app.enqueue(nap, {"seconds": 1.0})
    wait_until(lambda: (running.id, "started") in run_events(qdb.engine), timeout=15, what="the long job to start")
    app.pause("default")
    held = [job.id for job in app.enqueue_many(nap, [{"seconds": 0.0}] * 6)]
    # The job that was running finishes; none of the ones enqueued while paused is taken, by any worker.
    wait_until(lambda: app.get(running.id).status == "succeeded", timeout=15, what="the running job to finish")
    time.sleep(0.5)  # many claim rounds of every worker
    assert _statuses(app, held) == ["queued"] * 6
    resumed = time.monotonic()
    app.resume("default")
    wait_until(lambda: _statuses(app, held) == ["succeeded"] * 6, timeout=10, what="the held jobs to run")
    assert time.monotonic() - resumed < 5
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 2 + 2 * 6
