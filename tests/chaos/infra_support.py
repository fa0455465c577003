"""What the infrastructure scenarios share: recording workers in processes of their own, a throwaway
PostgreSQL server as a fixture-friendly helper, and the end-of-run history check."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.chaos.history import Report, check_jobs, load, read_jobs
from tests.chaos.servers import ServerUnavailable, ThrowawayMariaDB, ThrowawayPostgres
from tests.helpers import wait_until
from tests.helpers.processes import ScriptProcess
from tests.helpers.targets import IN_CI


class WorkerProcess(ScriptProcess):
    """A recording worker (tests.chaos.infra_worker) in an OS process of its own; its output in a log file."""

    kind = "worker"

    def __init__(self, directory: Path, history: Path, name: str, db_url: sa.URL, *options: str) -> None:
        url = db_url.render_as_string(hide_password=False)
        module = "tests.chaos.infra_worker"
        super().__init__(directory, name, module, url, "--history", str(history), "--actor", name, *options)


def wait_ready(workers: Sequence[WorkerProcess], timeout: float = 60.0) -> None:
    for worker in workers:
        wait_until(
            lambda worker=worker: worker.ready.exists() or not worker.alive(),
            timeout=timeout,
            what=f"worker {worker.name} to start",
        )
        assert worker.alive(), f"worker {worker.name} died while starting:\n{worker.output()}"


def stop_all(workers: Sequence[WorkerProcess], timeout: float = 30.0) -> None:
    """SIGTERM every worker (all must still be running: none gave up on a fault) and see each exit cleanly."""
    for worker in workers:
        assert worker.alive(), f"worker {worker.name} died during the run:\n{worker.output()[-4000:]}"
    for worker in workers:
        worker.terminate()
    for worker in workers:
        assert worker.wait(timeout) == 0, f"worker {worker.name} did not stop cleanly:\n{worker.output()[-4000:]}"


def checked_history(history: Path, engine: Engine, committed: Sequence[int]) -> Report:
    """Run the history checker over a finished run; fails with every problem found."""
    report = check_jobs(load(history), read_jobs(engine), committed=committed)
    report.assert_ok()
    assert report.executions >= len(committed), report.summary
    return report


def start_throwaway(request: pytest.FixtureRequest, family: str) -> ThrowawayPostgres | ThrowawayMariaDB:
    """A throwaway server of this family, destroyed when the test ends (a finalizer: also on failure). A
    machine where none can be started skips the test, and fails it in CI, saying why."""
    kind = ThrowawayPostgres if family == "postgresql" else ThrowawayMariaDB
    try:
        server = kind()
    except ServerUnavailable as error:
        _unavailable(family, str(error))
        raise
    request.addfinalizer(server.destroy)
    try:
        server.start()
    except ServerUnavailable as error:
        _unavailable(family, str(error))
        raise
    return server


def _unavailable(family: str, why: str) -> None:
    message = f"cannot start a throwaway {family} server on this machine: {why}"
    if IN_CI:
        pytest.fail(f"CI needs the database-restart scenario: {message}", pytrace=False)
    pytest.skip(message)


def wait_while_running(workers: Sequence[WorkerProcess], condition: Any, timeout: float, what: str) -> None:
    """Poll ``condition()`` until it holds; fails at once if a worker died, and after ``timeout`` with the
    tail of every worker's log (a real hang says where each worker was)."""
    try:
        wait_until(lambda: condition() or not all(worker.alive() for worker in workers), timeout=timeout, what=what)
    except AssertionError as error:
        tails = "\n".join(f"--- {worker.name}:\n{worker.output()[-2500:]}" for worker in workers)
        raise AssertionError(f"{error}\n{tails}") from None
    for worker in workers:
        assert worker.alive(), f"worker {worker.name} died while waiting for {what}:\n{worker.output()[-4000:]}"
