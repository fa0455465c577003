"""dibs's pytest plugin: an app on a throwaway database, jobs run in the test's process, assertions on jobs.

Installed with dibs and registered through the ``pytest11`` entry point, so its fixtures are there in every
project that has dibs and pytest::

    def test_signup_sends_a_welcome_email(dibs_app):
        send_welcome.enqueue({"user_id": 7})
        dibs.testing.assert_enqueued(dibs_app, send_welcome, user_id=7)
        [job] = dibs.testing.drain(dibs_app)
        assert job.status == "succeeded"

The database is an SQLite file in the test's temporary directory, unless ``--dibs-db URL`` or
``$DIBS_TEST_DATABASE_URL`` names another (its dibs tables are then emptied before each test). The
``dibs_app`` ini option (``dibs_app = myproject.tasks:app``) makes the ``dibs_app`` fixture the project's own
App, pointed at that database for the test.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dibs.queue.app import App
from dibs.queue.job import Job
from dibs.queue.task import Task
from dibs.schema import FINISHED, jobs, metadata

#: The environment variable naming the database tests run on, when --dibs-db does not.
ENV = "DIBS_TEST_DATABASE_URL"

__all__ = ["ENV", "assert_enqueued", "drain", "eager", "enqueued"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dibs")
    group.addoption(
        "--dibs-db",
        default=None,
        metavar="URL",
        help=f"Database URL the dibs fixtures use [env: {ENV}; default: an SQLite file per test].",
    )
    parser.addini("dibs_app", "The App the dibs_app fixture gives, as module:attribute (default: a bare App).")


@pytest.fixture
def dibs_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of the test's dibs database: --dibs-db, else $DIBS_TEST_DATABASE_URL, else a fresh SQLite file."""
    chosen: str | None = request.config.getoption("--dibs-db") or os.environ.get(ENV)
    return chosen or f"sqlite:///{tmp_path / 'dibs.sqlite'}"


@pytest.fixture
def dibs_app(request: pytest.FixtureRequest, dibs_url: str) -> Iterator[App]:
    """The project's App (the ``dibs_app`` ini option, as module:attribute) or a bare one, on the test's
    database, its tables created and empty; the App is given back its own database afterwards."""
    spec: str = request.config.getini("dibs_app")
    app = _imported(spec) if spec else App(dibs_url)
    with _pointed(app, dibs_url):
        app.init()
        _empty(app)
        yield app


def _imported(spec: str) -> App:
    module, _, attribute = spec.partition(":")
    found = getattr(importlib.import_module(module), attribute or "app")
    if not isinstance(found, App):
        raise pytest.UsageError(f"the dibs_app ini option names {spec!r}, which is not a dibs.App")
    return found


@contextmanager
def _pointed(app: App, url: str) -> Iterator[None]:
    """``app`` on the database at ``url`` for the block, with an engine of its own, disposed of after."""
    saved = app.url, app._engine, app._store
    app.url, app._engine, app._store = url, None, None
    try:
        yield
    finally:
        if app._engine is not None:
            app._engine.dispose()
        app.url, app._engine, app._store = saved


def _empty(app: App) -> None:
    with app.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name != "dibs_schema":
                conn.execute(table.delete())


def drain(app: App, **options: Any) -> list[Job]:
    """Run every job that can run now, and those they enqueue, in this process; return them as they ended.

    Args:
        app: The app whose jobs to run.
        **options: For the worker (:class:`dibs.Worker`), such as ``queues``; it stops once nothing is left.

    Returns:
        The jobs that ran or were waiting to, by id, in their state afterwards (a job whose retry is
        scheduled later is ``scheduled``).

    Example:
        >>> statuses = {job.id: job.status for job in drain(app)}
        >>> statuses[job.id]
        'succeeded'
    """
    with app.engine.connect() as conn:
        waiting = set(conn.scalars(sa.select(jobs.c.id).where(jobs.c.status.not_in(FINISHED))))
        newest = conn.scalar(sa.select(sa.func.coalesce(sa.func.max(jobs.c.id), 0)))
    app.worker(burst=True, handle_signals=False, poll=0.05, **options).run()
    with app.engine.connect() as conn:
        query = sa.select(jobs.c.id).where(sa.or_(jobs.c.id.in_(waiting), jobs.c.id > newest)).order_by(jobs.c.id)
        return [app.get(job_id) for job_id in conn.scalars(query)]


def enqueued(app: App, task: Task | str | None = None) -> list[Job]:
    """The jobs waiting to run (queued, scheduled, or waiting for other jobs), oldest first, of ``task`` or
    of every task."""
    name = None if task is None else app.task_named(task).name
    statuses = ("queued", "scheduled", "waiting")
    return sorted(app.jobs(status=statuses, limit=1_000_000, task=name), key=lambda job: job.id)


def assert_enqueued(app: App, task: Task | str, /, **args: Any) -> Job:
    """Assert that a job of ``task`` waits to run with these arguments (those named; others may differ).

    Returns:
        The oldest such job.

    Raises:
        AssertionError: No waiting job matches; the message lists those that wait.
    """
    waiting = enqueued(app, task)
    for job in waiting:
        if _matches(job.args, args):
            return job
    seen = "\n".join(f"  {job.id}: {job.args}" for job in waiting) or "  none"
    raise AssertionError(f"no job of {app.task_named(task).name} waits with {args}; waiting:\n{seen}")


def _matches(actual: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(key in actual and actual[key] == value for key, value in wanted.items())


@contextmanager
def eager(app: App, **options: Any) -> Iterator[list[Job]]:
    """Run each job as it is enqueued (``enqueue``, ``enqueue_many``, ``chain``, ``group``, and a task's
    own ``enqueue``), in this process, until the block ends; yield the jobs that ran.

    A job enqueued in the caller's transaction (``conn=``) cannot run before that commits: it waits for the
    next :func:`drain`, as it would for a worker. So does a job enqueued with ``aenqueue`` (or another
    asyncio call): running it would need a worker inside the caller's event loop.

    Args:
        app: The app whose enqueues run eagerly.
        **options: For the worker, as in :func:`drain`.

    Example:
        >>> with eager(app) as ran:
        ...     add.enqueue({"a": 1, "b": 2})
        >>> ran[0].status
        'succeeded'
    """
    ran: list[Job] = []
    depth = 0  # app.enqueue calls app.enqueue_many: only the outermost call runs the jobs

    def running(name: str) -> Any:
        enqueue = getattr(app, name)

        def enqueue_and_run(*args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            depth += 1
            try:
                made = enqueue(*args, **kwargs)
            finally:
                depth -= 1
            if depth or kwargs.get("conn") is not None:
                return made
            ran.extend(drain(app, **options))
            return app.get(made.id) if isinstance(made, Job) else [app.get(job.id) for job in made]

        return enqueue_and_run

    names = ("enqueue", "enqueue_many", "chain", "group")
    for name in names:
        setattr(app, name, running(name))
    try:
        yield ran
    finally:
        for name in names:
            delattr(app, name)
