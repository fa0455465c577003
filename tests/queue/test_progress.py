"""Job progress: a task reports it from its context as often as it likes, the worker writes the latest report
once a second fenced by the lease, and `app.get` and `dibs jobs show` show it; bad reports are refused."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import LATEST, MIGRATIONS, current_version
from dibs.schema.script import migration_sql
from tests.acceptance.cli import dibs as run_dibs
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows

REPORTS = 20_000


def _count_progress_writes(engine: sa.Engine) -> list[str]:
    """Every statement that writes progress on ``engine`` from now on (an executemany counts once)."""
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "SET progress" in statement:
            seen.append(statement)

    return seen


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reports_in_a_tight_loop_are_written_about_once_a_second_and_read_back(qdb: QueueDatabase, kind: str) -> None:
    app = qdb.app()
    release = threading.Event()

    if kind == "sync":

        @app.task(name="tests.crunch")
        def crunch(context: dibs.JobContext) -> None:
            for done in range(1, REPORTS + 1):
                context.progress(done / REPORTS, f"{done} of {REPORTS} rows")
            release.wait(30)

    else:

        @app.task(name="tests.crunch")
        async def crunch(context: dibs.JobContext) -> None:
            for done in range(1, REPORTS + 1):
                context.progress(done / REPORTS, f"{done} of {REPORTS} rows")
            while not release.is_set():
                await asyncio.sleep(0.02)

    writes = _count_progress_writes(app.engine)
    job = app.enqueue(crunch, {})
    assert app.get(job.id).progress is None
    qdb.start(app)
    finished = wait_until(
        lambda: (lambda got: got if got.progress == 1.0 else None)(app.get(job.id)),
        timeout=30,
        what="the last report to be written",
    )
    assert (finished.status, finished.progress_message) == ("running", f"{REPORTS} of {REPORTS} rows")
    assert 1 <= len(writes) <= 5  # 20,000 reports, a statement a second at most
    release.set()
    wait_until(lambda: app.get(job.id).status == "succeeded", timeout=30, what="the job to end")


def test_a_report_is_written_only_under_the_lease_the_job_runs_with(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="tests.work")
    def work() -> None: ...

    job = app.enqueue(work, {})
    where = {"queues": ["default"], "tasks": ["tests.work"], "tags": []}
    (lease,) = app.store.claim(app.engine, owner="w", lease_seconds=30, limit=1, **where)
    stale = lease._replace(token=lease.token - 1)
    app.store.write_progress(app.engine, [(stale, 0.9, "stale")])
    assert app.get(job.id).progress is None
    app.store.write_progress(app.engine, [(lease, 0.25, "a quarter")])
    got = app.get(job.id)
    assert (got.progress, got.progress_message) == (0.25, "a quarter")
    assert not app.store.succeed(app.engine, [lease])
    app.store.write_progress(app.engine, [(lease, 0.5, "after the end")])  # a report that came too late
    got = app.get(job.id)
    assert (got.status, got.progress, got.progress_message) == ("succeeded", 0.25, "a quarter")


@pytest.mark.parametrize(
    ("fraction", "message", "problem"),
    [
        (1.5, None, "a job's progress must be a number from 0.0 to at most 1.0"),
        (-0.1, None, "a job's progress must be a number"),
        (float("nan"), None, "a job's progress must be a number"),
        (True, None, "a job's progress must be a number"),
        ("half", None, "a job's progress must be a number"),
        (0.5, "x" * 201, "a progress message must be a string of 1 to 200 characters"),
        (0.5, "", "a progress message must be a string of 1 to 200 characters"),
        (0.5, 42, "a progress message must be a string"),
    ],
)
def test_a_bad_report_is_refused_and_replaces_nothing(fraction: Any, message: Any, problem: str) -> None:
    context = dibs.JobContext(1, "tests.work", 1, {})
    context.progress(0.5, "half way")
    with pytest.raises(dibs.InvalidArgument, match=problem):
        context.progress(fraction, message)
    assert context.reported == (0.5, "half way")


def test_dibs_jobs_show_prints_the_progress(qdb: QueueDatabase, tmp_path: Path) -> None:
    app = qdb.app()

    @app.task(name="tests.work")
    def work() -> None: ...

    job = app.enqueue(work, {})
    (lease,) = app.store.claim(
        app.engine, owner="w", lease_seconds=30, limit=1, queues=["default"], tasks=["tests.work"], tags=[]
    )
    app.store.write_progress(app.engine, [(lease, 0.42, "3 of 7 files")])
    shown = run_dibs(qdb.url.render_as_string(hide_password=False), tmp_path, "jobs", "show", str(job.id))
    assert shown.returncode == 0, shown.stderr
    lines = [re.split(r"\s{2,}", line.strip()) for line in shown.stdout.splitlines() if line.startswith("  progress")]
    assert lines == [["progress", "42%"], ["progress message", "3 of 7 files"]]


def test_a_version_8_jobs_table_gains_the_progress_columns(empty_db: QueueDatabase) -> None:
    """A job enqueued before progress existed stays, and reports once upgraded."""
    engine = empty_db.engine
    dibs.migrate(engine, MIGRATIONS[:8])
    with engine.begin() as conn:
        for name in ("progress", "progress_message"):
            conn.execute(sa.text(f"ALTER TABLE dibs_jobs DROP COLUMN {name}"))
        conn.execute(
            sa.text(
                "INSERT INTO dibs_jobs (task, queue, args, priority, status, run_at, attempts, max_attempts, "
                "lease_token, cancel_requested, enqueued_at, has_children) VALUES ('tests.work', 'default', '{}', "
                "0, 'queued', :now, 0, 3, 0, false, :now, false)"
            ),
            {"now": datetime.now(timezone.utc).replace(tzinfo=None)},
        )
    assert [step.version for step in dibs.migrate(engine)] == list(range(9, LATEST + 1))
    assert current_version(engine) == LATEST
    app = empty_db.app()

    @app.task(name="tests.work")
    def work(context: dibs.JobContext) -> None:
        context.progress(1.0, "done")

    (old,) = [row.id for row in job_rows(engine)]
    assert (app.get(old).progress, app.get(old).progress_message) == (None, None)
    empty_db.drain(app)
    assert app.get(old).status == "succeeded"


def test_the_sql_for_an_older_database_adds_the_progress_columns() -> None:
    script = migration_sql("postgresql", start=8)
    assert "ALTER TABLE dibs_jobs ADD COLUMN progress DOUBLE PRECISION" in script
    assert "ALTER TABLE dibs_jobs ADD COLUMN progress_message VARCHAR(200)" in script
