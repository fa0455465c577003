"""Listing, pausing and resuming periodic schedules from the command line, on every backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dibs
from tests.acceptance.cli import dibs as run


def _record_schedule(database: str) -> None:
    """Record an hourly schedule, as a worker of an app that has it does as it starts."""
    app = dibs.App(database)

    @app.periodic(every=timedelta(hours=1), name="hourly-report")
    @app.task(name="report")
    def report() -> None: ...

    try:
        app.sync_periodic()
    finally:
        app.engine.dispose()


def _paused_cell(listed: str) -> str:
    (line,) = [line for line in listed.splitlines() if "hourly-report" in line]
    return [cell.strip() for cell in line.replace("┃", "│").split("│")[1:-1]][-1]


def test_a_schedule_is_paused_listed_as_paused_and_resumed(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    empty = run(database, tmp_path, "periodic", "list")
    assert (empty.returncode, "no periodic jobs recorded yet" in empty.stdout) == (0, True), empty.stderr
    _record_schedule(database)
    assert _paused_cell(run(database, tmp_path, "periodic", "list").stdout) == "no"
    paused = run(database, tmp_path, "periodic", "pause", "hourly-report")
    assert (paused.returncode, paused.stdout.strip()) == (0, "periodic job hourly-report: paused"), paused.stderr
    assert _paused_cell(run(database, tmp_path, "periodic", "list").stdout) == "yes"
    assert _paused_cell(run(database, tmp_path, "status").stdout) == "yes"
    resumed = run(database, tmp_path, "periodic", "resume", "hourly-report")
    assert (resumed.returncode, resumed.stdout.strip()) == (0, "periodic job hourly-report: resumed"), resumed.stderr
    assert _paused_cell(run(database, tmp_path, "periodic", "list").stdout) == "no"


def test_pausing_a_schedule_nobody_recorded_says_where_to_look(database: str, tmp_path: Path) -> None:
    assert run(database, tmp_path, "init").returncode == 0
    refused = run(database, tmp_path, "periodic", "pause", "nightly")
    assert refused.returncode == 1
    assert "no periodic job named 'nightly' is recorded" in refused.stderr
    assert "dibs periodic list" in refused.stderr
